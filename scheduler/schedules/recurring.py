"""Recurring schedules: definitions, validation, and the slot times Lua cannot compute.

A schedule produces *slots* (nominal occurrence times). Each slot becomes one job, id
`schedule:<name>:<slot_ms>`, due at `slot + offset_ms`. lua/lib/rearm.lua keeps exactly one of
them pending: claiming it inserts the next in the same script. Interval schedules (`every_ms`)
are epoch-aligned (slot = k * every_ms) and computed in Lua. Cron slots are computed here with
croniter and stored in a small buffer in Redis, refilled by the claiming client when it runs low.

Time zones and daylight saving time: see cron_slots.py.

Spike jitter. `jitter_ms` gives the schedule a fixed offset in [0, jitter_ms] derived from a hash
of its name: the schedule fires at the same spread-out moment every time, and many schedules
"on the hour" spread over the window. It must be smaller than the interval (cron: than the
smallest gap between two slots), so runs keep their order.

Misfire policy, for runs missed while nothing claimed (an outage, or no worker running): when the
pending occurrence is finally claimed and later slots are already overdue, `skip` runs none of
the late ones and resumes at the next future slot; `run_once` (the default) runs the latest
overdue slot once; `catch_up:N` runs the latest N overdue slots, one after another. Slots that
passed while the schedule was paused are not missed: resume starts at the next future slot.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from scheduler.schedules.cron_slots import BUFFER_SLOTS as BUFFER_SLOTS
from scheduler.schedules.cron_slots import MAX_CATCH_UP as MAX_CATCH_UP
from scheduler.schedules.cron_slots import check_cron, check_zone, cron_slots_upto
from scheduler.schedules.cron_slots import cron_slots_after as cron_slots_after
from scheduler.schedules.cron_slots import refill_requested as refill_requested
from scheduler.schedules.cron_slots import refill_slots as refill_slots
from scheduler.schedules.cron_slots import utc_ms as utc_ms
from scheduler.schedules.stored import Schedule as Schedule
from scheduler.schedules.stored import parse_schedule as parse_schedule
from scheduler.schedules.stored import unreadable_field as unreadable_field

_MISFIRE_RE = re.compile(r"(skip|run_once|catch_up:([0-9]{1,4}))")


def check_schedule_name(name: str) -> str:
    if not isinstance(name, str) or not codec.SCHEDULE_NAME_RE.fullmatch(name):
        raise BadArgument(f"invalid schedule name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
    return name


def parse_misfire(text: str) -> int:
    """'skip' | 'run_once' | 'catch_up:N' -> how many overdue slots may still run (0, 1, N)."""
    m = _MISFIRE_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise BadArgument(f"misfire must be 'skip', 'run_once' or 'catch_up:N', got {text!r}")
    if m.group(1) == "skip":
        return 0
    if m.group(1) == "run_once":
        return 1
    n = int(m.group(2))
    if not 1 <= n <= MAX_CATCH_UP:
        raise BadArgument(f"catch_up:N needs 1 <= N <= {MAX_CATCH_UP}, got {n}")
    return n


def stable_offset_ms(name: str, jitter_ms: int) -> int:
    """The schedule's fixed place in its jitter window: the same for the same name, always."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.sha256(("jitter:" + name).encode()).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_ms + 1)


