"""Plumbing shared by the operator commands: connection and queue options, exit codes, the
mapping of errors to them, durations, and output (JSON for scripts, rich for people)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from scheduler.admin.inspection import discover_queues, queue_exists, server_now_ms
from scheduler.admin.startup import OPERATOR_ROLE_HINT, is_permission_error, permission_message
from scheduler.core import exits
from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import parse_backoff_text
from scheduler.core.errors import BadArgument, JobNotFound, SchedulerError
from scheduler.core.keys import QueueKeys, check_queue_name
from scheduler.core.safety import clean, redact, safe, visible_bytes

# The one default for every command (the worker too); REDIS_URL overrides it.
DEFAULT_URL = "redis://localhost:6379/0"
# The one table (scheduler/core/exits.py), under the CLI's names.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = exits.EXIT_OK, exits.EXIT_FAILED, exits.EXIT_USAGE
EXIT_UNREACHABLE, EXIT_FORBIDDEN = exits.EXIT_UNREACHABLE, exits.EXIT_FORBIDDEN
EXIT_FINDINGS = EXIT_FAILED
EXIT_CODES_HELP = "\b\nExit codes (every command, the worker too):\n" + "\n".join(
    f"  {code:>3}  {meaning}" for code, meaning in exits.EXIT_CODES
)
F = TypeVar("F", bound=Callable[..., Any])


class Refused(click.ClickException):
    exit_code = EXIT_FINDINGS


class BadInput(click.ClickException):
    exit_code = EXIT_USAGE


class Unreachable(click.ClickException):
    exit_code = EXIT_UNREACHABLE


class Forbidden(click.ClickException):
    exit_code = EXIT_FORBIDDEN


class AdminCommand(click.Command):
    """Maps the package's errors to the documented exit codes with a one-line message."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadArgument as exc:
            raise BadInput(safe(exc)) from None
        except JobNotFound as exc:
            raise Refused(safe(exc)) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unreachable(safe(f"cannot reach Redis: {exc}")) from None
        except redis.ResponseError as exc:
            if is_permission_error(exc):
                raise Forbidden(permission_message(exc, OPERATOR_ROLE_HINT)) from None
            raise Refused(safe(f"Redis refused the command: {exc}")) from None
        except SchedulerError as exc:
            raise Refused(safe(exc)) from None
        except (OverflowError, UnicodeError, ValueError) as exc:
            # Stored fields are untrusted (hand-edited, or written by a hostile producer): a
            # value no reader expects ends the command with one line, not a traceback.
            raise Refused(safe(f"unreadable stored data: {type(exc).__name__}: {exc}")) from None


class AdminGroup(click.Group):
    command_class = AdminCommand
    group_class = type  # sub-groups are AdminGroups too


# -- options ---------------------------------------------------------------------------------
def _check_queue(_: click.Context, __: click.Parameter, value: Any) -> Any:
    names = value if isinstance(value, tuple) else (value,)
    for name in names:
        if name is not None:
            try:
                check_queue_name(name)
            except BadArgument as exc:
                raise click.BadParameter(str(exc)) from None
    return value


def url_option(f: F) -> F:
    return click.option(
        "--url",
        envvar="REDIS_URL",
        default=DEFAULT_URL,
        show_default=True,
        metavar="URL",
        help="Redis URL (redis://, rediss:// for TLS, unix://); env REDIS_URL.",
    )(f)


def queue_option(f: F) -> F:
    return click.option(
        "--queue",
        "-q",
        envvar="SCHEDULER_QUEUE",
        default="default",
        show_default=True,
        callback=_check_queue,
        help="Queue name; env SCHEDULER_QUEUE.",
    )(f)


