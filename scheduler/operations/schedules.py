"""Recurring schedules: define, read, pause, resume, remove, refill (lua/schedule_*.lua,
lua/lib/rearm.lua); the schedule math lives in scheduler/schedules/."""

from __future__ import annotations

import dataclasses
from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, CorruptKey, ScheduleNotFound, SchedulerError
from scheduler.core.flow import check_flow, flow_field
from scheduler.core.keys import QueueKeys
from scheduler.operations.requests import Commands, Op, OpsBase, Script
from scheduler.schedules import recurring

Fields = dict[str, str]
Cmd = tuple[Any, ...]
# What a stored definition a hand edit broke raises while computing slots (croniter's errors
# and BadArgument are ValueErrors; a far-off instant overflows datetime).
_UNREADABLE = (ValueError, KeyError, OverflowError, OSError)


def _fields(raw: Any) -> Fields:
    return {codec.s(k): codec.s(v) for k, v in raw.items()}


def _wrong_type(exc: ResponseError) -> bool:
    """WRONGTYPE: a key of another type (a hand edit). Any other refusal (an ACL's NOPERM, ...)
    is the caller's to see."""
    return str(exc).startswith("WRONGTYPE")


def _read_each(groups: list[list[Cmd]]) -> Op[list[list[Any] | None]]:
    """Each group's replies, None for a group that reads a key of another type. A Commands reply
    is all or nothing (scheduler/core/scripts.py drive), so: one pipeline, and only when a key
    of another type fails it, one per group, so that the bad key fails alone."""
    try:
        reply = yield Commands([c for g in groups for c in g])
    except ResponseError as exc:
        if not _wrong_type(exc):
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
            if not _wrong_type(exc):
                raise
            out.append(None)
    return out


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
    reads = yield from _read_each(
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
    script then drops the request (lua/schedule_refill.lua)."""
    if read is None:
        return [name, ""], {}
    f, tail = _fields(read[0]), read[1]
    slots: list[int] = []
    if f.get("kind") == "cron":
        last = codec.stored_int(codec.s(tail[0])) if tail else None
        try:
            slots = recurring.refill_slots(f, last, now_ms)
        except _UNREADABLE:
            slots = []
    return [name, f.get("digest", ""), *map(str, slots)], f


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


def _resume_slots(name: str, f: Fields, now_ms: int) -> list[int]:
    """A paused cron schedule's buffer from now; BadArgument when its stored definition cannot
    be read (a hand edit) or has no time left before 2200."""
    offset = codec.stored_int(f.get("offset_ms", "0"), 0)
    try:
        if offset is None:
            raise ValueError(f"offset_ms={f.get('offset_ms')!r}")
        slots = recurring.cron_slots_after(
            f["cron"], f["tz"], now_ms - offset - 1, recurring.BUFFER_SLOTS
        )
    except _UNREADABLE as exc:
        raise unreadable(name, exc) from None
    if not slots:
        raise BadArgument(f"schedule {name!r}: no time left before 2200-01-01 UTC")
    return slots


def unreadable(name: str, why: Exception | None = None) -> BadArgument:
    detail = f" ({type(why).__name__}: {str(why)[:120]})" if why else ""
    return BadArgument(
        f"schedule {name!r} definition unreadable{detail}: define it again (schedule()) or "
        "remove it"
    )


class ScheduleOps(OpsBase):
    """Recurring schedules; documented for users on Queue.schedule and its siblings."""

    def schedule(
        self,
        name: str,
        task: str,
        payload: Any = None,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        tz: str | None = None,
        jitter_ms: int = 0,
        misfire: str = "run_once",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout_ms: int = 0,
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        rate_key: str | None = None,
        start_within_ms: int | None = None,
    ) -> Op[str]:
        """Create or redefine a schedule by name; returns 'created' | 'updated' | 'unchanged'
        | 'repaired'. The same definition again writes nothing (safe at every start-up). The
        flow options (core/flow.py) and start window, checked first, go on every occurrence."""
        flow = check_flow(
            task,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_key=rate_key,
        )
        payload_json = codec.encode_json(payload, "payload", self.settings.max_payload_bytes)
        d = recurring.define(
            name,
            task,
            payload_json,
            cron=cron,
            every_ms=every_ms,
            tz=tz,
            jitter_ms=jitter_ms,
            misfire=misfire,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout_ms=timeout_ms,
            start_within_ms=start_within_ms,
        )
        d = dataclasses.replace(d, flow=flow_field(flow))
        stored: Fields = {}
        if (yield from self._unchanged(name, d.digest, stored)):
            return "unchanged"
        counts = yield from self.counts()
        slots = d.first_slots(counts.now_ms, stored)
        reply = yield Script("schedule_upsert", d.upsert_args(slots))
        return codec.s(reply[0])

    def _unchanged(self, name: str, digest_now: str, stored: Fields) -> Op[bool]:
        """The shortcut of schedule(): the same definition, and its pending occurrence still
        waits (in due, or set aside by its concurrency key or rate window), so nothing is sent.
        A key of another type (a hand edit) is no answer: the script decides (lua/lib/rearm.lua
        sched_waiting reads the occurrence's own hold set when flow:held is one). Nor is a
        stored definition the scripts cannot read (a hand edit): sending it again repairs it."""
        try:
            (raw,) = yield Commands([("HGETALL", self.keys.schedule(name))])
            f = _fields(raw)
            stored.update(f)  # for first_slots: a due pending run is kept
            if f.get("digest") != digest_now or recurring.unreadable_field(f):
                return False
            if "1" in (f.get("paused", ""), f.get("starved", "")):
                return True
            p = f.get("pending", "")
            if not p:
                return False
            scores = yield Commands(
                [("ZSCORE", self.keys.due, p), ("ZSCORE", self.keys.flow_held, p)]
            )
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return False
        return any(score is not None for score in scores)

    def get_schedule(self, name: str) -> Op[recurring.Schedule]:
        """One schedule; BadArgument for a malformed name, ScheduleNotFound if there is none."""
        recurring.check_schedule_name(name)
        (raw,) = yield Commands([("HGETALL", self.keys.schedule(name))])
        found = recurring.parse_schedule(name, {codec.s(k): codec.s(v) for k, v in raw.items()})
        if found is None:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self.keys.queue!r}")
        return found

    def list_schedules(self) -> Op[list[recurring.Schedule]]:
        """Every readable schedule, sorted by name (a key of another type is left out)."""
        found, _ = yield from self.first_schedules(None)
        return found

    def first_schedules(self, limit: int | None) -> Op[tuple[list[recurring.Schedule], int]]:
        """(the readable ones of the first `limit` names in name order (None: all), how many
        names the set holds): a page reads `limit` definitions, not every one a producer set."""
        try:
            (names,) = yield Commands([("SMEMBERS", self.keys.schedules)])
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            raise CorruptKey(
                f"{self.keys.schedules} is not the SET of schedule names (edited by hand into "
                "another type): see `scheduler doctor`"
            ) from None
        names = sorted(codec.s(n) for n in names)
        total = len(names)
        names = names if limit is None else names[: max(limit, 0)]
        if not names:
            return [], total
        raws = yield from _read_each([[("HGETALL", self.keys.schedule(n))] for n in names])
        out = []
        for n, raw in zip(names, raws, strict=True):
            sch = None if raw is None else recurring.parse_schedule(n, _fields(raw[0]))
            if sch is not None:
                out.append(sch)
        return out, total

    def pause_schedule(self, name: str) -> Op[str]:
        """'paused' | 'already' | 'missing'."""
        recurring.check_schedule_name(name)
        return codec.s((yield Script("schedule_pause", [name])))

    def remove_schedule(self, name: str) -> Op[str]:
        """'removed' | 'missing'."""
        recurring.check_schedule_name(name)
        return codec.s((yield Script("schedule_remove", [name])))

    def resume_schedule(self, name: str) -> Op[str]:
        """'resumed' | 'active' (was not paused) | 'missing' | 'stale' (redefined meanwhile,
        five times); BadArgument when the stored definition cannot be read (hand-edited):
        nothing changed."""
        recurring.check_schedule_name(name)
        for _ in range(5):
            try:
                (fields,) = yield Commands([("HGETALL", self.keys.schedule(name))])
            except ResponseError as exc:
                if not _wrong_type(exc):
                    raise
                raise unreadable(name, exc) from None
            f = _fields(fields)
            if not f:
                return "missing"
            slots: list[int] = []
            if f.get("kind") == "cron" and f.get("paused") == "1":
                counts = yield from self.counts()
                slots = _resume_slots(name, f, counts.now_ms)
            args = [name, f.get("digest", ""), *map(str, slots)]
            status = codec.s((yield Script("schedule_resume", args))[0])
            if status == "unreadable":
                raise unreadable(name)
            if status != "stale":
                return status
        return "stale"

    def refill_schedules(self, now_ms: int, *, most: int = 20) -> Op[int | None]:
        """See refill (a module function so that claim can call it too)."""
        return (yield from refill(self.keys, now_ms, most=most))
