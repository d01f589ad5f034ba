"""`scheduler workers quiet|stop WORKER_ID... | --all`: ask running workers to stop, as
Sidekiq's Quiet and Stop do. admin/worker_stop.py writes the request; the worker's next beat
reads it (worker/remote_stop.py). Every id is checked live first: an unknown one writes
nothing for any (exit 1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from scheduler.admin.inspection import live_workers, physical_queues
from scheduler.admin.worker_stop import (
    ASKED,
    DEFAULT_STOP_TTL_MS,
    OLDER,
    PENDING,
    WorkerNotFound,
    ask_stop,
    check_stop,
)
from scheduler.cli.common import (
    AdminCommand,
    BadInput,
    Duration,
    Refused,
    connect,
    emit_json,
    json_option,
    queues_option,
    resolve_queues,
    url_option,
)
from scheduler.cli.confirm import confirm
from scheduler.core.claim_reply import check_worker_id
from scheduler.core.connection import UNREACHABLE
from scheduler.core.keys import QueueKeys
from scheduler.core.safety import safe

# What each outcome prints (admin/worker_stop.py's words; "gone": it stopped meanwhile).
_SAID = {
    "quiet": "quiet requested for worker {id} on queue {queue}: it claims no more jobs at its "
    "next beat and stops once the jobs it holds end",
    "stop": "stop requested for worker {id} on queue {queue}: at its next beat it stops as "
    "on SIGTERM (its --grace for the running jobs, then those left are released)",
    PENDING: "a stop asked of worker {id} on queue {queue} earlier is not read yet: kept",
    "already": "worker {id} on queue {queue} is stopping already: nothing asked",
    "gone": "worker {id} on queue {queue} stopped meanwhile: nothing asked",
    OLDER: "worker {id} on queue {queue} runs an older version, which reads no stop request "
    "(before 828eb42): nothing asked; stop it with SIGTERM (`scheduler workers` lists its host "
    "and pid)",
}


def _stop_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in (
        json_option,
        click.option(
            "--ttl",
            "ttl_ms",
            type=Duration(),
            default=DEFAULT_STOP_TTL_MS,
            show_default="5m",
            help="The request expires after this (a worker that is gone never reads it).",
        ),
        click.option("--yes", "-y", is_flag=True, help="With --all: do not ask first."),
        click.option("--all", "all_", is_flag=True, help="Every live worker of the queues."),
        queues_option,
        url_option,
        click.argument("worker_ids", nargs=-1, metavar="[WORKER_ID]..."),
    ):
        f = option(f)
    return f


@click.command("quiet", cls=AdminCommand)
@_stop_options
def quiet_command(**kw: Any) -> None:
    """Ask workers to go quiet: claim no more jobs, finish every job they hold (however long),
    then exit 0; listed meanwhile. Read at each worker's next beat (every --heartbeat-ms, 5 s
    by default). A child of a `--processes` pool is not replaced: its slot is retired (the
    pool exits 0 once every slot is)."""
    _ask("quiet", **kw)


@click.command("stop", cls=AdminCommand)
@_stop_options
def stop_command(**kw: Any) -> None:
    """Ask workers to stop as SIGTERM does: claim no more jobs, give the running ones the
    worker's --grace, release those still running (they run again elsewhere), exit 0. Read at
    each worker's next beat (every --heartbeat-ms, 5 s by default). A child of a
    `--processes` pool is not replaced: its slot is retired (the pool exits 0 once every slot
    is)."""
    _ask("stop", **kw)


def _ask(verb: str, *, url: str, queues: tuple[str, ...], worker_ids: tuple[str, ...],
         all_: bool, yes: bool, ttl_ms: int, as_json: bool) -> None:  # fmt: skip
    if all_ == bool(worker_ids):
        raise BadInput("give worker ids (as `scheduler workers` lists them) or --all, not both")
    check_stop(verb, ttl_ms)
    for wid in worker_ids:
        check_worker_id(wid)
    client = connect(url)
    live = _live(client, queues)  # (worker id, logical queue) -> the partitions it beats on
    if all_:
        chosen = list(live)
        if chosen and not yes:
            confirm(f"{verb.capitalize()} {len(chosen)} worker(s)?", action=f"{verb} them")
    else:
        known = {wid for wid, _ in live}
        missing = [wid for wid in dict.fromkeys(worker_ids) if wid not in known]
        if missing:
            where = f"queue {', '.join(queues)}" if queues else "any queue"
            raise Refused(safe(f"no live worker {', '.join(map(repr, missing))} on {where} "
                               "(`scheduler workers` lists them): nothing asked"))  # fmt: skip
        chosen = [key for key in live if key[0] in worker_ids]
    results = []
    for wid, logical in chosen:
        try:
            outcome = ask_stop(client, live[wid, logical], wid, verb, ttl_ms, queue=logical)
        except WorkerNotFound:
            outcome = "gone"
        results.append({"id": wid, "queue": logical, "outcome": outcome})
    if as_json:
        emit_json({"request": verb, "ttl_ms": ttl_ms, "workers": results})
    else:
        if not results:
            click.echo("no live workers: nothing asked")
        for r in results:
            said = _SAID[verb if r["outcome"] == ASKED else r["outcome"]]
            click.echo(safe(said.format(id=r["id"], queue=r["queue"])))
    if older := [r["id"] for r in results if r["outcome"] == OLDER]:
        raise Refused(safe(f"not asked (an older version: stop it by signal): {', '.join(older)}"))


def _live(client: Any, queues: tuple[str, ...]) -> dict[tuple[str, str], list[QueueKeys]]:
    """Every live worker of the queues (all when none is named), by (id, logical queue),
    with the partitions of that queue it is live on. A partition whose node does not answer
    is left out while another of the queue answers: its workers beat on those too, and read
    the request there (one partition down refused every stop of the queue, exit 3)."""
    out: dict[tuple[str, str], list[QueueKeys]] = {}
    for logical in resolve_queues(client, queues):
        names = physical_queues(client, [logical])
        failed: list[Exception] = []
        for name in names:
            keys = QueueKeys(name)
            try:
                found = live_workers(client, keys)[0]
            except UNREACHABLE as exc:
                failed.append(exc)
                continue
            for w in found:
                out.setdefault((w.id, logical), []).append(keys)
        if failed and len(failed) == len(names):
            raise failed[0]
    return out
