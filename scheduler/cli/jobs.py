"""`scheduler jobs list | show | reschedule` (`cancel`: job_cancel.py) and `scheduler enqueue`."""

from __future__ import annotations

from typing import Any

import click
import redis
from redis.exceptions import WatchError
from rich.console import Console
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
    fmt_ms,
    fmt_time,
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
from scheduler.cli.job_view import UNREADABLE_LEASE, job_json, placement, print_job
from scheduler.cli.job_where import held_call
from scheduler.client.partitioned import PartitionedQueue, list_answering, open_queue
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
def list_jobs(
    url: str, queue: str, as_json: bool, state: str, task: str | None, offset: int, limit: int
) -> None:
    """Jobs in one state, oldest first (dead: newest first; finished: latest to expire first),
    paged with --offset / --limit. A partitioned queue's partition whose node does not answer
    is named (`not read: ...` on stderr, --json's `unreachable`) and the others' jobs listed,
    paged as one queue, exit 3."""
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)  # a partitioned queue: its partitions merged
    scanned = None
    left_out: dict[str, str] = {}  # partitions whose node does not answer: named, exit 3
    if task is None:
        found = _page(q, state, offset, limit, left_out)
    else:
        found, scanned = _filter_by_task(q, state, task, offset, limit, left_out)
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
                "jobs": rows,
                **unread_field(not_read),
            }
        )
        exit_unread(not_read)
        return
    title = f"{state} jobs in {queue!r}"
    out = console()
    if out.width < _TABLE_MIN_WIDTH:
        _print_blocks(out, title + (f" (task {task})" if task else ""), rows, state)
    else:
        t = Table(title=title + (f" (task {markup_safe(task)})" if task else ""))
        id_column(t, "id", (r["id"] for r in rows))
        for col in ("task", "attempts", "when", "worker", "last error"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(
                cell(r["id"]),
                cell(r["task"]),
                fmt_attempts(r).removeprefix("attempts "),
                cell(_when(r, state)),
                cell(r["worker"] or "-"),
                cell(_error(r)),
            )
        out.print(t)
    if scanned is not None and scanned >= _TASK_SCAN_MAX:
        out.print(f"[yellow]stopped after examining {scanned} jobs; narrow with --offset[/]")
    exit_unread(not_read)


# Narrower than this, six columns fold task names and worker ids by character: one block per
# job instead (as `dead list` prints), which wraps by word at any width and greps well.
_TABLE_MIN_WIDTH = 120


def _when(r: dict[str, Any], state: str) -> str:
    if state == "leased":
        if r["lease_unreadable"]:
            return "lease " + UNREADABLE_LEASE
        left = r["lease_left_ms"] or 0
        return f"lease left {fmt_ms(left)}" if left >= 0 else f"lease lapsed {fmt_ms(-left)} ago"
    if state == "dead":
        return f"dead {fmt_time(r['dead_ms'])}: {r['dead_reason'] or '?'}"
    if state == "held":
        return f"held: {r['flow'] or 'flow control'}"
    if state == "finished":
        return f"{r['state']} {fmt_time(r['finished_ms'])}"
    if (r["run_in_ms"] or 0) > 0:
        return f"run in {fmt_ms(r['run_in_ms'])}"
    return f"late {fmt_ms(-(r['run_in_ms'] or 0))}"


def _error(r: dict[str, Any]) -> str:
    return f"{r['last_error_type']}: {r['last_error']}" if r["last_error_type"] else "-"


def _print_blocks(out: Console, title: str, rows: list[dict[str, Any]], state: str) -> None:
    out.print(cell(f"{title}: {len(rows)} shown"))
    for r in rows:
        head = f"{r['id']}  {r['task']}  {fmt_attempts(r)}"
        out.print(cell(f"{head}  {_when(r, state)}"), style="bold")
        if r["worker"]:
            out.print(cell(f"  worker: {r['worker']}"))
        if r["last_error_type"]:
            out.print(cell(f"  last error: {_error(r)}"))


def _page(
    q: Queue | PartitionedQueue, state: str, offset: int, limit: int, left_out: dict[str, str]
) -> list[Job]:
    """One page; a partitioned queue's of the partitions that answer (list_answering)."""
    if isinstance(q, Queue):
        return q.list_jobs(state, offset=offset, limit=limit)
    return list_answering(q, state, offset, limit, left_out)


def _filter_by_task(
    q: Queue | PartitionedQueue,
    state: str,
    task: str,
    offset: int,
    limit: int,
    left_out: dict[str, str],
) -> tuple[list[Job], int]:
    matched: list[Job] = []
    start = 0
    while start < _TASK_SCAN_MAX and len(matched) < offset + limit:
        page = _page(q, state, start, _TASK_PAGE, left_out)
        if not page:
            break
        start += _TASK_PAGE
        matched += [j for j in page if j.task == task]
    return matched[offset : offset + limit], start


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
@click.option("--now", is_flag=True, help="Run it now.")
@click.option("--in", "in_ms", type=Duration(), help="Run after this delay: 30s, 5m, 1h30m.")
@click.option("--at", "at_text", metavar="ISO8601", help="Run at this time: 2030-01-01T09:00Z.")
def reschedule_job(
    url: str, queue: str, as_json: bool, job_id: str, now: bool, in_ms: int | None,
    at_text: str | None,
) -> None:  # fmt: skip
    """Move a waiting job's run time (scheduled, due, or waiting out a retry): --now, --in or
    --at. Prints `rescheduled`, or why it did not move (exit 1): leased, done, dead,
    cancelled, held (flow control), schedule (a schedule's run), moving (`queue move`)."""
    if sum((now, in_ms is not None, at_text is not None)) != 1:
        raise BadInput("give one of --now, --in, --at")
    try:
        run_at = parse_at(at_text) if at_text is not None else None
    except BadArgument as exc:
        raise BadInput(str(exc)) from None
    delay_ms = 0 if now else in_ms
    opened = open_queue(connect(url), queue)
    # Where the job is, as `jobs show` (its node down: named, exit 3).
    status = held_call(
        opened, queue, job_id, lambda p: p.reschedule(job_id, delay_ms=delay_ms, run_at=run_at)
    )
    if as_json:
        emit_json({"queue": queue, "job": job_id, "status": status})
    else:
        click.echo(f"{job_id}: {status}")
    if status != "rescheduled":
        raise SystemExit(EXIT_FAILED)
