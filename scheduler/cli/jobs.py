"""`scheduler jobs list | show` and `scheduler enqueue`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
import redis
from rich.table import Table

from scheduler.admin.inspection import server_now_ms
from scheduler.admin.startup import check_or_warn
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    AdminCommand,
    AdminGroup,
    BadInput,
    Duration,
    backoff_option,
    cell,
    connect,
    console,
    decoded_payload,
    emit_json,
    fmt_ms,
    fmt_time,
    id_column,
    json_option,
    markup_safe,
    parse_at,
    queue_option,
    require_queue,
    timeout_option,
    url_option,
)
from scheduler.client.queue import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.codec import stored_int
from scheduler.core.errors import BadArgument
from scheduler.core.keys import check_job_id
from scheduler.core.models import Job
from scheduler.core.safety import safe
from scheduler.operations.dead_letters import dead_converted

_STATES = ("due", "scheduled", "leased", "dead")
_TASK_SCAN_MAX = 50_000  # ids examined per `jobs list --task` call at most (bounded work)
_TASK_PAGE = 500
_TIME_FIELDS = {
    "run_at_ms",
    "lease_until_ms",
    "enqueued_ms",
    "claimed_ms",
    "finished_ms",
    "dead_ms",
}
_DURATION_FIELDS = {"run_in_ms", "lease_left_ms", "ttl_ms", "timeout_ms"}


def register(main: click.Group) -> None:
    main.add_command(jobs)
    main.add_command(enqueue)


def _int(v: str | None) -> int | None:
    return stored_int(v)  # the one strict reader of stored numbers (scheduler/core/codec.py)


def job_json(job: Job, now_ms: int) -> dict[str, Any]:
    """Everything about one job, decoded, with times relative to the server's clock."""
    f = job.fields
    payload, payload_error = decoded_payload(f.get("payload"))
    result, _ = decoded_payload(f.get("result")) if "result" in f else (None, None)
    run_at = job.run_at_ms
    state = job.state
    if state == "due" and run_at is not None and run_at > now_ms:
        state = "scheduled"
    token = job.token
    fence = _int(token.split("-", 1)[0]) if token else None
    return {
        "id": job.id,
        "state": state,
        "stored_state": job.stored_state,
        "task": job.task,
        "payload": payload,
        "payload_error": payload_error,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "run_at_ms": run_at,
        "run_in_ms": None if run_at is None else run_at - now_ms,
        "token": token,
        "fence": fence,
        "worker": job.worker,
        "lease_until_ms": job.lease_until_ms,
        "lease_left_ms": None if job.lease_until_ms is None else job.lease_until_ms - now_ms,
        "enqueued_ms": _int(f.get("enqueued_ms")),
        "claimed_ms": _int(f.get("claimed_ms")),
        "finished_ms": _int(f.get("finished_ms")),
        "dead_ms": _int(f.get("dead_ms")),
        "dead_reason": job.dead_reason,
        "last_error_type": f.get("last_error_type"),
        "last_error": f.get("last_error"),
        "result": result,
        "errors": [e for e in job.errors if isinstance(e, dict)],  # hand-written: may be anything
        "timeout_ms": _int(f.get("timeout_ms")),
        "schedule": f.get("schedule"),
    }


@click.group(cls=AdminGroup, epilog=EXIT_CODES_HELP)
def jobs() -> None:
    """List jobs by state, or show everything about one job."""


@jobs.command("list")
@url_option
@queue_option
@json_option
@click.option(
    "--state",
    type=click.Choice(_STATES),
    default="due",
    show_default=True,
    help="due: runnable now; scheduled: later; leased: running; dead: parked.",
)
@click.option("--task", help="Only jobs of this task.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
def list_jobs(
    url: str, queue: str, as_json: bool, state: str, task: str | None, offset: int, limit: int
) -> None:
    """Jobs in one state, oldest first (dead: newest first), paged with --offset / --limit."""
    client = connect(url)
    require_queue(client, queue)
    q = Queue(client, queue)
    scanned = None
    if task is None:
        found = q.list_jobs(state, offset=offset, limit=limit)
    else:
        found, scanned = _filter_by_task(q, state, task, offset, limit)
    now_ms = server_now_ms(client)
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
            }
        )
        return
    t = Table(title=f"{state} jobs in {queue!r}" + (f" (task {markup_safe(task)})" if task else ""))
    id_column(t, "id", (r["id"] for r in rows))
    for col in ("task", "attempts", "when", "worker", "last error"):
        t.add_column(col, overflow="fold")
    for r in rows:
        if state == "leased":
            when = f"lease left {fmt_ms(r['lease_left_ms'])}"
        elif state == "dead":
            when = f"dead {fmt_time(r['dead_ms'])}: {r['dead_reason'] or '?'}"
        else:
            when = (
                f"run in {fmt_ms(r['run_in_ms'])}"
                if (r["run_in_ms"] or 0) > 0
                else (f"late {fmt_ms(-(r['run_in_ms'] or 0))}")
            )
        err = f"{r['last_error_type']}: {r['last_error']}" if r["last_error_type"] else "-"
        t.add_row(
            cell(r["id"]),
            cell(r["task"]),
            f"{r['attempts']}/{r['max_attempts']}",
            cell(when),
            cell(r["worker"] or "-"),
            cell(err),
        )
    out = console()
    out.print(t)
    if scanned is not None and scanned >= _TASK_SCAN_MAX:
        out.print(f"[yellow]stopped after examining {scanned} jobs; narrow with --offset[/]")


def _filter_by_task(
    q: Queue, state: str, task: str, offset: int, limit: int
) -> tuple[list[Job], int]:
    matched: list[Job] = []
    start = 0
    while start < _TASK_SCAN_MAX and len(matched) < offset + limit:
        page = q.list_jobs(state, offset=start, limit=_TASK_PAGE)
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


