"""`scheduler workers` (`workers list`): the live worker processes of every queue (or of those
named), read from each queue's presence records (scheduler/admin/workers.py); `workers quiet`
and `workers stop` ask them to stop (cli/workers_stop.py)."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table

from scheduler.admin.inspection import live_workers, server_now_ms
from scheduler.cli.common import (
    EXIT_UNREACHABLE,
    AdminCommand,
    AdminGroup,
    BadInput,
    cell,
    connect,
    console,
    emit_json,
    fmt_ms,
    fmt_time,
    json_option,
    markup_safe,
    physical_queues,
    queues_option,
    resolve_queues,
    url_option,
)
from scheduler.cli.workers_stop import quiet_command, stop_command
from scheduler.core.connection import UNREACHABLE, is_cluster
from scheduler.core.keys import QueueKeys
from scheduler.core.safety import safe

_WORKERS_TABLE_MIN_WIDTH = 120  # narrower: one block per worker, nothing cut to "…"


class _WorkersGroup(AdminGroup, AdminCommand):
    """A group whose own callback (`scheduler workers` alone lists) maps errors to exit codes
    as a command's does (Group.invoke runs it through AdminCommand.invoke)."""


@click.group("workers", cls=_WorkersGroup, invoke_without_command=True)
@url_option
@queues_option
@json_option
@click.pass_context
def workers_command(ctx: click.Context, url: str, queues: tuple[str, ...], as_json: bool) -> None:
    """Live worker processes (`scheduler workers` is `workers list`); `workers quiet` and
    `workers stop` ask one to stop."""
    if ctx.invoked_subcommand is None:
        list_workers(url, queues, as_json)
        return
    given = [p for p in ("url", "queues", "as_json")
             if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]  # fmt: skip
    if given:  # they would be ignored: the subcommand has its own
        raise BadInput(f"put the options after `workers {ctx.invoked_subcommand}`")


@workers_command.command("list")
@url_option
@queues_option
@json_option
def list_command(url: str, queues: tuple[str, ...], as_json: bool) -> None:
    """Live worker processes: id, host, pid, queues, started, last heartbeat, jobs in flight,
    a stop under way or asked (`workers quiet|stop`). A worker's record expires when it stops
    heart-beating, so a dead one drops out by itself. On a cluster, a node that does not
    answer is named and the others' workers listed (exit 3)."""
    list_workers(url, queues, as_json)


workers_command.add_command(quiet_command)
workers_command.add_command(stop_command)


def list_workers(url: str, queues: tuple[str, ...], as_json: bool) -> None:
    client = connect(url)
    found: list[dict[str, Any]] = []
    gone: dict[str, list[str]] = {}
    damaged: dict[str, str] = {}  # an unreadable partition record: its own keys are read
    down: list[str] = []  # "host:port: error" of a node, or "queue <name>: error"
    answered: list[str] = []  # queues whose node answered: the clock is read on the first
    for logical in resolve_queues(client, queues, down):
        # A worker on a partitioned queue registers in every partition: listed once, under
        # the logical name; a worker of two queues, under each.
        seen: set[str] = set()
        try:
            for name in physical_queues(client, [logical], damaged):
                live, expired = _live_on(client, name, down, answered)
                found += [{**w.to_json(), "queue": logical} for w in live if w.id not in seen]
                seen.update(w.id for w in live)
                if expired:
                    gone[name] = expired
        except UNREACHABLE as exc:  # its partition record's node
            if not is_cluster(client):
                raise
            down.append(f"queue {logical}: {exc}")
    now_ms = server_now_ms(client, QueueKeys(answered[0]) if answered else None)
    for name, why in damaged.items():
        click.echo(
            safe(f"warning: {why}; read as a plain queue (scheduler doctor -q {name})"), err=True
        )
    if as_json:
        # "gone": records of workers that stopped beating (`expired` is a lease's word).
        emit_json({"now_ms": now_ms, "workers": found, "gone": gone,
                   **({"unreachable": down} if down else {})})  # fmt: skip
    else:
        _print(found, gone, down, now_ms)
    if down:
        sys.exit(EXIT_UNREACHABLE)


def _live_on(
    client: Any, name: str, down: list[str], answered: list[str]
) -> tuple[list[Any], list[str]]:
    """live_workers of one (physical) queue; on a cluster, nothing when its node does not
    answer (named in `down`)."""
    try:
        found = live_workers(client, QueueKeys(name))
    except UNREACHABLE as exc:
        if not is_cluster(client):
            raise
        down.append(f"queue {name}: {exc}")
        return [], []
    answered.append(name)
    return found


def stop_state(w: dict[str, Any]) -> str:
    """The stop column: what the worker is carrying out ('quiet', 'stopping'), and a request
    its next beat has yet to read ('stop asked'); a worker of a version that cannot hear a
    stop is named, to be signalled instead."""
    if w.get("hears_stop") is False:
        return "older version: SIGTERM"
    doing = {"quiet": "quiet", "stop": "stopping"}.get(w.get("stopping") or "", "")
    asked = f"{w['stop_requested']} asked" if w.get("stop_requested") else ""
    return ", ".join(p for p in (doing, asked) if p) or "-"


def _print(found: list[dict[str, Any]], gone: dict[str, list[str]], down: list[str],
           now_ms: int) -> None:  # fmt: skip
    t = Table(title="live workers")
    # The stop column only while a worker stops or is asked to: else the queues had its room.
    stops = any(stop_state(w) != "-" for w in found)
    for col in ("queue", "id", "host", "pid", "queues", "started", "last heartbeat", "in flight",
                *(("stop",) if stops else ())):  # fmt: skip
        t.add_column(col, no_wrap=col in ("queue", "id"))
    out = console()
    for w in found:
        beat = w["last_heartbeat_ms"] or w["last_seen_ms"]
        flight = "-" if w["in_flight"] is None else str(w["in_flight"])
        if w["concurrency"] is not None:
            flight += f" / {w['concurrency']}"
        last = f"{fmt_ms(now_ms - beat)} ago" if beat else "-"
        started = fmt_time(w["started_ms"])
        names = ",".join(w["queues"])
        stop = stop_state(w)
        row = (w["queue"], w["id"], w["host"], str(w["pid"] or "-"), names, started, last, flight,
               *((stop,) if stops else ()))  # fmt: skip
        if out.width < _WORKERS_TABLE_MIN_WIDTH:
            # Eight columns at 80 would cut queues and times to "…": one block per worker.
            head = f"{w['id']}  on {w['queue']}  host {w['host']} pid {row[3]}"
            out.print(cell(head), style="bold")
            out.print(cell(f"  queues {names}  started {started}"))
            out.print(cell(f"  last heartbeat {last}  in flight {flight}"))
            if stop != "-":
                out.print(cell(f"  stop {stop}"))
        else:
            t.add_row(*(cell(v) for v in row))
    if not found:
        out.print("no live workers")
    elif out.width >= _WORKERS_TABLE_MIN_WIDTH:
        out.print(t)
    for name, ids in gone.items():
        gone_line = (
            f"{markup_safe(name)}: {len(ids)} record(s) of workers gone (no beat within their "
            "ttl), not yet pruned"
        )
        out.print(f"[dim]{gone_line}[/dim]")
    for u in down:
        out.print(cell(f"not read: {u}" if u.startswith("queue ") else f"not read: node {u}"))
