"""`scheduler dead list | requeue | purge | retention`: the dead-letter list, with filters
(`retention` lives in dead_retention.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from scheduler.admin.inspection import iter_chunks, server_now_ms
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    AdminGroup,
    Duration,
    F,
    Refused,
    connect,
    console,
    emit_json,
    json_option,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.cli.dead_retention import retention
from scheduler.cli.dead_view import exit_unread, id_option, page_jobs, print_dead, unread_field
from scheduler.cli.job_cancel import unanswered_change_nothing
from scheduler.cli.jobs import job_json
from scheduler.client.partitioned import PartitionedQueue, open_queue, requeue_order, unread
from scheduler.client.partitioned_ids import dead_where
from scheduler.client.partitioned_merge import merge_scored
from scheduler.client.queue import Queue
from scheduler.core.keys import QueueKeys
from scheduler.operations.dead_letters import dead_listing

_BATCH = 100  # ids per script call in bulk operations (one progress step each)
_SKIP, _PAGE = "Skip this many matching jobs first.", "Print at most this many jobs."


def register(main: click.Group) -> None:
    main.add_command(dead)


@click.group(cls=AdminGroup, epilog=EXIT_CODES_HELP)
def dead() -> None:
    """Jobs parked for a human: list them, requeue them with a fresh attempt budget, or purge
    them for good; `retention` shows or sets the opt-in limits (off by default). Filters
    combine (all must match); no filter selects every dead job."""


dead.add_command(retention)


def filter_options(f: F) -> F:
    for opt in reversed(
        [
            click.option("--task", help="Only jobs of this task."),
            click.option("--error-type", help="Only jobs whose last error has this type."),
            click.option(
                "--older-than",
                "older_than_ms",
                type=Duration(),
                help="Only jobs dead for longer than this: 30m, 2h, 7d.",
            ),
            id_option,
        ]
    ):
        f = opt(f)
    return f


def select(
    q: Queue | PartitionedQueue,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: Sequence[str],
    *,
    refuse: bool = True,
) -> list[str]:
    """Dead ids matching every filter; an --id that is not dead (or fails a filter) refuses
    (refuse=False: left out). With --id, only those ids are read (each in its partition)."""
    if not ids:
        return q.dead_ids(task=task, error_type=error_type, older_than_ms=older_than_ms)
    return list(select_at(q, task, error_type, older_than_ms, ids, refuse=refuse))


def select_at(
    q: Queue | PartitionedQueue,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: Sequence[str],
    *,
    refuse: bool = True,
) -> dict[str, int]:
    """select's --id: each matching id -> its partition (partitioned_ids.dead_where)."""
    where = dead_where(q, ids, task=task, error_type=error_type, older_than_ms=older_than_ms)
    missing = [i for i in ids if i not in where]
    if missing and refuse:
        raise Refused(f"not on the dead list of {q.name!r} (or filtered out): {', '.join(missing)}")
    return where


def _listing(
    q: Queue | PartitionedQueue,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    want: int,
    not_read: list[str],
) -> tuple[list[tuple[int, str]], int | None]:
    """The newest `want` matches as (partition, id) (each partition's first `want`, merged,
    one driver call a node; one whose node does not answer is named into `not_read`) and the
    total when it is known without a scan."""
    args: dict[str, Any] = {"task": task, "error_type": error_type, "older_than_ms": older_than_ms}
    if isinstance(q, PartitionedQueue):
        each = q.run_answering(lambda p: dead_listing(p.keys, limit=want, **args))
        not_read += unread(q.parts, each)
        per = [([], 0) if isinstance(r, BaseException) else r for r in each]
    else:
        per = [q._run(dead_listing(q.keys, limit=want, **args))]
    chosen = merge_scored("dead", [found for found, _ in per], 0, want)  # newest first
    totals = [n for _, n in per]
    return chosen, None if None in totals else sum(n for n in totals if n is not None)


