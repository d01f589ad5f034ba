"""`scheduler pause` and `scheduler resume`: stop and restart the claims of a whole queue
(Queue.pause / Queue.resume; a partitioned queue: every partition); paused_note, what the
commands that make a job due say of a paused queue."""

from __future__ import annotations

from collections.abc import Mapping

import click
import redis

from scheduler.cli import queue_move
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    AdminCommand,
    connect,
    emit_json,
    json_option,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.client.partitioned import PartitionedQueue, open_queue
from scheduler.client.queue import Queue
from scheduler.core.safety import clean


def register(main: click.Group) -> None:
    main.add_command(pause)
    main.add_command(resume)
    queue_move.register(main)  # `scheduler queue move`


def paused_note(q: Queue | PartitionedQueue, queue: str, schedule: str = "") -> str:
    """What `schedules run` and `jobs reschedule` add when the job's queue (`q`; a
    partitioned one: the partition of `schedule`) is paused: made due, it still waits for a
    resume, as the dashboard's notice says. '' when it is not paused, or the pause cannot be
    read: the job is made or moved either way, and a note is no reason to fail the command."""
    if isinstance(q, PartitionedQueue):
        q = q._sched(schedule)
    try:  # any paused_ms is a pause (lua/claim.lua), one written by hand too
        paused = q.client.hexists(q.keys.config, "paused_ms")
    except (redis.RedisError, OSError):  # a config of another type, its node gone since
        return ""
    if not paused:
        return ""
    where = "the queue" if q.name == queue else f"its partition {q.name}"
    return clean(f"{where} is paused: it runs once the queue is resumed (scheduler resume -q "
                 f"{queue})")  # fmt: skip


def emit_noted(data: Mapping[str, object], line: str, note: str, as_json: bool) -> None:
    """A command's answer (`data` as JSON, else `line`) and paused_note's `note`: on stderr
    after the line (stdout stays the id or status scripts read), or `queue_paused` in the JSON
    (only when paused: the answer's fields are otherwise as before)."""
    if as_json:
        emit_json({**data, "queue_paused": True} if note else dict(data))
        return
    click.echo(line)
    if note:
        click.echo(f"note: {note}", err=True)


def _act(action: str, url: str, queue: str, as_json: bool) -> None:
    client = connect(url)
    require_queue(client, queue)  # a typo refuses (exit 1) as in every other command
    q = open_queue(client, queue)
    status = q.pause() if action == "pause" else q.resume()
    if as_json:
        emit_json({"queue": queue, "status": status})
    else:
        click.echo(clean(f"{queue}: {status}"))


@click.command(cls=AdminCommand, epilog=EXIT_CODES_HELP)
@url_option
@queue_option
@json_option
def pause(url: str, queue: str, as_json: bool) -> None:
    """Pause a queue: no worker claims its jobs until `scheduler resume`. Jobs are still
    accepted and wait; jobs already running finish. Prints `paused`, or `already`."""
    _act("pause", url, queue, as_json)


@click.command(cls=AdminCommand, epilog=EXIT_CODES_HELP)
@url_option
@queue_option
@json_option
def resume(url: str, queue: str, as_json: bool) -> None:
    """Resume a paused queue: workers claim again at once. Prints `resumed`, or `active` (it
    was not paused)."""
    _act("resume", url, queue, as_json)
