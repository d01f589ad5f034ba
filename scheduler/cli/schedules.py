"""`scheduler schedules list | add | pause | resume | remove | run`: operate recurring
schedules.

The commands share cli.common's connection, error mapping, exit codes, unknown-queue refusal
and JSON shape (a refused ACL command is one line and exit 5, not a traceback); schedule
fields are stored data, so they are printed escaped."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click
from croniter import croniter

from scheduler.cli.common import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    AdminGroup,
    BadInput,
    Duration,
    backoff_option,
    connect,
    decoded_payload,
    emit_json,
    fmt_time,
    json_option,
    queue_option,
    require_queue,
    timeout_option,
    url_option,
)
from scheduler.cli.dead_view import exit_unread, unread_field
from scheduler.cli.enqueue import checked_offline
from scheduler.cli.jobs import parse_payload
from scheduler.cli.output import duration_option
from scheduler.cli.pausing import emit_noted, paused_note
from scheduler.client.partitioned import PartitionedQueue, open_queue, unread
from scheduler.client.queue import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, ScheduleNotFound
from scheduler.core.keys import QueueKeys
from scheduler.core.safety import clean
from scheduler.operations.ops import Ops, Settings
from scheduler.operations.schedules import NO_DEFINITION
from scheduler.schedules.recurring import Schedule, check_schedule_name

# croniter's field order: 5 fields, or 6 with seconds last.
_CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
    ("second", 0, 59),
)


def cron_field_error(expr: str) -> str | None:
    """The first number out of its field's range, named ('minute field: 61 is out of range
    0-59'), or None. Only numbers are checked here; everything else (names, the "valid but
    never fires" case like '0 9 30 2 *') is judged by the schedules module."""
    for field, (name, low, high) in zip(expr.split(), _CRON_FIELDS, strict=False):
        for part in field.split(","):
            for number in part.split("/", 1)[0].split("-"):
                # ASCII only: '²'.isdigit() is True, but int('²') raises.
                if number.isascii() and number.isdigit() and not low <= int(number) <= high:
                    return f"{name} field: {number} is out of range {low}-{high}"
    return None


def _queue(url: str, name: str) -> Queue | PartitionedQueue:
    client = connect(url)
    require_queue(client, name)  # a typo refuses (exit 1) as in every other command
    return open_queue(client, name)  # a partitioned queue: each schedule in its partition


def _schedules(q: Queue | PartitionedQueue) -> tuple[list[Schedule], list[str]]:
    """The queue's schedules by name, and the partitions not read (their node down). A name
    whose hash is of another type or gone (edited by hand) is listed flagged `unreadable`."""
    if isinstance(q, Queue):
        return q._run(q.ops.list_schedules(flagged=True)), []
    each = q.run_answering(lambda p: p.ops.list_schedules(flagged=True))
    found = [s for r in each if not isinstance(r, BaseException) for s in r]
    return sorted(found, key=lambda s: s.name), unread(q.parts, each)


def _local(s: Schedule) -> str:
    """The next run in the schedule's own time zone too (its cron is matched there)."""
    if s.kind != "cron" or not s.tz or s.tz == "UTC" or s.next_run_ms is None:
        return ""
    try:
        at = datetime.fromtimestamp(s.next_run_ms / 1000, tz=ZoneInfo(s.tz))
    except (ValueError, OverflowError, OSError, LookupError):  # a hand-edited tz or time
        return ""
    return f" ({at.isoformat(timespec='seconds')} {s.tz})"


