"""Topping up the cron buffers lua/lib/rearm.lua asks for (lua/schedule_refill.lua): any
client may do it, claim does when its reply asks."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import SchedulerError
from scheduler.core.keys import QueueKeys
from scheduler.operations.requests import Commands, Op, Script
from scheduler.operations.schedule_reads import UNREADABLE, Fields, fields_of, read_each
from scheduler.schedules import recurring
from scheduler.schedules.cron_slots import ZoneUnavailable


def refill(keys: QueueKeys, now_ms: int, *, most: int = 20) -> Op[int | None]:
    """Top up the cron buffers that lua/lib/rearm.lua asked for; idempotent, so any client
    may do it (claim does, when the claim reply asks). Returns when the earliest occurrence
    this placed is due (a starved schedule gets its next one here), or None. Each name on its
    own: one whose keys or definition a hand edit broke is dropped from the request set by
    the script and fails alone."""
    (names,) = yield Commands([("SRANDMEMBER", keys.schedules_refill, most)])
    names = [codec.s(n) for n in names]
    if not names:
        return None
    reads = yield from read_each(
        [[("HGETALL", keys.schedule(n)), ("ZRANGE", keys.schedule_slots(n), -1, -1)] for n in names]
    )
    earliest: int | None = None
    for n, read in zip(names, reads, strict=True):
        due_ms = yield from _refill_one(n, read, now_ms)
        if due_ms is not None:
            earliest = due_ms if earliest is None else min(earliest, due_ms)
    return earliest


def _refill_args(name: str, read: list[Any] | None, now_ms: int) -> tuple[list[str], Fields]:
    """schedule_refill's ARGV for one name, and its fields. No digest when its keys could not
    be read; no slots when its definition cannot be computed or none are left (2200): the
    script then drops the request (lua/schedule_refill.lua). 'later' when this host could not
    load its zone (an older tz database, EMFILE), which says nothing of the definition: the
    script leaves the request for the next claim, any worker's, a bounded number of times."""
    if read is None:
        return [name, ""], {}
    f, tail = fields_of(read[0]), read[1]
    slots: list[int] = []
    if f.get("kind") == "cron":
        last = codec.stored_int(codec.s(tail[0])) if tail else None
        try:
            slots = recurring.refill_slots(f, last, now_ms)
        except (ZoneUnavailable, OSError):  # before UNREADABLE: a BadArgument, an OSError
            return [name, f.get("digest", ""), "later"], f
        except UNREADABLE:
            slots = []
    return [name, f.get("digest", ""), *map(str, slots)], f


def refill_starved(keys: QueueKeys, name: str, now_ms: int) -> Op[bool]:
    """Refill one starved schedule no refill is asked for (its workers gave up computing its
    slots: lua/schedule_refill.lua), as schedule() does when its same definition is sent
    again; whether a run was placed."""
    (asked,) = yield Commands([("SISMEMBER", keys.schedules_refill, name)])
    if asked:
        return False  # the next claim refills it
    (read,) = yield from read_each(
        [[("HGETALL", keys.schedule(name)), ("ZRANGE", keys.schedule_slots(name), -1, -1)]]
    )
    return (yield from _refill_one(name, read, now_ms)) is not None


def _refill_one(name: str, read: list[Any] | None, now_ms: int) -> Op[int | None]:
    """Refill one schedule; when the occurrence this placed is due, or None."""
    args, f = _refill_args(name, read, now_ms)
    try:
        out = yield Script("schedule_refill", args)
    except (ResponseError, SchedulerError):
        return None  # this name alone: the others are still refilled
    placed = codec.s(out[1])
    if not placed or placed == f.get("pending"):
        return None
    slot = codec.stored_int(placed.rsplit(":", 1)[1])
    return None if slot is None else slot + (codec.stored_int(f.get("offset_ms")) or 0)
