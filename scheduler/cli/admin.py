"""Operator command `stats`; registers `workers` (cli/workers.py) and `keys` (cli/keys.py)
too. The other operator commands register from their own modules (cli/main.py's LAZY), so
`scheduler stats` does not import them."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
import redis
from rich.console import Group
from rich.live import Live
from rich.table import Table

from scheduler.admin.inspection import WINDOWS_MIN, logical_queues
from scheduler.admin.startup import is_permission_error
from scheduler.cli.common import (
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    AdminCommand,
    Seconds,
    cell,
    connect,
    console,
    emit_json,
    fmt_ms,
    json_option,
    queues_option,
    resolve_queues,
    url_option,
)
from scheduler.cli.keys import keys_command
from scheduler.cli.workers import workers_command
from scheduler.client.partitioned import PartitionedQueue, merge_counts, open_queue, unread
from scheduler.core.connection import UNREACHABLE, is_cluster
from scheduler.core.errors import SchedulerError, refused_for_now, slot_move_text
from scheduler.core.safety import safe
from scheduler.operations import browsing

_REDISCOVER_EVERY = 15  # refreshes between SCANs for new queues in `stats --watch`
# --interval's floor: every refresh reads every queue (a SCAN too, every 15th), so 0 re-reads
# them in a tight loop, hammering Redis; 10 refreshes a second is more than a person can read.
_MIN_INTERVAL_S = 0.1
_MAX_INTERVAL_S = 86_400.0
# What one queue's unreadable stored data raises (a key of another type: ResponseError).
_ROW_ERRORS = (redis.ResponseError, SchedulerError, OverflowError, UnicodeError, ValueError)


def register(main: click.Group) -> None:
    for command in (stats, workers_command, keys_command):
        main.add_command(command)


# -- stats -----------------------------------------------------------------------------------
def queue_stats(client: redis.Redis, name: str) -> dict[str, Any]:
    """One row of `stats`; a partitioned queue is one row: its partitions' counts, windows and
    held jobs summed, the oldest overdue job the oldest of the partitions' heads. Two driver
    calls for any number of partitions (each one pipeline, per node on a cluster). A partition
    whose node does not answer (or refuses for now) is left out while another answers: the
    row is the others' and names it (`unread_partitions`; `down`: exit 3)."""
    q, span = open_queue(client, name), max(WINDOWS_MIN)
    not_read: list[str] = []
    paused_parts: list[str] = []
    if isinstance(q, PartitionedQueue):
        each = q.run_answering(lambda p: browsing.queue_row(p.ops, span))
        not_read = unread(q.parts, each)
        per = [r for r in each if not isinstance(r, BaseException)]
        paused_parts = [p.name for p, r in zip(q.parts, each, strict=True)
                        if not isinstance(r, BaseException) and r[0].paused]  # fmt: skip
    else:
        per = [q._run(browsing.queue_row(q.ops, span))]
    counts = merge_counts([c for c, _, _ in per])
    # A head due by its partition's clock: the due set's head is a later job when every due
    # job is held by flow control (not in that set), and such a job is not overdue.
    heads = [pair for c, head, _ in per for pair in head if pair[0] <= c.now_ms]
    windows = [browsing.window_totals(series, WINDOWS_MIN) for _, _, series in per]
    return {
        "queue": name,
        "partitions": len(q.parts) if isinstance(q, PartitionedQueue) else None,
        "now_ms": counts.now_ms,
        "due": counts.due,
        "scheduled": counts.scheduled,
        "leased": counts.leased,
        "lapsed": counts.lapsed,
        "dead": counts.dead,
        "oldest_due_ms": counts.oldest_due_ms,
        "oldest_overdue_id": min(heads)[1] if heads else None,
        "overdue_ms": counts.oldest_overdue_ms,
        "windows": {w: _sum([ws[w] for ws in windows]) for w in windows[0]},
        # Due but set aside by flow control (docs/flow-control.md): by key limit / rate window.
        "held": counts.held,
        "paused_ms": counts.paused_ms,  # None: not paused (Queue.pause, `scheduler pause`)
        # Which partitions are paused (the dashboard's field): fewer than all, a partial pause.
        "paused_partitions": paused_parts,
        "moving": counts.moving,  # taken out of due by `scheduler queue move`, not yet moved
        "unread_partitions": not_read,  # 'partition <name>: <error>': left out of the figures
        "down": bool(not_read),
    }