def queues_option(f: F) -> F:
    return click.option(
        "--queue",
        "-q",
        "queues",
        multiple=True,
        callback=_check_queue,
        help="Queue name (repeatable); default: every queue found with SCAN.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(f)


def parse_backoff(text: str) -> Backoff:
    """'base_ms,factor,cap_ms,jitter' (e.g. '1000,2,3600000,0.25') -> Backoff. BadArgument."""
    # The one backoff reader (core/backoff_text.py), spaces around the commas allowed.
    return parse_backoff_text(",".join(p.strip() for p in text.split(",")))


class BackoffParam(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.3
    name = "BASE_MS,FACTOR,CAP_MS,JITTER"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Backoff:
        if isinstance(value, Backoff):
            return value
        try:
            return parse_backoff(str(value))
        except BadArgument as exc:
            self.fail(str(exc), param, ctx)


def backoff_option(f: F) -> F:
    return click.option(
        "--backoff",
        type=BackoffParam(),
        default=None,
        help="Retry delays: base_ms,factor,cap_ms,jitter (default 1000,2,3600000,0.25).",
    )(f)


def timeout_option(f: F) -> F:
    return click.option(
        "--timeout-ms",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="A run longer than this is stopped and retried (0: no timeout).",
    )(f)


# -- durations and times ---------------------------------------------------------------------
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """'30s', '5m', '1h30m', '250ms', '2d' -> milliseconds. Raises BadArgument."""
    t = text.strip()
    if t.startswith("-"):
        raise BadArgument(f"invalid duration {text!r}: negative durations are refused")
    if not t or _DURATION_PART.sub("", t) != "":
        raise BadArgument(f"invalid duration {text!r}: use e.g. 30s, 5m, 1h30m, 250ms, 2d")
    return sum(int(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(t))


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.3
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_duration_ms(str(value))
        except BadArgument as exc:
            self.fail(str(exc), param, ctx)


def parse_at(text: str) -> datetime:
    """An ISO 8601 time with an offset ('2030-01-01T09:00:00+01:00' or '...Z')."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise BadArgument(
            f"invalid time {text!r}: use ISO 8601, e.g. 2030-01-01T09:00:00Z"
        ) from None
    if at.tzinfo is None:
        raise BadArgument(f"time {text!r} has no UTC offset: add Z or +HH:MM (it is ambiguous)")
    return at


def fmt_ms(ms: int | None) -> str:
    """A duration for people: 850ms, 42s, 3m07s, 2h05m, 3d04h."""
    if ms is None:
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms}ms"
    s = ms // 1000
    if s < 60:
        return f"{sign}{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{sign}{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{sign}{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{sign}{d}d{h:02d}h"


def fmt_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):  # a hand-written time beyond year 9999
        return f"{ms} (out of range)"


# -- connection and output -------------------------------------------------------------------
def connect(url: str, *, encoding_errors: str = "backslashreplace") -> redis.Redis:
    """A client that fails fast (exit 3) when the server does not answer. Stored bytes that are
    not UTF-8 are read as escapes (`\\xff`) instead of failing the command; the doctor reads
    them with 'surrogateescape' to find them (and write their keys back exactly)."""
    try:
        client = redis.Redis.from_url(
            url,
            decode_responses=True,
            encoding_errors=encoding_errors,
            socket_connect_timeout=5,
            socket_timeout=30,
        )
    except ValueError as exc:
        raise BadInput(safe(f"invalid --url {redact(url)}: {exc}")) from None
    client.ping()
    return client


def require_queue(client: redis.Redis, queue: str) -> QueueKeys:
    """Refuse (exit 1) a well-formed name with no keys at all: most likely a typo. Every
    command that reads or changes an existing queue calls this (only enqueue and the worker
    create queues), so a typo is the same refusal everywhere."""
    keys = QueueKeys(queue)
    if not queue_exists(client, keys, server_now_ms(client)):
        known = ", ".join(discover_queues(client)[:20]) or "none"
        raise Refused(f"no queue named {queue!r} (no keys under {keys.pattern()}); known: {known}")
    return keys


def resolve_queues(client: redis.Redis, given: tuple[str, ...]) -> list[str]:
    if given:
        for name in given:
            require_queue(client, name)
        return list(dict.fromkeys(given))
    return discover_queues(client)


def emit_json(data: Any) -> None:
    """ensure_ascii (the default) writes every control character as \\uXXXX: nothing raw."""
    text = json.dumps(visible_bytes(data), indent=2, sort_keys=True, default=str)
    click.echo(text)


def cell(value: object, *, keep_newlines: bool = False) -> Text:
    """A table cell or line from stored (untrusted) text: control characters escaped, and a
    Text, not a markup string, so '[bold]' or a stray '[/]' is shown, never interpreted."""
    return Text(clean(value, keep_newlines=keep_newlines))


def markup_safe(value: object) -> str:
    """Untrusted text to embed in a rich markup string (a title, a status line)."""
    return escape(clean(value))


PIPE_WIDTH = 160  # a table sent to a pipe or file: wide enough for whole ids and messages


def console(*, stderr: bool = False) -> Console:
    """Made per call so it writes to the stream click has in place (CliRunner swaps them).
    Not a terminal and no COLUMNS: PIPE_WIDTH, not rich's 80, so `| grep` sees whole rows."""
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty() and not os.environ.get("COLUMNS", "").isdigit():
        width = PIPE_WIDTH
    return Console(file=stream, highlight=False, soft_wrap=False, width=width)


def id_column(table: Table, name: str, ids: Iterable[object]) -> None:
    """An id column that never folds or truncates: as wide as its longest id (ids are what an
    operator copies into the next command); the other columns wrap by word around it."""
    width = max((len(clean(i)) for i in ids), default=len(name))
    table.add_column(name, no_wrap=True, min_width=max(width, len(name)))


def decoded_payload(raw: str | None) -> tuple[Any, str | None]:
    """(payload, error): a hand-edited payload is shown raw with the decode error."""
    if raw is None:
        return None, "missing"
    try:
        return json.loads(raw), None
    except ValueError as exc:
        return raw, f"not JSON: {exc}"