def _line(s: Schedule) -> str:
    if s.unreadable in NO_DEFINITION:  # no definition at all: no rule to print
        return clean(f"{s.name}  UNREADABLE {s.unreadable} (edited by hand?): see doctor")
    rule = f"cron '{s.cron}' {s.tz}" if s.kind == "cron" else f"every {s.every_ms} ms"
    state = "paused" if s.paused else f"next {fmt_time(s.next_run_ms)}{_local(s)}"
    if s.unreadable:  # the scripts read it as absent: nothing arms its runs
        state = f"UNREADABLE {s.unreadable} (edited by hand?): runs stopped, see doctor"
    elif s.flow_unreadable:  # its runs still come, without that part of their flow
        state += f"  flow field {s.flow_unreadable} UNREADABLE (edited by hand?): see doctor"
    # The start window only when set: a schedule without one lists as before.
    window = "" if s.start_within_ms is None else f"  start-within {s.start_within_ms}ms"
    return clean(
        f"{s.name}  {s.task}  {rule}  jitter+{s.offset_ms}ms  {s.misfire}{window}  {state}"
    )


def schedule_json(s: Schedule) -> dict[str, Any]:
    data = s.as_dict()
    data["payload"], data["payload_error"] = decoded_payload(s.payload_json)
    return data


def _options(f: click.decorators.FC) -> click.decorators.FC:
    return url_option(queue_option(json_option(f)))


def _act(action: str, url: str, queue: str, name: str, as_json: bool) -> None:
    check_schedule_name(name)  # bad input (exit 2) before the queue is looked up
    q = _queue(url, queue)
    status = getattr(q, f"{action}_schedule")(name)  # BadArgument: exit 2 (AdminCommand)
    if as_json:
        emit_json({"queue": queue, "schedule": name, "status": status})
    else:
        click.echo(clean(f"{name}: {status}"))
    if status == "missing":
        raise SystemExit(EXIT_FAILED)


