"""`scheduler schedules list | pause | resume | remove`: operate recurring schedules."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
import redis

from scheduler.errors import BadArgument
from scheduler.queue import Queue
from scheduler.recurring import Schedule

_DEFAULT_URL = "redis://127.0.0.1:6379/0"


def _queue(url: str, name: str) -> Queue:
    try:
        return Queue.from_url(url, name)
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _line(s: Schedule) -> str:
    rule = f"cron '{s.cron}' {s.tz}" if s.kind == "cron" else f"every {s.every_ms} ms"
    state = "paused" if s.paused else f"next {_when(s.next_run_ms)}"
    return f"{s.name}  {s.task}  {rule}  jitter+{s.offset_ms}ms  {s.misfire}  {state}"


def _options(f: click.decorators.FC) -> click.decorators.FC:
    f = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)
    f = click.option("--queue", "-q", default="default", show_default=True, help="Queue name.")(f)
    return click.option(
        "--url", envvar="REDIS_URL", default=_DEFAULT_URL, show_default=True, help="Redis URL."
    )(f)


def _act(action: str, url: str, queue: str, name: str, as_json: bool) -> None:
    q = _queue(url, queue)
    try:
        status = getattr(q, f"{action}_schedule")(name)
    except BadArgument as exc:
        raise click.BadParameter(str(exc)) from None
    except redis.ConnectionError as exc:
        raise click.ClickException(f"cannot reach Redis: {exc}") from None
    if as_json:
        click.echo(json.dumps({"schedule": name, "status": status}))
    else:
        click.echo(f"{name}: {status}")
    if status == "missing":
        raise SystemExit(1)


def register(main: click.Group) -> None:
    @main.group("schedules")
    def schedules() -> None:
        """Recurring schedules (created in code with Queue.schedule)."""

    @schedules.command("list")
    @_options
    def list_cmd(url: str, queue: str, as_json: bool) -> None:
        """Every schedule of the queue with its next run."""
        try:
            found = _queue(url, queue).list_schedules()
        except redis.ConnectionError as exc:
            raise click.ClickException(f"cannot reach Redis: {exc}") from None
        if as_json:
            click.echo(json.dumps([s.as_dict() for s in found]))
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
