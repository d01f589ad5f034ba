"""Plumbing shared by the operator commands: connection and queue options, exit codes and the
mapping of errors to them. Durations, times and output live in cli/output.py; every command
imports both from here (`__all__`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
import redis
from redis.exceptions import ClusterError, RedisClusterException, TryAgainError

from scheduler.admin.inspection import (
    logical_queues,
    physical_queues,
    queue_exists,
    server_now_ms,
    stored_layout,
)
from scheduler.admin.startup import (
    OPERATOR_ROLE_HINT,
    is_permission_error,
    queues_where,
    refusal_line,
    url_refusal,
)
from scheduler.cli.output import (
    PIPE_WIDTH,
    Duration,
    Seconds,
    cell,
    console,
    decoded_payload,
    emit_json,
    fmt_attempts,
    fmt_ms,
    fmt_time,
    id_column,
    markup_safe,
    parse_at,
    parse_duration_ms,
    timeout_option,
)
from scheduler.core import connection, errors, exits
from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import parse_backoff_text
from scheduler.core.errors import (
    BadArgument,
    SchedulerError,
    UnreadableRecord,
    cluster_refusal,
    edited_by_hand,
    refused_for_now,
)
from scheduler.core.keys import QueueKeys, check_queue_name
from scheduler.core.partitions import PARTITION_NAME
from scheduler.core.safety import redact, safe

__all__ = [
    "DEFAULT_URL", "EXIT_CODES_HELP", "EXIT_FAILED", "EXIT_FINDINGS", "EXIT_FORBIDDEN", "EXIT_OK",
    "EXIT_UNREACHABLE", "EXIT_USAGE", "PIPE_WIDTH", "AdminCommand", "AdminGroup", "BackoffParam",
    "BadInput", "Duration", "Forbidden", "Refused", "Seconds", "Unreachable", "backoff_option",
    "cell", "connect", "console", "decoded_payload", "emit_json", "fmt_attempts", "fmt_ms",
    "fmt_time", "id_column", "json_option", "markup_safe", "parse_at", "parse_backoff",
    "parse_duration_ms", "physical_queues", "queue_option", "queues_option", "require_queue",
    "resolve_queues", "timeout_option", "url_option",
]  # fmt: skip

# The one default for every command (the worker too); REDIS_URL overrides it.
DEFAULT_URL = "redis://localhost:6379/0"
# The one table (scheduler/core/exits.py), under the CLI's names.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = exits.EXIT_OK, exits.EXIT_FAILED, exits.EXIT_USAGE
EXIT_UNREACHABLE, EXIT_FORBIDDEN = exits.EXIT_UNREACHABLE, exits.EXIT_FORBIDDEN
EXIT_FINDINGS = EXIT_FAILED
EXIT_CODES_HELP = exits.EXIT_CODES_HELP
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
        except UnreadableRecord as exc:  # the stored data is at fault, not the command line
            raise Refused(safe(f"unreadable stored data: {exc}")) from None
        except BadArgument as exc:
            raise BadInput(safe(exc)) from None
        except redis.AuthenticationError as exc:  # a ConnectionError, but retrying cannot help
            raise Forbidden(refusal_line(exc, OPERATOR_ROLE_HINT)) from None
        except redis.InvalidResponse as exc:  # not a ConnectionError: a service, but not Redis
            why = f"{ctx.params.get('url')} did not answer as a Redis server ({exc})"
            raise Unreachable(safe(f"cannot reach Redis: {why}")) from None
        except (redis.ConnectionError, redis.TimeoutError, TryAgainError, ClusterError) as exc:
            if (wrong := url_refusal(exc, ctx.params.get("url"))) is not None:  # a certificate
                raise BadInput(wrong) from None  # refused: every try alike, no "try again" (3)
            raise Unreachable(safe(errors.unreachable_text(exc, ctx.params))) from None
        except RedisClusterException as exc:  # not ResponseErrors (nor ClusterError: above)
            if (refusal := cluster_refusal(exc)) is not None:  # the login or CLUSTER SLOTS
                raise Forbidden(refusal_line(refusal, OPERATOR_ROLE_HINT, _where(ctx))) from None
            if (wrong := url_refusal(exc, ctx.params.get("url"))) is not None:
                raise BadInput(wrong) from None
            if not connection.cluster_unreachable(exc):  # cross-slot, ...: a bug, its traceback
                raise
            raise Unreachable(safe(f"cannot reach Redis: {exc}")) from None
        except redis.ResponseError as exc:
            if is_permission_error(exc):
                raise Forbidden(refusal_line(exc, OPERATOR_ROLE_HINT, _where(ctx))) from None
            if (wrong := url_refusal(exc, ctx.params.get("url"))) is not None:  # ?db=99, MOVED
                raise BadInput(wrong) from None
            if refused_for_now(exc):  # OOM, NOREPLICAS, READONLY, ...: a retry may pass
                raise Unreachable(safe(f"Redis refused the command for now: {exc}")) from None
            hand = edited_by_hand(exc) and "scheduler doctor" not in str(exc)  # not said yet
            hint = "; a key edited by hand? `scheduler doctor`" if hand else ""
            raise Refused(safe(f"Redis refused the command: {exc}{hint}")) from None
        except SchedulerError as exc:  # JobNotFound, ...
            raise Refused(safe(exc)) from None
        except (OverflowError, UnicodeError, ValueError) as exc:
            # Stored fields are untrusted (hand edits, hostile producers): one line, no traceback.
            raise Refused(safe(f"unreadable stored data: {type(exc).__name__}: {exc}")) from None


def _where(ctx: click.Context) -> str:
    """The queues the command was given (-q), for a key's refusal: the one clue to which."""
    given = ctx.params.get("queues") or ctx.params.get("queue") or ()
    return queues_where([given] if isinstance(given, str) else list(given))


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
        help="Redis URL (redis://, rediss:// for TLS, unix://; Cluster: redis+cluster://h:p,h:p/"
        " or ?cluster=1; Sentinel: redis+sentinel://h:p,h:p/service_name); env REDIS_URL.",
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
        help="Queue name (repeatable); default: every queue in the queue index (sched:queues).",
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


