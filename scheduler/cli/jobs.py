"""`scheduler jobs list | show | reschedule` (`cancel`: job_cancel.py) and `scheduler enqueue`."""

from __future__ import annotations

from typing import Any

import click
import redis
from redis.exceptions import WatchError
from rich.table import Table

from scheduler.admin.inspection import server_now_ms
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    AdminGroup,
    BadInput,
    Duration,
    cell,
    connect,
    console,
    emit_json,
    fmt_attempts,
    id_column,
    json_option,
    markup_safe,
    parse_at,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.cli.dead_view import exit_unread, unread_field
from scheduler.cli.enqueue import enqueue, parse_payload
from scheduler.cli.job_cancel import cancel_jobs
from scheduler.cli.job_view import (
    TABLE_MIN_WIDTH,
    error_text,
    job_json,
    placement,
    print_blocks,
    print_job,
    when_text,
)
from scheduler.cli.job_where import held_call
from scheduler.cli.output import fits_whole
from scheduler.cli.pausing import emit_noted, paused_note
from scheduler.client import job_listing
from scheduler.client.partitioned import PartitionedQueue, open_queue
from scheduler.client.queue import Queue
from scheduler.core import connection
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys, check_job_id
from scheduler.core.models import Job
from scheduler.operations.inspecting import LISTABLE

# job_json and parse_payload live in job_view.py / enqueue.py; dead.py and schedules.py import
# them from here.
__all__ = ["enqueue", "job_json", "jobs", "parse_payload", "register"]

_STATES = LISTABLE
_TASK_SCAN_MAX = 50_000  # ids examined per `jobs list --task` call at most (bounded work)
_TASK_PAGE = 500
_SKIP, _PAGE = "Skip this many matching jobs first.", "Print at most this many jobs."
_SCAN_FROM = "With --task: examine the state's jobs from this position on (a cut list says where)."


def register(main: click.Group) -> None:
    main.add_command(jobs)
    main.add_command(enqueue)


@click.group(cls=AdminGroup, epilog=EXIT_CODES_HELP)
def jobs() -> None:
    """List jobs by state, show everything about one job, reschedule or cancel jobs."""


jobs.add_command(cancel_jobs)


@jobs.command("list")
@url_option
@queue_option
@json_option
@click.option(
    "--state",
    type=click.Choice(_STATES),
    default="due",
    show_default=True,
    help="due: runnable now; scheduled: later; held: due, set aside by flow control; "
    "leased: running; dead: dead-lettered; finished: done or cancelled, while its record "
    "is kept.",
)
@click.option("--task", help="Only jobs of this task.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help=_SKIP)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help=_PAGE)
@click.option("--scan-from", type=click.IntRange(min=0), help=_SCAN_FROM)
def list_jobs(
    url: str, queue: str, as_json: bool, state: str, task: str | None, offset: int, limit: int,
    scan_from: int | None,
) -> None:  # fmt: skip
    """Jobs in one state, oldest first (dead: newest first; finished: latest to expire first),
    paged with --offset / --limit. A partitioned queue's partition whose node does not answer
    is named (`not read: ...` on stderr, --json's `unreachable`) and the others' jobs listed,
    paged as one queue, exit 3.

    --task examines at most 50,000 jobs of the state a call; when more are left it says so
    (--json: `cut`, and `next_scan_from`), and --scan-from goes on from there."""
    if scan_from is not None and task is None:
        raise BadInput("--scan-from goes with --task")
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)  # a partitioned queue: its partitions merged
    scanned = cut = next_scan = None
    left_out: dict[str, str] = {}  # partitions whose node does not answer: named, exit 3
    # The table shows no payload: the records' heads are read (job_listing); --json prints it.
    if task is None:
        found = [j for _, j in job_listing.page(q, state, offset, limit, left_out, payload=as_json)]
    else:
        found, scanned, cut = _filter_by_task(q, state, task, scan_from or 0, offset, limit,
                                              left_out, as_json)  # fmt: skip
        next_scan = (scan_from or 0) + scanned if cut else None
    not_read = [f"partition {n}: {e}" for n, e in left_out.items()]
    now_ms = server_now_ms(client, QueueKeys(queue))  # the queue's node: its scripts' clock
    rows = [job_json(j, now_ms) for j in found]
    if as_json:
        emit_json(
            {
                "queue": queue,
                "state": state,
                "task": task,
                "offset": offset,
                "limit": limit,
                "scanned": scanned,
                "cut": cut,
                "next_scan_from": next_scan,
                "jobs": rows,
                **unread_field(not_read),
            }
        )
        exit_unread(not_read)
        return
    title = f"{state} jobs in {queue!r}"
    out = console()
    t = Table(title=title + (f" (task {markup_safe(task)})" if task else ""))
    # Ids, task names and worker ids whole (what `| grep` and the next command take), the
    # rest wrapped by word; a row that cannot fit so on a terminal is printed as a block.
    for col in ("id", "task", "attempts", "when", "worker", "last error"):
        if col in ("id", "task", "worker"):
            id_column(t, col, (r[col] or "-" for r in rows))
        else:
            t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(
            cell(r["id"]),
            cell(r["task"]),
            fmt_attempts(r).removeprefix("attempts "),
            cell(when_text(r, state)),
            cell(r["worker"] or "-"),
            cell(error_text(r)),
        )
    if out.width < TABLE_MIN_WIDTH or not fits_whole(out, t):
        print_blocks(out, title + (f" (task {task})" if task else ""), rows, state)
    else:
        out.print(t)
    if cut:  # the jobs past the cut were not examined: --offset (matches) cannot reach them
        out.print(f"[yellow]stopped after examining {scanned} jobs, more are left: examine the"
                  f" next ones with --scan-from {next_scan}[/]")  # fmt: skip
    exit_unread(not_read)


