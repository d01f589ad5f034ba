"""`scheduler schedules list | pause | resume | remove`: operate recurring schedules.

The commands share cli_common's connection, error mapping and exit codes (a refused ACL
command is one line and exit 5, not a traceback); schedule fields are stored data, so they
are printed escaped."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from scheduler.cli.common import EXIT_CODES_HELP, AdminGroup, connect, queue_option, url_option
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from scheduler.core.safety import clean, visible_bytes
from scheduler.schedules.recurring import Schedule


def _queue(url: str, name: str) -> Queue:
    return Queue(connect(url), name)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):  # a hand-written time beyond year 9999
        return f"{ms} (out of range)"


def _line(s: Schedule) -> str:
    rule = f"cron '{s.cron}' {s.tz}" if s.kind == "cron" else f"every {s.every_ms} ms"
    state = "paused" if s.paused else f"next {_when(s.next_run_ms)}"
    return clean(f"{s.name}  {s.task}  {rule}  jitter+{s.offset_ms}ms  {s.misfire}  {state}")


def _options(f: click.decorators.FC) -> click.decorators.FC:
    f = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)
    return url_option(queue_option(f))


def _act(action: str, url: str, queue: str, name: str, as_json: bool) -> None:
    q = _queue(url, queue)
    try:
        status = getattr(q, f"{action}_schedule")(name)
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"schedule": name, "status": status}))
    else:
        click.echo(clean(f"{name}: {status}"))
    if status == "missing":
        raise SystemExit(1)


def register(main: click.Group) -> None:
    @main.group("schedules", cls=AdminGroup, epilog=EXIT_CODES_HELP)
    def schedules() -> None:
        """Recurring schedules (created in code with Queue.schedule)."""

    @schedules.command("list")
    @_options
    def list_cmd(url: str, queue: str, as_json: bool) -> None:
        """Every schedule of the queue with its next run."""
        found = _queue(url, queue).list_schedules()
        if as_json:
            click.echo(json.dumps(visible_bytes([s.as_dict() for s in found])))
            return
        for s in found:
            click.echo(_line(s))
        if not found:
            click.echo("no schedules")

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