@jobs.command("show")
@url_option
@queue_option
@json_option
@click.argument("job_id", metavar="ID", callback=_job_id)
def show_job(url: str, queue: str, as_json: bool, job_id: str) -> None:
    """Everything about one job: payload, state, attempts, token, worker, lease time left,
    error history, and where it is stored."""
    client = connect(url)
    q = Queue(client, queue)
    job = q.get_job(job_id)  # JobNotFound: exit 1
    data = job_json(job, server_now_ms(client))
    data.update(_placement(client, q, job_id))
    data["queue"] = queue
    data["fields"] = job.fields
    if as_json:
        emit_json(data)
        return
    t = Table(title=f"job {job_id} in {queue!r}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    skip = {"fields", "errors", "payload", "result"}
    for name, value in data.items():
        if name in skip or value is None:
            continue
        for label, shown in _readable(name, value, data["state"]):
            t.add_row(label, cell(shown))
    # json.dumps escapes control characters inside strings; a raw (non-JSON) payload is
    # printed as a JSON string for the same reason.
    t.add_row("payload", cell(json.dumps(data["payload"], indent=2), keep_newlines=True))
    if data["result"] is not None:
        t.add_row("result", cell(json.dumps(data["result"], indent=2), keep_newlines=True))
    out = console()
    out.print(t)
    if data["errors"]:
        e = Table(title="error history (oldest first)")
        for col in ("attempt", "at", "type", "message"):
            e.add_column(col, overflow="fold")
        for err in data["errors"]:
            e.add_row(
                cell(err.get("attempt", "")),
                fmt_time(_int(str(err.get("at_ms")))),
                cell(err.get("type", "")),
                cell(err.get("message", "")),
            )
        out.print(e)
        last_tb = data["errors"][-1].get("traceback")
        if last_tb:
            out.print("[bold]last traceback[/]")
            # The one intentionally multi-line text: newlines kept, every other control escaped.
            out.print(cell(last_tb, keep_newlines=True), highlight=False, soft_wrap=True)


def _readable(name: str, value: Any, state: str) -> list[tuple[str, object]]:
    """`jobs show` rows for one field: a time as `run_at` (ISO) plus `run_at_ms` (the stored
    number); a duration without the `_ms` suffix it no longer is; relative times only where
    they mean something (run in / late by for a waiting job, lease left for a leased one)."""
    if name in _TIME_FIELDS:
        return [(name.removesuffix("_ms"), fmt_time(value)), (name, value)]
    if name == "run_in_ms":
        if state not in ("due", "scheduled"):
            return []
        return [("run in", fmt_ms(value))] if value > 0 else [("late by", fmt_ms(-value))]
    if name == "lease_left_ms":
        return [("lease left", fmt_ms(value))] if state == "leased" else []
    if name in _DURATION_FIELDS:
        return [(name.removesuffix("_ms"), fmt_ms(value))]
    return [(name, value)]


def _placement(client: redis.Redis, q: Queue, job_id: str) -> dict[str, Any]:
    k = q.keys
    q._run(dead_converted())  # a dead LIST from an older version becomes the ZSET first
    pipe = client.pipeline(transaction=True)
    pipe.zscore(k.due, job_id)
    pipe.zscore(k.leased, job_id)
    pipe.zscore(k.dead, job_id)
    pipe.pttl(k.job(job_id))
    due, leased, dead_pos, pttl = pipe.execute()
    places = [p for p, v in (("due", due), ("leased", leased), ("dead", dead_pos)) if v is not None]
    return {"places": places, "ttl_ms": int(pttl) if int(pttl) >= 0 else None}


# -- enqueue ---------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_payload(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise BadInput(f"--payload is not valid JSON: {exc}") from None


@click.command(cls=AdminCommand)
@url_option
@queue_option
@json_option
@click.argument("task")
@click.option("--payload", default="null", show_default=True, help="The job's JSON payload.")
@click.option(
    "--at",
    "at_text",
    metavar="ISO8601",
    help="Run at this time, with an offset: 2030-01-01T09:00:00Z.",
)
@click.option("--in", "in_ms", type=Duration(), help="Run after this delay: 30s, 5m, 1h30m.")
@click.option("--key", help="Idempotency key: a second enqueue with it returns the first id.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=5, show_default=True)
@timeout_option
@backoff_option
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse (exit 1) when the Redis settings can lose jobs; else warn.",
)
def enqueue(
    url: str,
    queue: str,
    as_json: bool,
    task: str,
    payload: str,
    at_text: str | None,
    in_ms: int | None,
    key: str | None,
    max_attempts: int,
    timeout_ms: int,
    backoff: Backoff | None,
    strict: bool,
) -> None:
    """Add a job; prints its id. Everything is checked before anything is written."""
    data = parse_payload(payload)
    if at_text is not None and in_ms is not None:
        raise BadInput("give --at or --in, not both")
    run_at: datetime | None = None
    if at_text is not None:
        try:
            run_at = parse_at(at_text)
        except BadArgument as exc:
            raise BadInput(str(exc)) from None
    client = connect(url)
    # A job accepted by a server that can drop it would make the returned id a false promise.
    check_or_warn(client, strict=strict, log=lambda m: click.echo(safe(f"warning: {m}"), err=True))
    job_id = Queue(client, queue).enqueue(
        task,
        data,
        run_at=run_at,
        delay_ms=in_ms,
        key=key,
        max_attempts=max_attempts,
        timeout_ms=timeout_ms,
        backoff=backoff,
    )
    if as_json:
        emit_json({"id": job_id, "queue": queue, "task": task})
    else:
        click.echo(job_id)