def register(main: click.Group) -> None:
    @main.group("schedules", cls=AdminGroup, epilog=EXIT_CODES_HELP)
    def schedules() -> None:
        """Recurring schedules: list, add (or redefine), pause, resume, remove, run now."""

    @schedules.command("list")
    @_options
    def list_cmd(url: str, queue: str, as_json: bool) -> None:
        """Every schedule of the queue with its next run. A partitioned queue's partition
        whose node does not answer is named (`not read: ...` on stderr, --json's
        `unreachable`) and the others' schedules listed, exit 3."""
        found, not_read = _schedules(_queue(url, queue))
        if as_json:
            rows = [schedule_json(s) for s in found]
            emit_json({"queue": queue, "schedules": rows, **unread_field(not_read)})
        else:
            for s in found:
                click.echo(_line(s))
            if not found:
                click.echo("no schedules")
        exit_unread(not_read)

    @schedules.command("add")
    @click.argument("name")
    @click.argument("task")
    @_options
    @click.option(
        "--cron",
        help="5 fields (a 6th, seconds, goes last: '* * * * * */10' is every 10 s), matched "
        "in --tz: '0 9 * * 1-5'.",
    )
    @duration_option("--every", "An epoch-aligned interval: 30s, 5m, 1h.", minimum_ms=1)
    @click.option("--tz", help="Time zone of --cron (IANA name; default UTC).")
    @click.option("--payload", default="null", show_default=True, help="Each run's JSON payload.")
    @duration_option(
        "--jitter", "A fixed offset in [0, this] spreads 'on the hour' load.", default=0
    )
    @click.option(
        "--misfire",
        default="run_once",
        show_default=True,
        help="Runs missed while nothing claimed: skip (none), run_once (the latest), catch_up:N "
        "(the latest N, in order; N up to 1000).",
    )
    @click.option(
        "--start-within",
        "start_within_ms",
        type=Duration(),
        help="Start each run within this long of its run time or not at all (parked: start "
        "deadline passed); the next run still comes.",
    )
    @click.option(
        "--max-attempts",
        type=click.IntRange(min=1),
        default=5,
        show_default=True,
        help="Attempts of each run, the first included, before it is parked as dead.",
    )
    @timeout_option
    @backoff_option
    @click.option("--priority", type=int, default=0, show_default=True, help="0..9, each run.")
    @click.option("--concurrency-key", help="At most --concurrency-limit runs of this key at once.")
    @click.option("--concurrency-limit", type=int, help="Leased at once per --concurrency-key.")
    @click.option("--rate-limit", help="N starts per window, e.g. 10/1s or 100/m.")
    @click.option("--rate-key", help="What --rate-limit counts (default: the task name).")
    def add_cmd(
        name: str,
        task: str,
        url: str,
        queue: str,
        as_json: bool,
        cron: str | None,
        every_ms: int | None,
        tz: str | None,
        payload: str,
        jitter_ms: int,
        misfire: str,
        start_within_ms: int | None,
        max_attempts: int,
        timeout_ms: int,
        backoff: Backoff | None,
        priority: int,
        concurrency_key: str | None,
        concurrency_limit: int | None,
        rate_limit: str | None,
        rate_key: str | None,
    ) -> None:
        """Create or redefine schedule NAME running TASK (--cron or --every). Prints
        created, updated, unchanged or repaired. Everything is checked before anything is
        written. The flow options (as for enqueue) apply to every run."""
        data = parse_payload(payload)
        if (cron is None) == (every_ms is None):
            raise click.UsageError("give --cron or --every (one of them)")
        problem = None if cron is None else cron_field_error(cron)
        if problem:
            raise click.BadParameter(f"{cron!r}: {problem}", param_hint="--cron")
        definition: dict[str, Any] = dict(
            cron=cron, every_ms=every_ms, tz=tz, jitter_ms=jitter_ms, misfire=misfire,
            max_attempts=max_attempts, backoff=backoff, timeout_ms=timeout_ms, priority=priority,
            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
            rate_limit=rate_limit, rate_key=rate_key, start_within_ms=start_within_ms,
        )  # fmt: skip
        try:  # checked before connecting: a bad value is exit 2 also while Redis is down
            checked_offline(
                Ops(QueueKeys(queue), Settings()).schedule(name, task, data, **definition)
            )
            q = open_queue(connect(url), queue)  # a new queue is fine: as enqueue, this creates
            status = q.schedule(name, task, data, **definition)
        except (BadArgument, BadInput) as exc:
            # croniter accepts '0 9 30 2 *' but finds no date: say so, not "malformed".
            if cron is not None and "malformed cron" in str(exc) and croniter.is_valid(cron):
                msg = f"cron {cron!r} is valid but never fires: no date matches it"
                raise BadInput(msg) from None
            raise
        if as_json:
            emit_json({"queue": queue, "schedule": name, "status": status})
        else:
            click.echo(clean(f"{name}: {status}"))

    @schedules.command("pause")
    @click.argument("name")
    @_options
    def pause_cmd(name: str, url: str, queue: str, as_json: bool) -> None:
        """Stop a schedule; its pending run is withdrawn (a running one finishes)."""
        _act("pause", url, queue, name, as_json)

    @schedules.command("resume")
    @click.argument("name")
    @_options
    def resume_cmd(name: str, url: str, queue: str, as_json: bool) -> None:
        """Restart a paused schedule at its next future time."""
        _act("resume", url, queue, name, as_json)

    @schedules.command("remove")
    @click.argument("name")
    @_options
    def remove_cmd(name: str, url: str, queue: str, as_json: bool) -> None:
        """Delete a schedule and its pending run."""
        _act("remove", url, queue, name, as_json)

    @schedules.command("run")
    @click.argument("name")
    @_options
    def run_cmd(name: str, url: str, queue: str, as_json: bool) -> None:
        """Run a schedule once now, beside its own runs: one job due now with its task,
        payload and options. Its next run, paused state and counters stay (a paused schedule
        runs too). Prints the new job's id."""
        check_schedule_name(name)  # bad input (exit 2) before the queue is looked up
        q = _queue(url, queue)
        try:
            job_id = q.run_schedule_now(name)
        except ScheduleNotFound:  # as pause / resume / remove answer it: exit 1
            if as_json:
                emit_json({"queue": queue, "schedule": name, "status": "missing"})
            else:
                click.echo(clean(f"{name}: missing"))
            raise SystemExit(EXIT_FAILED) from None
        data = {"queue": queue, "schedule": name, "status": "created", "job_id": job_id}
        emit_noted(data, job_id, paused_note(q, queue, name), as_json)  # a paused queue: said
