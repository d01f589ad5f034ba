"""Recurring schedules: define, read, pause, resume, remove, refill (lua/schedule_*.lua,
lua/lib/rearm.lua); the schedule math lives in scheduler/schedules/."""

from __future__ import annotations

import dataclasses
from typing import Any

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from scheduler.core.flow import check_flow, flow_field
from scheduler.core.keys import QueueKeys
from scheduler.operations.requests import Commands, Op, OpsBase, Script
from scheduler.schedules import recurring


def refill(keys: QueueKeys, now_ms: int, *, most: int = 20) -> Op[int | None]:
    """Top up the cron buffers that lua/lib/rearm.lua asked for; idempotent, so any client
    may do it (claim does, when the claim reply asks). Returns when the earliest occurrence
    this placed is due (a starved schedule gets its next one here), or None."""
    (names,) = yield Commands([("SRANDMEMBER", keys.schedules_refill, most)])
    names = [codec.s(n) for n in names]
    if not names:
        return None
    cmds: list[tuple[Any, ...]] = []
    for n in names:
        cmds += [("HGETALL", keys.schedule(n)), ("ZRANGE", keys.schedule_slots(n), -1, -1)]
    reply = yield Commands(cmds)
    earliest: int | None = None
    for i, n in enumerate(names):
        f = {codec.s(k): codec.s(v) for k, v in reply[2 * i].items()}
        tail = reply[2 * i + 1]
        slots: list[int] = []
        if f.get("kind") == "cron":
            try:
                slots = recurring.refill_slots(f, int(codec.s(tail[0])) if tail else None, now_ms)
            except (BadArgument, ValueError, KeyError):
                continue  # a hand-edited definition: leave it for an operator
        out = yield Script("schedule_refill", [n, f.get("digest", ""), *map(str, slots)])
        placed = codec.s(out[1])
        if placed and placed != f.get("pending"):
            due_ms = int(placed.rsplit(":", 1)[1]) + int(f.get("offset_ms") or 0)
            earliest = due_ms if earliest is None else min(earliest, due_ms)
    return earliest


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
    ) -> Op[str]:
        """Create or redefine a schedule by name; returns 'created' | 'updated' | 'unchanged'
        | 'repaired'. The same definition again writes nothing (safe at every start-up). The
        flow options (core/flow.py, checked before anything is sent) go on every occurrence."""
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
        )
        d = dataclasses.replace(d, flow=flow_field(flow))
        sk = self.keys.schedule(name)
        ((digest, pending, paused, starved),) = yield Commands(
            [("HMGET", sk, "digest", "pending", "paused", "starved")]
        )
        if digest is not None and codec.s(digest) == d.digest:
            if "1" in (codec.s(paused or ""), codec.s(starved or "")):
                return "unchanged"
            if pending:
                (score,) = yield Commands([("ZSCORE", self.keys.due, codec.s(pending))])
                if score is not None:
                    return "unchanged"
        counts = yield from self.counts()
        reply = yield Script("schedule_upsert", d.upsert_args(d.first_slots(counts.now_ms)))
        return codec.s(reply[0])

    def get_schedule(self, name: str) -> Op[recurring.Schedule]:
        """One schedule; BadArgument for a malformed name or when there is none."""
        recurring.check_schedule_name(name)
        (raw,) = yield Commands([("HGETALL", self.keys.schedule(name))])
        found = recurring.parse_schedule(name, {codec.s(k): codec.s(v) for k, v in raw.items()})
        if found is None:
            raise BadArgument(f"no schedule {name!r} in queue {self.keys.queue!r}")
        return found

    def list_schedules(self) -> Op[list[recurring.Schedule]]:
        """Every readable schedule, sorted by name."""
        (names,) = yield Commands([("SMEMBERS", self.keys.schedules)])
        names = sorted(codec.s(n) for n in names)
        if not names:
            return []
        raws = yield Commands([("HGETALL", self.keys.schedule(n)) for n in names])
        out = []
        for n, raw in zip(names, raws, strict=True):
            sch = recurring.parse_schedule(n, {codec.s(k): codec.s(v) for k, v in raw.items()})
            if sch is not None:
                out.append(sch)
        return out

    def pause_schedule(self, name: str) -> Op[str]:
        """'paused' | 'already' | 'missing'."""
        recurring.check_schedule_name(name)
        return codec.s((yield Script("schedule_pause", [name])))

    def remove_schedule(self, name: str) -> Op[str]:
        """'removed' | 'missing'."""
        recurring.check_schedule_name(name)
        return codec.s((yield Script("schedule_remove", [name])))

    def resume_schedule(self, name: str) -> Op[str]:
        """'resumed' | 'active' (was not paused) | 'missing'."""
        recurring.check_schedule_name(name)
        for _ in range(5):
            (fields,) = yield Commands([("HGETALL", self.keys.schedule(name))])
            f = {codec.s(k): codec.s(v) for k, v in fields.items()}
            if not f:
                return "missing"
            slots: list[int] = []
            if f.get("kind") == "cron" and f.get("paused") == "1":
                counts = yield from self.counts()
                offset = int(f.get("offset_ms") or 0)
                slots = recurring.cron_slots_after(
                    f["cron"], f["tz"], counts.now_ms - offset - 1, recurring.BUFFER_SLOTS
                )
            args = [name, f.get("digest", ""), *map(str, slots)]
            status = codec.s((yield Script("schedule_resume", args))[0])
            if status != "stale":
                return status
        return "stale"

    def refill_schedules(self, now_ms: int, *, most: int = 20) -> Op[int | None]:
        """See refill (a module function so that claim can call it too)."""
        return (yield from refill(self.keys, now_ms, most=most))