@dead.command("list")
@url_option
@queue_option
@json_option
@filter_options
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help=_SKIP)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help=_PAGE)
def list_dead(
    url: str,
    queue: str,
    as_json: bool,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: tuple[str, ...],
    offset: int,
    limit: int,
) -> None:
    """Dead jobs, newest first: why each died and its last error. Reads the page it prints
    (with --task / --error-type, as far as the page's matches go: the total is then not
    counted, `more` says whether others follow). A partitioned queue's partition whose node
    does not answer is named (`not read: ...` on stderr, --json's `unreachable`) and the
    others' dead jobs listed, exit 3."""
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)  # a partitioned queue: merged, newest first
    total: int | None
    not_read: list[str] = []  # partitions whose node does not answer: named, exit 3
    if ids:
        at = select_at(q, task, error_type, older_than_ms, ids)  # read where each is dead
        selected = list(at)
        page, total = [(at[i], i) for i in selected[offset : offset + limit]], len(selected)
        more = offset + limit < total
    else:
        # Without a total (a record filter), one beyond the page tells whether more follow.
        beyond = int(task is not None or error_type is not None)
        want = offset + limit + beyond
        found, total = _listing(q, task, error_type, older_than_ms, want, not_read)
        page = found[offset : offset + limit]
        more = len(found) > offset + limit if total is None else offset + limit < total
    now_ms = server_now_ms(client, QueueKeys(queue))  # the queue's node: its scripts' clock
    jobs = page_jobs(q, page)
    rows = [job_json(j, now_ms) for j in jobs]
    # Ids whose hash and spec were deleted by hand: counted in the total, so listed too.
    stored = {j.id for j in jobs}
    gone = [i for _, i in page if i not in stored]
    if as_json:
        paged = {"offset": offset, "limit": limit, "jobs": rows, "gone": gone}
        emit_json({"queue": queue, "total": total, "more": more, **paged, **unread_field(not_read)})
    else:
        print_dead(queue, total, more, rows, gone, now_ms, url)
    exit_unread(not_read)


def _bulk(
    verb: str,
    action: Callable[[Sequence[str]], int],
    queue: str,
    selected: list[str],
    yes: bool,
    as_json: bool,
    recheck: Callable[[Sequence[str]], list[str]],
) -> None:
    if not selected:
        if as_json:
            emit_json({"queue": queue, "action": verb, "matched": 0, "done": 0, "skipped": 0})
        else:
            click.echo("no dead jobs match: nothing to do")
        return
    if not yes:
        ask = {"requeued": "Requeue", "purged": "Delete for good"}.get(verb, verb)
        ask += f" {len(selected)} dead job(s) of queue {queue!r}?"
        click.confirm(ask, abort=True, err=True)  # stdout: the answer only (one JSON object)
    done = 0
    progress = Progress(
        TextColumn(f"{verb} [progress.description]{{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console(stderr=True),
        transient=True,
    )
    with progress:
        step = progress.add_task(queue, total=len(selected))
        for n, chunk in enumerate(iter_chunks(selected, _BATCH)):
            # Re-checked (selected before the confirmation: a job may have died again since).
            done += action(chunk if yes and n == 0 else recheck(chunk))
            progress.advance(step, len(chunk))
    # A job no longer dead (requeued, or its id taken again) or no longer matching is skipped,
    # not an error; purge removes an entry whose job keys are gone, requeue skips it.
    result: dict[str, Any] = {
        "queue": queue,
        "action": verb,
        "matched": len(selected),
        "done": done,
        "skipped": len(selected) - done,
    }
    if as_json:
        emit_json(result)
    else:
        why = f" ({result['skipped']} skipped: {_SKIPPED[verb]})" if result["skipped"] else ""
        click.echo(f"{verb}: {done} of {len(selected)} dead job(s) in {queue!r}{why}")


# Why a selected id was not acted on (purge_dead.lua / requeue_dead.lua skip it).
_SKIPPED = {"requeued": "no longer dead, or no job left to run", "purged": "no longer dead"}


_yes = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


@dead.command("requeue")
@url_option
@queue_option
@json_option
@filter_options
@_yes
def requeue_dead(
    url: str,
    queue: str,
    as_json: bool,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Move matching dead jobs back to due now, with a fresh attempt budget. A partitioned
    queue with a partition's node down: nothing is requeued, those partitions named (exit 3)."""
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)  # a partitioned queue: each id to its partition
    # Requeued chunk by chunk: a parent in a later chunk than its parked children would let
    # them run beside it (a call with both makes them wait again): parents first.
    with unanswered_change_nothing(q, queue, "requeued"):  # a node down: named, exit 3
        selected = requeue_order(q, select(q, task, error_type, older_than_ms, ids))
    recheck = partial(select, q, task, error_type, older_than_ms, refuse=False)
    _bulk("requeued", q.requeue_dead, queue, selected, yes, as_json, recheck)


@dead.command("purge")
@url_option
@queue_option
@json_option
@filter_options
@_yes
def purge_dead(
    url: str,
    queue: str,
    as_json: bool,
    task: str | None,
    error_type: str | None,
    older_than_ms: int | None,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Delete matching dead jobs for good (asks first unless --yes). A partitioned queue with
    a partition's node down: nothing is purged, those partitions named (exit 3)."""
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)
    with unanswered_change_nothing(q, queue, "purged"):  # a node down: named, exit 3
        selected = select(q, task, error_type, older_than_ms, ids)
    recheck = partial(select, q, task, error_type, older_than_ms, refuse=False)
    _bulk("purged", q.purge_dead, queue, selected, yes, as_json, recheck)
