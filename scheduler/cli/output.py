"""The CLI's text in and out: durations, seconds and times (parsed and shown; the --timeout
options), and the output helpers that keep stored (untrusted) text inert on a terminal: JSON,
table cells, the console."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import IO, Any, TypeVar

import click
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from scheduler.core.errors import BadArgument
from scheduler.core.safety import clean, visible_bytes

F = TypeVar("F", bound=Callable[..., Any])

# -- durations and times ---------------------------------------------------------------------
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d)", re.ASCII)  # ASCII digits only
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


def _timeout_given(ctx: click.Context, name: str, value: int | None) -> int | None:
    # --timeout (a duration) and --timeout-ms (ms) set one value; an option not on the command
    # line is processed after those that are, so the given one is always seen first.
    if value is None:
        return None
    other = ctx.meta.setdefault("timeout_option", name)
    if other != name:
        raise click.UsageError("give --timeout or --timeout-ms, not both")
    ctx.meta["timeout_ms"] = value
    return value


def timeout_option(f: F) -> F:
    def ms(ctx: click.Context, _: click.Parameter, value: int | None) -> int:
        if _timeout_given(ctx, "--timeout-ms", value) is None:
            return int(ctx.meta.get("timeout_ms", 0))
        return int(value or 0)

    def duration(ctx: click.Context, _: click.Parameter, value: int | None) -> None:
        _timeout_given(ctx, "--timeout", value)

    f = click.option(
        "--timeout-ms",
        type=click.IntRange(min=0),
        default=None,
        callback=ms,
        help="A run longer than this many ms is stopped and retried (0, the default: the task's "
        "timeout_s, else none).",
    )(f)
    return click.option(
        "--timeout",
        type=Duration(),
        expose_value=False,
        callback=duration,
        help="--timeout-ms as a duration: 30s, 5m, 1h.",
    )(f)


def duration_option(
    name: str, help: str, *, minimum_ms: int = 0, default: int | None = None
) -> Callable[[F], F]:
    """`name` (`--every`) as a Duration (30s, 5m), and `name`-ms (`--every-ms`), its older
    spelling in ms, hidden and still working: one value, `<name>_ms` in ms (`default` when
    neither is given). Both given is a usage error, under `minimum_ms` a bad value (exit 2)."""
    old, dest = f"{name}-ms", name.lstrip("-").replace("-", "_") + "_ms"
    key = f"duration_option:{dest}"

    def given(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
        # As --timeout: an option not on the command line is processed after those that are,
        # so a given one is always seen first.
        if value is not None:
            if ctx.meta.setdefault(key, param.opts[0]) != param.opts[0]:
                raise click.UsageError(f"give {name} or {old}, not both")
            if value < minimum_ms:
                msg = f"must be at least {fmt_ms(minimum_ms)}, got {fmt_ms(value)}"
                raise click.BadParameter(msg, ctx, param)
            ctx.meta[f"{key}:ms"] = value
        return ctx.meta.get(f"{key}:ms", default)

    def decorate(f: F) -> F:
        f = click.option(
            old, dest, type=click.IntRange(min=0), hidden=True, callback=given, help=help
        )(f)
        also = f"{help} ({old} N: the same in ms, the older spelling.)"
        return click.option(name, type=Duration(), expose_value=False, callback=given, help=also)(f)

    return decorate


class Seconds(click.FloatRange):
    """A finite number of seconds within [min, max]: FloatRange alone lets nan and inf through
    (every comparison with nan is false), and time.sleep refuses them later, mid-output."""

    name = "SECONDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv


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


def fmt_attempts(row: dict[str, Any]) -> str:
    """'attempts N/M' of a job row; '-' for a count the record does not hold (never 'None')."""
    used, most = (row.get(k) for k in ("attempts", "max_attempts"))
    return f"attempts {'-' if used is None else used}/{'-' if most is None else most}"


def fmt_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):  # a hand-written time beyond year 9999
        return f"{ms} (out of range)"


# -- output ----------------------------------------------------------------------------------
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
    width = PIPE_WIDTH if _widthless(stream) else None
    return Console(file=stream, highlight=False, soft_wrap=False, width=width)


def _widthless(stream: IO[str]) -> bool:
    """A pipe or file has no width of its own (COLUMNS gives one)."""
    return not stream.isatty() and not os.environ.get("COLUMNS", "").isdigit()


_WRAP_MAX = 40  # a wrapping column's width in a widened pipe; a longer word (a URL) may fold


def fits_whole(out: Console, table: Table) -> bool:
    """Whether `table` fits `out` with its no-wrap columns (id_column's) whole and no word of
    the others folded (up to _WRAP_MAX). A pipe or file is widened to fit, with room for each
    wrapping column's text up to _WRAP_MAX (PIPE_WIDTH is only its default), so `| grep` sees
    whole rows; on a terminal or with COLUMNS, False: the caller lays the rows out otherwise."""
    need = room = 1  # the closing border; each column: a border, its padding, its content
    for column in table.columns:
        least = most = max(column.min_width or 0, cell_len(str(column.header)))
        if not column.no_wrap:
            sizes = [Measurement.get(out, out.options, c) for c in column.cells]
            least = max(least, min(max((m.minimum for m in sizes), default=0), _WRAP_MAX))
            most = max(least, min(max((m.maximum for m in sizes), default=0), _WRAP_MAX))
        need, room = need + 3 + least, room + 3 + most
    if need > out.width and _widthless(out.file):
        out.width = room
    return need <= out.width


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
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than it parses
        return raw, f"not JSON: {exc}"