# -- connection and output -------------------------------------------------------------------
def connect(url: str, *, encoding_errors: str = "backslashreplace") -> redis.Redis:
    """A client that fails fast (exit 3) when the server does not answer, closed with the
    command's context (an in-process invoke leaves no socket to the garbage collector). Bytes
    not UTF-8 read as escapes (`\\xff`); the doctor's 'surrogateescape' finds them."""
    try:
        client = connection.connect(
            url,
            decode_responses=True,
            encoding_errors=encoding_errors,
            socket_connect_timeout=5,
            socket_timeout=30,
        )
    except (BadArgument, ValueError) as exc:  # ValueError: redis-py's own URL refusals
        # Our refusals name the URL already ('invalid Redis URL <url>: why'): named once.
        why = str(exc).removeprefix(f"invalid Redis URL {redact(url)}: ")
        raise BadInput(safe(f"invalid --url {redact(url)}: {why}")) from None
    except redis.RedisClusterException as exc:  # no seed node answered CLUSTER SLOTS
        if cluster_refusal(exc) is not None or url_refusal(exc, url) is not None:
            raise  # a refused login or CLUSTER SLOTS (exit 5), certificate (2): AdminCommand's
        raise Unreachable(safe(f"cannot reach the Redis Cluster {redact(url)}: {exc}")) from None
    if (ctx := click.get_current_context(silent=True)) is not None:
        ctx.call_on_close(client.close)
    client.ping()
    return client


def _listed_partition(client: redis.Redis, queue: str) -> bool:
    """`queue` is a partition its queue's layout lists: one even with no keys yet (the CLI's
    refusals of a partitioned name and the doctor's fixes name every partition)."""
    if not (m := PARTITION_NAME.match(queue)):
        return False
    try:
        layout = stored_layout(client, m.group(1))
    except BadArgument:  # a record this version cannot read: not known to be one
        return False
    return layout is not None and queue in layout.names


def require_queue(client: redis.Redis, queue: str) -> QueueKeys:
    """Refuse (exit 1) a well-formed name with no keys at all: most likely a typo. Every
    command that reads or changes an existing queue calls this (only enqueue and the worker
    create queues), so a typo is the same refusal everywhere."""
    keys = QueueKeys(queue)
    try:
        if stored_layout(client, queue) is not None:
            return keys  # a partitioned queue: its jobs live in its partitions' keys
    except UnreadableRecord:
        return keys  # its (damaged) record is a key of it: what reads it next says what is wrong
    if not queue_exists(client, keys, server_now_ms(client, keys)):
        if _listed_partition(client, queue):
            return keys  # an empty partition: the advice for a partitioned name names each
        named = logical_queues(client, [])  # a cluster node down: the others' queues
        if queue in named:  # only other keys of it are left (specs, flow sets): doctor's case
            return keys
        known = ", ".join(named[:20]) or "none"
        raise Refused(f"no queue named {queue!r} (no keys under {keys.pattern()}); known: {known}")
    return keys


def resolve_queues(
    client: redis.Redis, given: tuple[str, ...], unreachable: list[str] | None = None
) -> list[str]:
    """The queues named, each checked to exist, else every queue found (`unreachable`: see
    inspection.discover_queues)."""
    if given:
        for name in given:
            require_queue(client, name)
        return list(dict.fromkeys(given))
    return logical_queues(client, unreachable)
