"""`scheduler queue priority-aging`: show or set a queue's `priority_aging_ms`, how long a due job
may be overtaken by higher-priority work before claims serve it in run_at order ahead of every
priority (docs/flow-control.md "Priorities"). Set through `set_priority_aging`: on a partitioned
queue every partition's config, the one each partition's claims read, every one checked before
any is written (`_write`); the logical name's own config is read by no claim, so a field left
there by hand is named, never taken as the value."""

from __future__ import annotations

import re
import shlex
from typing import Any

import click
import redis

from scheduler.admin.redis_cli import connection_flags, with_flags
from scheduler.cli.common import (
    EXIT_CODES_HELP,
    AdminCommand,
    BadInput,
    Refused,
    connect,
    emit_json,
    fmt_ms,
    json_option,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.cli.output import parse_duration_ms
from scheduler.client.partitioned import PartitionedQueue, PartitionsNotReached, open_queue
from scheduler.client.partitioned_merge import not_answering
from scheduler.client.partitioned_partial import per_node_sync
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument, SchedulerError
from scheduler.core.flow import DEFAULT_PRIORITY_AGING_MS
from scheduler.core.keys import QueueKeys
from scheduler.core.limits import MAX_DELAY_MS, stored_int
from scheduler.core.safety import clean, safe
from scheduler.operations.queue_config import AGING_FIELD

_RANGE = f"0 .. {MAX_DELAY_MS} ms (3650 days)"


def _aging_ms(_: click.Context, __: click.Parameter, value: str | None) -> int | None:
    """AGING_MS: whole milliseconds, or a duration with a unit (30s); in the range claim reads
    (lib/flow.lua flow_aging), refused here before anything is read or written."""
    if value is None:
        return None
    text = value.strip()
    if re.fullmatch(r"-[0-9].*", text):
        raise click.BadParameter(f"must be 0 or more, in {_RANGE}, got {value[:40]!r}")
    if text.startswith("-"):  # an option misspelt (unknown options reach AGING_MS)
        raise click.NoSuchOption(text)
    if re.fullmatch(r"[0-9]+", text):  # past the range: the range says so, below
        ms = int(text) if len(text) <= 18 else MAX_DELAY_MS + 1  # int() refuses 4,300 digits
    else:
        try:
            ms = parse_duration_ms(text)
        except BadArgument:
            raise click.BadParameter(
                f"must be a whole number of ms (30000) or a duration (30s, 2m), got {value[:40]!r}"
            ) from None
    if ms > MAX_DELAY_MS:
        raise click.BadParameter(f"must be in {_RANGE}, got {value[:40]!r}")
    return ms


def used_ms(raw: str | None) -> int:
    """What a claim uses for a stored field: the number in range, else the default (unset, or
    not a number claim reads: `scheduler doctor` names that)."""
    ms = stored_int(raw, 0, MAX_DELAY_MS)
    return DEFAULT_PRIORITY_AGING_MS if ms is None else ms


def _describe(ms: int, raw: str | None) -> str:
    if raw is None:
        return f"{ms} ms (the default)"
    if stored_int(raw, 0, MAX_DELAY_MS) is None:
        return (
            f"{ms} ms (the default: the stored {raw[:40]!r} is read as unset; see scheduler doctor)"
        )
    if ms == 0:
        return "0 ms: every due job in run_at order, priorities ignored"
    return f"{ms} ms" + (f" ({fmt_ms(ms)})" if ms >= 1000 else "")


def _text(raw: object) -> str | None:
    return None if raw is None else str(raw)


def _stray(client: redis.Redis, queue: str) -> str | None:
    """The field on a partitioned queue's own config (by hand), read by no claim; a config of
    another type holds none (doctor's finding)."""
    try:
        raw = client.hget(QueueKeys(queue).config, AGING_FIELD)
    except redis.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        return None
    return _text(raw)


@click.command(
    "priority-aging",
    cls=AdminCommand,
    epilog=EXIT_CODES_HELP,
    context_settings={"ignore_unknown_options": True},  # '-5' reaches AGING_MS's own refusal
)
@url_option
@queue_option
@json_option
@click.option(
    "--default", "to_default", is_flag=True, help="Clear it: claims use the default, 60000 ms."
)
@click.argument("aging", metavar="[AGING_MS]", required=False, callback=_aging_ms)
def priority_aging(
    url: str, queue: str, as_json: bool, to_default: bool, aging: int | None
) -> None:
    """Show or set the queue's priority aging, how long a due job may be overtaken by
    higher-priority work (default 60000 ms).

    AGING_MS, whole ms or a duration (30s), sets it: a job due that long is claimed in run_at
    order ahead of every priority, the bound on a low priority's wait; 0 serves every due job
    in run_at order (priorities ignored); at most 3650 days. It also sets how far priority
    moves a job held by its concurrency key. Applies from the next claim. A partitioned
    queue's name sets every partition (each partition's claims read their own config, never
    the logical name's); a partition's name sets that partition alone."""
    if to_default and aging is not None:
        raise BadInput("give AGING_MS or --default, not both")
    client = connect(url)
    require_queue(client, queue)
    q = open_queue(client, queue)
    changed = to_default or aging is not None
    if changed:
        _write(q, aging)  # None (--default): the field deleted
    parts = q.parts if isinstance(q, PartitionedQueue) else [q]
    raws = [_text(client.hget(p.keys.config, AGING_FIELD)) for p in parts]
    each = [{"queue": p.name, "priority_aging_ms": used_ms(r), "stored": r}
            for p, r in zip(parts, raws, strict=True)]  # fmt: skip
    uses = {used_ms(r) for r in raws}
    stray = _stray(client, queue) if isinstance(q, PartitionedQueue) else None
    result: dict[str, Any] = {
        "queue": queue,
        "priority_aging_ms": next(iter(uses)) if len(uses) == 1 else None,
        "stored": raws[0] if len(set(raws)) == 1 else None,
        "changed": changed,
        "partitions": each if isinstance(q, PartitionedQueue) else [],
        "unread_logical_field": stray,
    }
    if as_json:
        emit_json(result)
    else:
        _say(queue, changed, parts, raws)
    if stray is not None:
        cfg = shlex.quote(QueueKeys(queue).config)
        fix = with_flags(f"redis-cli HDEL {cfg} {AGING_FIELD}", connection_flags(url, client))
        click.echo(clean(f"note: {cfg} holds {AGING_FIELD} {stray[:40]!r}, which no claim reads "
                         f"(each partition reads its own): {fix}"), err=True)  # fmt: skip


def _write(q: Queue | PartitionedQueue, aging: int | None) -> None:
    """set_priority_aging. A partitioned queue's partitions are each checked first here, so the
    refusal names every partition that refuses (the library call, which also checks first and
    then writes nothing, raises the first one's). A write refused midway all the same (a config
    changed since the check) names the partitions that hold the value now."""
    if not isinstance(q, PartitionedQueue):
        q.set_priority_aging(aging)
        return
    checks, _ = per_node_sync(q, [(p, p.ops.check_priority_aging(aging)) for p in q.parts])
    refused = [(p.name, r) for p, r in zip(q.parts, checks, strict=True)
               if isinstance(r, BaseException) and not not_answering(r)]  # fmt: skip
    for _, exc in refused:
        if not isinstance(exc, SchedulerError):  # NOPERM, ...: the command's own exit
            raise exc
    if refused:
        why = "; ".join(f"partition {name}: {exc}" for name, exc in refused)
        raise Refused(safe(f"nothing written to any of the {len(q.parts)} partitions: {why}"))
    try:
        q.set_priority_aging(aging)
    except PartitionsNotReached:
        raise  # names the partitions it reached
    except (SchedulerError, redis.ResponseError) as exc:
        held = ", ".join(p.name for p in q.parts if _holds(p, aging)) or "none"
        raise Refused(safe(f"partitions holding the new priority aging: {held} (of "
                           f"{len(q.parts)}); then refused: {exc}")) from None  # fmt: skip


def _holds(part: Queue, aging: int | None) -> bool:
    """The partition's config holds the value written (none: the field deleted)."""
    try:
        raw = part.client.hget(part.keys.config, AGING_FIELD)
    except redis.RedisError:  # of another type, or its node not answering: not known
        return False
    return _text(raw) == (None if aging is None else str(aging))


def _say(queue: str, changed: bool, parts: list[Queue], raws: list[str | None]) -> None:
    verb = "set to" if changed else "is"
    if len(set(raws)) == 1:
        where = f" on each of its {len(parts)} partition(s)" if parts[0].name != queue else ""
        text = _describe(used_ms(raws[0]), raws[0])
        click.echo(clean(f"priority aging of {queue!r} {verb} {text}{where}"))
        return
    click.echo(clean(f"priority aging of {queue!r} differs by partition:"))
    for p, raw in zip(parts, raws, strict=True):
        click.echo(clean(f"  {p.name}: {_describe(used_ms(raw), raw)}"))