def _filter_by_task(
    q: Queue | PartitionedQueue,
    state: str,
    task: str,
    scan_from: int,
    offset: int,
    limit: int,
    left_out: dict[str, str],
    payload: bool,
) -> tuple[list[Job], int, bool]:
    """The page of `task`'s jobs (`offset` skips matches) among at most _TASK_SCAN_MAX jobs of
    `state` from position `scan_from`; how many jobs were examined; whether the scan was cut
    with jobs left unexamined (not when it stopped for having enough matches). The task is in
    each record's head: the matches alone are read whole, for `payload` (--json)."""
    matched: list[tuple[int, Job]] = []
    scanned = 0
    cut = False
    while scanned < _TASK_SCAN_MAX and len(matched) < offset + limit:
        n = min(_TASK_PAGE, _TASK_SCAN_MAX - scanned)
        got = job_listing.page(q, state, scan_from + scanned, n, left_out)
        scanned += len(got)
        matched += [(k, j) for k, j in got if j.task == task]
        if len(got) < n:
            break
    else:
        cut = len(matched) < offset + limit and bool(
            job_listing.page(q, state, scan_from + scanned, 1, {})
        )
    found = matched[offset : offset + limit]
    return job_listing.whole(q, found) if payload else [j for _, j in found], scanned, cut


def _job_id(_: click.Context, __: click.Parameter, value: str) -> str:
    try:
        return check_job_id(value)
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _shown(client: redis.Redis, q: Queue, job_id: str) -> tuple[Job, dict[str, Any]]:
    """The job's record and where it is stored, as of one moment: both read under WATCH of its
    hash and spec record (every move of a job writes one of them), again when it moved between
    the reads (a worker completing it must not show a leased job in no place); a job that
    keeps moving is shown as last read."""
    with connection.node_for_key(client, q.keys.prefix).pipeline(transaction=True) as pipe:
        for _ in range(_SHOW_TRIES):
            pipe.watch(q.keys.job(job_id), q.keys.spec(job_id))  # type: ignore[no-untyped-call]
            job = q.get_job(job_id)  # JobNotFound: exit 1
            data = job_json(job, server_now_ms(client, q.keys))
            data.update(placement(client, q, job_id))
            try:
                pipe.multi()
                pipe.execute()  # an empty MULTI/EXEC: refused when the job moved meanwhile
                break
            except WatchError:
                continue
    return job, data


_SHOW_TRIES = 5


@jobs.command("show")
@url_option
@queue_option
@json_option
@click.argument("job_id", metavar="ID", callback=_job_id)
def show_job(url: str, queue: str, as_json: bool, job_id: str) -> None:
    """Everything about one job: payload, state, attempts, token, worker, lease time left,
    error history, and where it is stored."""
    client = connect(url)
    require_queue(client, queue)  # a typo in -q: refused, not "no job"
    opened = open_queue(client, queue)
    # Where the job is (its id may route elsewhere); its node down: the partition named, exit 3.
    q, (job, data) = held_call(opened, queue, job_id, lambda p: (p, _shown(client, p, job_id)))
    data["queue"] = queue
    if q.name != queue:
        data["partition"] = q.name
    data["fields"] = job.fields
    if as_json:
        emit_json(data)
        return
    print_job(data, job_id, queue)


@jobs.command("reschedule")
@url_option
@queue_option
@json_option
@click.argument("job_id", metavar="ID", callback=_job_id)
@click.option(
    "--now", is_flag=True, help="Run it now (a job due already keeps its place in line: 'due')."
)
@click.option("--in", "in_ms", type=Duration(), help="Run after this delay: 30s, 5m, 1h30m.")
@click.option("--at", "at_text", metavar="ISO8601", help="Run at this time: 2030-01-01T09:00Z.")
def reschedule_job(
    url: str, queue: str, as_json: bool, job_id: str, now: bool, in_ms: int | None,
    at_text: str | None,
) -> None:  # fmt: skip
    """Move a waiting job's run time (scheduled, due, or waiting out a retry): --now, --in or
    --at. Prints `rescheduled`, `due` (--now of a job due already: it keeps its place, ahead of
    the jobs due after it), or why it did not move (exit 1): leased, done, dead, cancelled,
    held (flow control), schedule (a schedule's pending run), moving (`queue move`)."""
    if sum((now, in_ms is not None, at_text is not None)) != 1:
        raise BadInput("give one of --now, --in, --at")
    try:
        run_at = parse_at(at_text) if at_text is not None else None
    except BadArgument as exc:
        raise BadInput(str(exc)) from None
    client = connect(url)
    require_queue(client, queue)
    opened = open_queue(client, queue)

    def moved(p: Queue) -> tuple[str, str]:
        # --now as the dashboard's Run now: a job due already is left where it is (re-scored
        # to now it went behind every job due before now, an aged one behind every priority);
        # moved in a paused queue (partition), it waits for a resume however soon it is due:
        # said, as the dashboard does (--in 0s and a past --at too).
        if now:
            status = p._run(p.ops.run_now(job_id))
        else:
            status = p.reschedule(job_id, delay_ms=in_ms, run_at=run_at)
        return status, paused_note(p, queue) if status in ("rescheduled", "due") else ""

    # Where the job is, as `jobs show` (its node down: named, exit 3).
    status, note = held_call(opened, queue, job_id, moved)
    data = {"queue": queue, "job": job_id, "status": status}
    emit_noted(data, f"{job_id}: {status}", note, as_json)
    if status != "rescheduled" and not (now and status == "due"):
        raise SystemExit(EXIT_FAILED)
