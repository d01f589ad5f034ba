"""Reading schedule hashes when a key may have been edited by hand into another type: the
helpers operations/schedules.py and operations/schedule_refill.py share."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.operations.requests import Commands, Op

Fields = dict[str, str]
Cmd = tuple[Any, ...]
# What a stored definition a hand edit broke raises while computing slots (croniter's errors
# and BadArgument are ValueErrors; a far-off instant overflows datetime).
UNREADABLE = (ValueError, KeyError, OverflowError, OSError)


def fields_of(raw: Any) -> Fields:
    return {codec.s(k): codec.s(v) for k, v in raw.items()}


def wrong_type(exc: ResponseError) -> bool:
    """WRONGTYPE: a key of another type (a hand edit). Any other refusal (an ACL's NOPERM, ...)
    is the caller's to see."""
    return str(exc).startswith("WRONGTYPE")


def read_each(groups: list[list[Cmd]]) -> Op[list[list[Any] | None]]:
    """Each group's replies, None for a group that reads a key of another type. A Commands reply
    is all or nothing (scheduler/core/scripts.py drive), so: one pipeline, and only when a key
    of another type fails it, one per group, so that the bad key fails alone."""
    try:
        reply = yield Commands([c for g in groups for c in g])
    except ResponseError as exc:
        if not wrong_type(exc):
            raise
        reply = None
    if reply is not None:
        it = iter(reply)
        return [[next(it) for _ in g] for g in groups]
    out: list[list[Any] | None] = []
    for g in groups:
        try:
            out.append((yield Commands(g)))
        except ResponseError as exc:
            if not wrong_type(exc):
                raise
            out.append(None)
    return out