@dataclass(frozen=True)
class ScheduleDef:
    """A validated schedule definition, as stored in the schedule hash."""

    name: str
    task: str
    payload_json: str
    kind: str  # 'cron' | 'every'
    cron: str
    tz: str
    every_ms: int
    jitter_ms: int
    misfire: str
    max_attempts: int
    backoff: str  # 'base_ms,factor,cap_ms,jitter', as enqueue.lua stores it
    timeout_ms: int
    # Every occurrence's flow options: core/flow.py flow_field text, no parents ('' = none).
    flow: str = ""
    # Every occurrence's start window: no run starts after its run time + this (None = none).
    start_within_ms: int | None = None

    @property
    def misfire_n(self) -> int:
        return parse_misfire(self.misfire)

    @property
    def offset_ms(self) -> int:
        return stable_offset_ms(self.name, self.jitter_ms)

    @property
    def digest(self) -> str:
        """Identifies the definition: the same upsert twice writes nothing the second time."""
        text = json.dumps(
            [
                self.task,
                _canonical(self.payload_json),
                self.kind,
                self.cron,
                self.tz,
                self.every_ms,
                self.jitter_ms,
                self.misfire,
                self.max_attempts,
                self.backoff,
                self.timeout_ms,
                # Only when set: a schedule without flow options keeps its digest of before.
                *([self.flow] if self.flow else []),
                # So with the start window (an object: never equal to a flow text).
                *([{"start_within_ms": self.start_within_ms}] if self.start_within_ms else []),
            ],
            separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def first_slots(
        self, now_ms: int, stored: dict[str, str] | None = None, pending_at_ms: int | None = None
    ) -> list[int]:
        """The buffer to store at upsert (empty for interval schedules); BadArgument when a
        cron has no slot left before 2200 (cron_slots.py). `stored`: the schedule's hash read
        before; `pending_at_ms`: its pending run's own time (its score), when it waits. A
        pending run already due is kept (lua/schedule_upsert.lua, by the same time: its own,
        else its slot + the stored offset), and the slots missed after it are this
        definition's: the buffer starts after its slot (the latest misfire_n + 1 missed, as
        refill_slots), so that its claim counts them for the policy."""
        if self.kind != "cron":
            return []
        slots = cron_slots_after(self.cron, self.tz, now_ms - self.offset_ms - 1, BUFFER_SLOTS)
        if not slots:
            raise BadArgument(f"cron {self.cron!r} has no time left before 2200-01-01 UTC")
        f = stored or {}
        cursor, offset = codec.stored_int(f.get("cursor_ms")), codec.stored_int(f.get("offset_ms"))
        run_at = pending_at_ms
        if run_at is None and cursor is not None and offset is not None:
            run_at = cursor + offset
        if f.get("pending") and cursor is not None and run_at is not None and run_at <= now_ms:
            missed = cron_slots_upto(
                self.cron, self.tz, now_ms - self.offset_ms, self.misfire_n + 1
            )
            slots = sorted({s for s in missed if s > cursor}.union(slots))
        elif (
            f.get("pending")
            and cursor is not None
            and cursor + self.offset_ms <= now_ms
            and cron_slots_after(self.cron, self.tz, cursor - 1, 1) == [cursor]
        ):
            # A waiting run this definition's smaller offset makes overdue: upsert runs its
            # slot now, as it is one of this cron's (lua/schedule_upsert.lua `withdrawn`).
            slots = sorted({cursor, *slots})
        return slots

    def upsert_args(self, slots: list[int]) -> list[str]:
        return [
            self.name,
            self.digest,
            self.kind,
            self.cron,
            self.tz,
            str(self.every_ms),
            str(self.jitter_ms),
            str(self.offset_ms),
            self.misfire,
            str(self.misfire_n),
            self.task,
            self.payload_json,
            str(self.max_attempts),
            self.backoff,
            str(self.timeout_ms),
            self.flow,
            "" if self.start_within_ms is None else str(self.start_within_ms),
            *map(str, slots),
        ]


def _canonical(payload_json: str) -> str:
    """The payload with its object keys sorted: a producer that builds the same payload in
    another key order at each start-up defines the same schedule (it replaced the pending run
    every time). A payload already sorted is unchanged, so its digest is too."""
    try:
        return json.dumps(
            json.loads(payload_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    except (ValueError, RecursionError):  # not ours to judge here: compared as written
        return payload_json


def _int(value: Any, what: str) -> int:
    """Within codec.LIMITS[what] (the one table of ranges)."""
    return codec.check_int(value, what)


def define(
    name: str,
    task: str,
    payload_json: str,
    *,
    cron: str | None,
    every_ms: int | None,
    tz: str | None,
    jitter_ms: int,
    misfire: str,
    max_attempts: int,
    backoff: Backoff | None,
    timeout_ms: int,
    start_within_ms: int | None = None,
) -> ScheduleDef:
    """Check everything; raise BadArgument before anything is sent."""
    check_schedule_name(name)
    if name in (".", ".."):  # as a queue name or job id: its dashboard page cannot be linked to
        raise BadArgument(f"invalid schedule name {name!r}: not '.' or '..'")
    if start_within_ms is not None:
        _int(start_within_ms, "start_within_ms")  # as enqueue's: 1 ms .. 3650 days
    if not isinstance(task, str) or not codec.TASK_RE.fullmatch(task):
        raise BadArgument(f"invalid task name {task!r}: use 1-200 of A-Z a-z 0-9 _ . : / -")
    if (cron is None) == (every_ms is None):
        raise BadArgument("give exactly one of cron= or every_ms=")
    jitter_ms = _int(jitter_ms, "jitter_ms")
    parse_misfire(misfire)
    _int(max_attempts, "max_attempts")
    _int(timeout_ms, "timeout_ms")
    b = codec.check_backoff(backoff if backoff is not None else Backoff())
    backoff_text = codec.backoff_text(b)
    if every_ms is not None:
        _int(every_ms, "every_ms")
        if tz is not None:
            raise BadArgument("tz applies to cron schedules only (every_ms counts absolute time)")
        if jitter_ms >= every_ms:
            raise BadArgument(f"jitter_ms ({jitter_ms}) must be smaller than every_ms ({every_ms})")
        return ScheduleDef(
            name,
            task,
            payload_json,
            "every",
            "",
            "",
            every_ms,
            jitter_ms,
            misfire,
            max_attempts,
            backoff_text,
            timeout_ms,
            start_within_ms=start_within_ms,
        )
    zone_name = "UTC" if tz is None else tz
    check_zone(zone_name)
    assert cron is not None
    expr = " ".join(cron.split()) if isinstance(cron, str) else cron
    slots = check_cron(expr, zone_name)
    gap_ms = min(b - a for a, b in itertools.pairwise(slots))
    if jitter_ms >= gap_ms:
        raise BadArgument(
            f"jitter_ms ({jitter_ms}) must be smaller than the cron interval ({gap_ms} ms)"
        )
    return ScheduleDef(
        name,
        task,
        payload_json,
        "cron",
        expr,
        zone_name,
        0,
        jitter_ms,
        misfire,
        max_attempts,
        backoff_text,
        timeout_ms,
        start_within_ms=start_within_ms,
    )
