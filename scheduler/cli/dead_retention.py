"""`scheduler dead retention`: show or set a queue's opt-in dead-letter retention, by age and by
count (lua/dead_retention.lua). Off by default, so nothing is ever dropped silently; once set it
is applied as jobs die and by the workers' claims (lib/job.lua dead_trim: at most 100 of the
oldest per park or claim call, counted in stats as `dead_trimmed`), and setting it asks first
when dead jobs already beyond it would go."""

from __future__ import annotations

import re
from typing import Any

import click
import redis

from scheduler.admin.inspection import stored_layout
from scheduler.cli.common import (
    AdminCommand,
    BadInput,
    Duration,
    Refused,
    connect,
    emit_json,
    fmt_ms,
    json_option,
    queue_option,
    require_queue,
    url_option,
)
from scheduler.cli.confirm import confirm
from scheduler.client.queue import Queue
from scheduler.core.codec import MAX_SAFE_INT, MAX_TIME_MS, stored_int
from scheduler.core.keys import QueueKeys
from scheduler.operations.dead_letters import dead_cut
from scheduler.operations.requests import Commands, Op, Script

OFF = "off"
Limits = tuple[int | None, int | None]  # (max_age_ms, max_count); None: no limit


def _max_age(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    if value is None or value.strip().lower() == OFF:
        return None if value is None else OFF
    ms = Duration().convert(value, param, ctx)
    if not 1 <= ms <= MAX_TIME_MS:
        raise click.BadParameter(f"must be between 1ms and {MAX_TIME_MS} ms, got {value!r}")
    return ms


def _max_count(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    if value is None or value.strip().lower() == OFF:
        return None if value is None else OFF
    text = value.strip()
    if not re.fullmatch(r"[0-9]{1,16}", text) or int(text) > MAX_SAFE_INT:
        raise click.BadParameter(f"must be a whole number >= 0 or 'off', got {value!r}")
    return int(text)


def read_limits(client: redis.Redis, keys: QueueKeys) -> Limits:
    """The stored retention; a field that is not a valid number counts as no limit, as
    lib/job.lua dead_trim reads it."""
    age, count = client.hmget(keys.config, "dead_max_age_ms", "dead_max_count")
    max_age, max_count = stored_int(age), stored_int(count)
    return (
        max_age if max_age is not None and 0 <= max_age <= MAX_TIME_MS else None,
        max_count if max_count is not None and 0 <= max_count <= MAX_SAFE_INT else None,
    )


def _count_older(q: Queue, older_than_ms: int) -> Op[int]:
    """How many dead letters are older than that: ZCOUNT of the dead ZSET's dead_ms scores."""
    max_dead_ms = yield from dead_cut(older_than_ms)
    (n,) = yield Commands([("ZCOUNT", q.keys.dead, "-inf", max_dead_ms)])
    return int(n)


def beyond(q: Queue, limits: Limits, dead: int) -> int:
    """How many dead jobs are beyond `limits` now (retention deletes the oldest first, so the
    jobs beyond the count and those beyond the age are both the oldest: the larger set)."""
    max_age, max_count = limits
    by_count = max(dead - max_count, 0) if max_count is not None else 0
    by_age = q._run(_count_older(q, max_age)) if max_age is not None and dead else 0
    return max(by_count, by_age)


def _arg(given: int | str | None, wanted: int | None) -> str:
    """The script's argument for one limit: 'keep' when not given, '' for no limit."""
    if given is None:
        return "keep"
    return "" if wanted is None else str(wanted)


def _set(args: list[str]) -> Op[None]:
    yield Script("dead_retention", args)


def _describe(limits: Limits) -> str:
    max_age, max_count = limits
    if max_age is None and max_count is None:
        return "off (every dead job is kept until requeued or purged)"
    parts = []
    if max_age is not None:
        parts.append(f"max age {fmt_ms(max_age)}")
    if max_count is not None:
        parts.append(f"max count {max_count}")
    return ", ".join(parts)


@click.command("retention", cls=AdminCommand)
@url_option
@queue_option
@json_option
@click.option(
    "--max-age",
    "max_age",
    metavar="DURATION|off",
    callback=_max_age,
    help="Delete dead jobs dead for longer than this (30d, 12h); off: no age limit.",
)
@click.option(
    "--max-count",
    "max_count",
    metavar="N|off",
    callback=_max_count,
    help="Keep at most the newest N dead jobs; off: no count limit.",
)
@click.option("--off", "off", is_flag=True, help="Turn retention off: every dead job is kept.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def retention(
    url: str,
    queue: str,
    as_json: bool,
    max_age: int | str | None,
    max_count: int | str | None,
    off: bool,
    yes: bool,
) -> None:
    """Show the dead-letter retention of a queue, or set it (a limit not given is kept).

    Off by default: every dead job is kept until requeued or purged. Once set, it is applied as
    jobs die and by the workers' claims: each new dead letter and each claim call deletes at
    most 100 of the oldest dead jobs beyond it (counted in `scheduler stats` as dead_trimmed).
    Asks first when dead jobs already beyond the new limits would be deleted."""
    if off and (max_age is not None or max_count is not None):
        raise BadInput("--off turns both limits off: give it alone, or use --max-age off")
    client = connect(url)
    keys = require_queue(client, queue)
    if (layout := stored_layout(client, queue)) is not None:
        # Retention is stored per queue and --max-count would count per partition: not
        # the logical queue's limit, so not set under its name (nothing is changed).
        raise Refused(
            f"{queue!r} is partitioned: dead-letter retention is per partition "
            f"(-q {layout.names[0]}, ... {layout.names[-1]}), a --max-count per partition"
        )
    q = Queue(client, queue)
    current = read_limits(client, keys)
    wanted: Limits = current
    if off:
        wanted = (None, None)
    elif max_age is not None or max_count is not None:
        wanted = (
            current[0] if max_age is None else None if max_age == OFF else int(max_age),
            current[1] if max_count is None else None if max_count == OFF else int(max_count),
        )
    dead = q.counts().dead
    over = beyond(q, wanted, dead)
    changed = wanted != current
    if changed:
        if over and not yes:
            confirm(
                f"{over} of {dead} dead job(s) of queue {queue!r} are beyond {_describe(wanted)}:"
                " they are deleted for good by the next claims and deaths. Set it?",
                action="set it",
            )
        # A limit not given is kept as stored when written ('keep'), not as read above: another
        # operator's change of it meanwhile stays (lua/dead_retention.lua).
        given = (OFF, OFF) if off else (max_age, max_count)
        q._run(_set([_arg(v, w) for v, w in zip(given, wanted, strict=True)]))
        wanted = read_limits(client, keys)
    result: dict[str, Any] = {
        "queue": queue,
        "max_age_ms": wanted[0],
        "max_count": wanted[1],
        "changed": changed,
        "dead": dead,
        "beyond": over,
    }
    if as_json:
        emit_json(result)
        return
    verb = "set to" if changed else "is"
    click.echo(f"dead-letter retention of {queue!r} {verb} {_describe(wanted)}")
    if over:
        click.echo(
            f"{over} of {dead} dead job(s) are beyond it: deleted by the next claims and deaths, at"
            " most 100 per call"
        )