def _sum(each: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in each:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def stats_row(client: redis.Redis, name: str) -> dict[str, Any]:
    """queue_stats, or when the queue's stored data cannot be read (a key of another type, a
    hand-edited record) a row naming the error: one damaged queue does not hide the others.
    An unreachable server or a refused permission still stops the command; on a cluster, a
    node that does not answer is that queue's row (the other nodes' queues are shown)."""
    try:
        return {**queue_stats(client, name), "error": None}
    except UNREACHABLE as exc:
        if not is_cluster(client):
            raise
        why = slot_move_text(exc) or f"its node does not answer: {exc}"
        return {"queue": name, "error": safe(why), "down": True}
    except _ROW_ERRORS as exc:
        if is_permission_error(exc):
            raise
        if isinstance(exc, redis.ResponseError) and refused_for_now(exc):  # its slot moving...
            why = slot_move_text(exc) or f"Redis refused for now: {exc}"
            return {"queue": name, "error": safe(why), "down": True}
        what = "Redis refused" if isinstance(exc, redis.ResponseError) else "unreadable stored data"
        return {"queue": name, "error": safe(f"{what}: {exc} (see scheduler doctor -q {name})")}


def _paused_note(row: dict[str, Any]) -> str:
    """' (paused)', ' (paused: 1 of 3 partitions)' when only some are (their claims stop, the
    others' go on: a pause cut short, a partition paused alone), '' when none is."""
    if row.get("paused_ms") is None:
        return ""
    some, of = len(row.get("paused_partitions") or ()), row.get("partitions") or 0
    return f" (paused: {some} of {of} partitions)" if 0 < some < of else " (paused)"


def _stats_table(rows: list[dict[str, Any]], nodes_down: list[str]) -> Group:
    # The N newest clock-minute buckets (WINDOWS_MIN), the current, partial one in each.
    spans = "/".join(f"{n}m" for n in WINDOWS_MIN)
    # The stats counters' own words (glossary.md): done, fail, dead (+dead: new dead letters).
    caption = (f"done, fail, +dead (new dead letters): {spans}: the current clock minute and "
               "the last 5 and 60 (each counting the current one)")  # fmt: skip
    t = Table(title="queues", caption=caption)
    for col in ("queue", "due", "scheduled", "leased", "dead", "late by", "done", "fail", "+dead"):
        t.add_column(col, justify="left" if col == "queue" else "right", no_wrap=col == "queue")

    def per_window(row: dict[str, Any], name: str) -> str:
        return "/".join(str(row["windows"][f"{n}m"].get(name, 0)) for n in WINDOWS_MIN)

    for r in rows:
        if r["error"] is not None:
            t.add_row(cell(r["queue"]), "[red]error[/]", *[""] * 7)
            continue
        leased = f"{r['leased']}" + (f" ({r['lapsed']} lapsed)" if r["lapsed"] else "")
        parts = f" ({r['partitions']} partitions)" if r.get("partitions") else ""
        parts += _paused_note(r)
        parts += f" ({r['moving']} moving)" if r.get("moving") else ""
        t.add_row(
            cell(r["queue"] + parts),
            str(r["due"])
            + (f" ({sum(r['held'].values())} held)" if any(r["held"].values()) else ""),
            str(r["scheduled"]),
            leased,
            str(r["dead"]),
            fmt_ms(r["overdue_ms"]) if r["overdue_ms"] else "-",
            per_window(r, "done"),
            per_window(r, "fail"),
            per_window(r, "dead"),
        )
    if not rows:
        t.add_row("(no queues)", *[""] * 8)
    errors = [cell(f"{r['queue']}: {r['error']}") for r in rows if r["error"] is not None]
    errors += [
        cell(f"{r['queue']}: not read: {u}") for r in rows for u in r.get("unread_partitions", [])
    ]
    errors += [cell(f"node {u} (its queues are not listed)") for u in nodes_down]
    return Group(t, *errors)


@click.command(cls=AdminCommand)
@url_option
@queues_option
@json_option
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option(
    "--interval",
    type=Seconds(min=_MIN_INTERVAL_S, max=_MAX_INTERVAL_S),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes with --watch; each reads every queue (0.1 .. a day).",
)
@click.option(
    "--count",
    type=click.IntRange(min=0),
    default=0,
    help="With --watch: stop after this many refreshes (0: never).",
)
def stats(
    url: str, queues: tuple[str, ...], as_json: bool, watch: bool, interval: float, count: int
) -> None:
    """Per queue: due now, scheduled later, leased, dead (and moving: being moved by `queue
    move`), the oldest overdue job and how late it is, and done / fail / new dead counts in
    the current clock minute and the last 5 and 60 (each counting the current one). A queue
    whose stored data cannot be read is shown with its error (exit 1); on a cluster, a node
    that does not answer is named and the others' queues shown (exit 3)."""
    client = connect(url)
    down: list[str] = []
    if not watch:
        rows = [stats_row(client, n) for n in resolve_queues(client, queues, down)]
        if as_json:
            emit_json({"queues": rows, **({"unreachable": down} if down else {})})
        else:
            console().print(_stats_table(rows, down))
    else:
        try:
            rows, down = _watch(client, queues, as_json, interval, count)
        except KeyboardInterrupt:  # Ctrl-C is how a watch ends: a clean stop, not "Aborted!"
            return
    if down or any(r.get("down") for r in rows):
        sys.exit(EXIT_UNREACHABLE)
    if any(r["error"] is not None for r in rows):
        sys.exit(EXIT_FAILED)


def _watch(
    client: redis.Redis, queues: tuple[str, ...], as_json: bool, interval: float, count: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """Refresh until --count refreshes (the last rows and unreachable nodes returned) or
    Ctrl-C. An explicit queue may be empty for now; discovery is redone every
    _REDISCOVER_EVERY refreshes."""
    refreshes = 0
    down: list[str] = []
    names = list(queues) or logical_queues(client, down)
    with Live(console=console(), auto_refresh=False, transient=False) as live:
        while True:
            if not queues and refreshes and refreshes % _REDISCOVER_EVERY == 0:
                down = []
                names = logical_queues(client, down)  # a full SCAN: not on every refresh
            rows = [stats_row(client, n) for n in names]
            if as_json:
                click.echo(json.dumps({"queues": rows, **({"unreachable": down} if down else {})},
                                      sort_keys=True))  # fmt: skip
            else:
                live.update(_stats_table(rows, down), refresh=True)
            refreshes += 1
            if count and refreshes >= count:
                return rows, down
            time.sleep(interval)
