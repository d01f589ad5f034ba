"""Recurring schedules: define, read, pause, resume, remove, refill (lua/schedule_*.lua,
lua/lib/rearm.lua); the schedule math lives in scheduler/schedules/."""

from __future__ import annotations

import dataclasses
from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, CorruptKey, ScheduleNotFound, newer_storage
from scheduler.core.flow import check_flow, flow_field
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.operations.requests import Commands, Op, OpsBase, Script
from scheduler.operations.schedule_reads import (
    UNREADABLE,
    Fields,
    fields_of,
    read_each,
    wrong_type,
)
from scheduler.operations.schedule_refill import refill, refill_starved
from scheduler.schedules import recurring


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
    except UNREADABLE as exc:
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


# A schedule's `unreadable` when no definition can be read: its key is of another type, or its
# name is in the schedules set without a hash (both hand edits; remove clears either).
NO_DEFINITION = ("(not a hash)", "(no hash)")


def _flagged(name: str, why: str) -> recurring.Schedule:
    return recurring.Schedule(name, "", "null", "", "", "", 0, 0, 0, "", False, "", None, None,
                              None, unreadable=why)  # fmt: skip


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
        pending_at: list[int] = []
        if (yield from self._unchanged(name, d.digest, stored, pending_at)):
            return (yield from self._starved_again(name, stored))
        counts = yield from self.counts()
        slots = d.first_slots(counts.now_ms, stored, pending_at[0] if pending_at else None)
        reply = yield Script("schedule_upsert", d.upsert_args(slots))
        return codec.s(reply[0])

    def _unchanged(
        self, name: str, digest_now: str, stored: Fields, pending_at: list[int]
    ) -> Op[bool]:
        """The shortcut of schedule(): the same definition, and its pending occurrence still
        waits (in due, or set aside by its concurrency key or rate window), so nothing is sent.
        A key of another type (a hand edit) is no answer: the script decides (lua/lib/rearm.lua
        sched_waiting reads the occurrence's own hold set when flow:held is one). Nor is a
        stored definition the scripts cannot read (a hand edit): sending it again repairs it.
        Fills `stored` (the hash) and `pending_at` (the waiting run's own time, its score) for
        first_slots: a due pending run is kept, judged by that time as schedule_upsert.lua does
        (a run a redefinition kept is not at its slot + the stored offset)."""
        try:
            (raw,) = yield Commands([("HGETALL", self.keys.schedule(name))])
            f = fields_of(raw)
            stored.update(f)
            p = f.get("pending", "")
            scores: list[Any] = []
            if p:
                scores = yield Commands(
                    [("ZSCORE", self.keys.due, p), ("ZSCORE", self.keys.flow_held, p)]
                )
                at = next((sc for sc in scores if sc is not None), None)
                if at is not None:
                    pending_at.append(codec.score_ms(at))
            if f.get("digest") != digest_now or recurring.unreadable_field(f):
                return False
            if "1" in (f.get("paused", ""), f.get("starved", "")):
                return True
        except ResponseError as exc:
            if not wrong_type(exc):
                raise
            return False
        return any(score is not None for score in scores)

    def _starved_again(self, name: str, stored: Fields) -> Op[str]:
        """The same definition of a starved cron schedule (its buffer ran out after an outage)
        whose refill no worker could compute (lua/schedule_refill.lua gave up): this client
        refills it, 'repaired' when that placed its run. 'unchanged' otherwise (a refill is
        asked for: the next claim does it)."""
        if stored.get("starved") != "1" or stored.get("paused") == "1":
            return "unchanged"
        try:
            counts = yield from self.counts()
            placed = yield from refill_starved(self.keys, name, counts.now_ms)
        except ResponseError as exc:
            if not wrong_type(exc):
                raise
            return "unchanged"  # the refill SET of another type: doctor reports it
        return "repaired" if placed else "unchanged"

    def get_schedule(self, name: str) -> Op[recurring.Schedule]:
        """One schedule; BadArgument for a malformed name, ScheduleNotFound if there is none."""
        recurring.check_schedule_name(name)
        yield from self._not_newer()
        (raw,) = yield Commands([("HGETALL", self.keys.schedule(name))])
        found = recurring.parse_schedule(name, {codec.s(k): codec.s(v) for k, v in raw.items()})
        if found is None:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self.keys.queue!r}")
        return (yield from self._due_times([found]))[0]

    def list_schedules(self, *, flagged: bool = False) -> Op[list[recurring.Schedule]]:
        """Every readable schedule, sorted by name (a key of another type, or a name without its
        hash, is left out; `flagged`: kept, as first_schedules gives it)."""
        found, _ = yield from self.first_schedules(None)
        return found if flagged else [s for s in found if s.unreadable not in NO_DEFINITION]

    def first_schedules(self, limit: int | None) -> Op[tuple[list[recurring.Schedule], int]]:
        """(the first `limit` names' schedules in name order (None: all), how many names the set
        holds): a page reads `limit` definitions, not every one a producer set. A name whose
        hash is of another type, or gone (edited by hand), is a Schedule flagged `unreadable`
        (NO_DEFINITION), so it is shown, and removed, not hidden while it is counted."""
        yield from self._not_newer()
        try:
            (names,) = yield Commands([("SMEMBERS", self.keys.schedules)])
        except ResponseError as exc:
            if not wrong_type(exc):
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
        raws = yield from read_each([[("HGETALL", self.keys.schedule(n))] for n in names])
        out = [
            recurring.parse_schedule(n, fields_of(raw[0])) or _flagged(n, NO_DEFINITION[1])
            if raw is not None else _flagged(n, NO_DEFINITION[0])
            for n, raw in zip(names, raws, strict=True)
        ]  # fmt: skip
        gone = [s.name for s in out if s.unreadable == NO_DEFINITION[1]]
        if gone:  # removed meanwhile (both keys in one script), or the name left by hand
            left = yield Commands([("SISMEMBER", self.keys.schedules, n) for n in gone])
            removed = {n for n, m in zip(gone, left, strict=True) if not m}
            out = [s for s in out if s.name not in removed]
        return (yield from self._due_times(out)), total

    def _not_newer(self) -> Op[None]:
        """NewerStorage when a newer version stores the queue, as every script refuses it
        (lib/util.lua newer_storage_err): these reads are plain commands, which listed its
        schedules by this version's reading. A config of another type holds no generation."""
        try:
            (generation,) = yield Commands([("HGET", self.keys.config, "generation")])
        except ResponseError as exc:
            if not wrong_type(exc):
                raise
            return
        if (refused := newer_storage(self.keys.queue, generation, STORAGE_GENERATION)) is not None:
            raise refused

    def _due_times(self, found: list[recurring.Schedule]) -> Op[list[recurring.Schedule]]:
        """next_run_ms from due, the truth of when each pending run is due (or flow:held, where
        flow control set it aside under its run time): a due run a redefinition kept keeps its
        time while the stored offset is the new jitter's (slot + offset is then a time it does
        not have). In neither, or a key of another type: slot + offset, as stored."""
        at: dict[str, int] = {}
        for key in (self.keys.due, self.keys.flow_held):
            ids = [s.pending for s in found if s.pending and s.pending not in at]
            if not ids:
                break
            try:
                scores = yield Commands([("ZSCORE", key, p) for p in ids])
            except ResponseError as exc:
                if not wrong_type(exc):
                    raise
                continue
            at.update((p, int(float(v))) for p, v in zip(ids, scores, strict=True) if v is not None)
        return [
            dataclasses.replace(s, next_run_ms=at[s.pending]) if s.pending in at else s
            for s in found
        ]

    def pause_schedule(self, name: str) -> Op[str]:
        """'paused' | 'already' | 'missing'; BadArgument when its key is of another type (a
        hand edit, which remove clears): nothing changed."""
        recurring.check_schedule_name(name)
        status = codec.s((yield Script("schedule_pause", [name])))
        if status == "unreadable":
            raise unreadable(name)
        return status

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
                if not wrong_type(exc):
                    raise
                raise unreadable(name, exc) from None
            f = fields_of(fields)
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
