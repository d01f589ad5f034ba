"""`scheduler pause` and `scheduler resume`: stop and restart the claims of a whole queue
(Queue.pause / Queue.resume; a partitioned queue: every partition)."""

from __future__ import annotations

import click

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
from scheduler.client.partitioned import open_queue
from scheduler.core.safety import clean


def register(main: click.Group) -> None:
    main.add_command(pause)
    main.add_command(resume)
    queue_move.register(main)  # `scheduler queue move`


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
