"""A stored schedule as read back (get_schedule, list_schedules, the dashboard and CLI): the
schedule hash's fields, read strictly (scheduler/schedules/recurring.py defines and writes them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scheduler.core import codec
from scheduler.core.backoff_text import parse_stored_backoff
from scheduler.core.flow import FLOW_KEY_RE, FLOW_LIMITS
from scheduler.core.limits import TASK_RE


@dataclass(frozen=True)
class Schedule:
    """A stored schedule, as read back (a snapshot: it may change right after)."""

    name: str
    task: str
    payload_json: str
    kind: str
    cron: str
    tz: str
    every_ms: int
    jitter_ms: int
    offset_ms: int
    misfire: str
    paused: bool
    pending: str  # id of the one pending occurrence ('' when paused or waiting for a refill)
    next_run_ms: int | None  # when the pending occurrence is due
    created_ms: int | None
    updated_ms: int | None
    # The flow options given to every occurrence (docs/flow-control.md); 0 / '' = unset.
    priority: int = 0
    concurrency_key: str = ""
    concurrency_limit: int = 0
    rate_limit: str = ""  # 'N/<window_ms>ms', as RateLimit.text() writes it
    rate_key: str = ""
    # Each run's start window (ms): it starts by its run time + this, or is parked as dead
    # ('start deadline passed'); None = none (a schedule defined before it existed too).
    start_within_ms: int | None = None
    # The first field the scripts cannot read ('' = none): such a schedule is treated as
    # absent (lua/lib/schedule.lua sched_load), so its runs stop until it is defined again.
    unreadable: str = ""
    # The first flow field the scripts read as unset ('' = none; flow_unreadable_field): its
    # runs still come, without that part of their flow (doctor says what they get instead).
    flow_unreadable: str = ""

    def payload(self) -> Any:
        """The payload every occurrence gets, decoded from its stored JSON."""
        return json.loads(self.payload_json)

    def as_dict(self) -> dict[str, Any]:
        """Every field as a JSON-able dict (`payload` as its stored JSON text)."""
        return {
            "name": self.name,
            "task": self.task,
            "payload": self.payload_json,
            "kind": self.kind,
            "cron": self.cron,
            "tz": self.tz,
            "every_ms": self.every_ms,
            "jitter_ms": self.jitter_ms,
            "offset_ms": self.offset_ms,
            "misfire": self.misfire,
            "paused": self.paused,
            "pending": self.pending,
            "next_run_ms": self.next_run_ms,
            "created_ms": self.created_ms,
            "updated_ms": self.updated_ms,
            "priority": self.priority,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": self.concurrency_limit,
            "rate_limit": self.rate_limit,
            "rate_key": self.rate_key,
            "start_within_ms": self.start_within_ms,
            "unreadable": self.unreadable,
            "flow_unreadable": self.flow_unreadable,
        }


def _opt_int(v: str | None) -> int | None:
    return codec.stored_int(v)


def _rate_text(fields: dict[str, str]) -> str:
    if not fields.get("rkey"):
        return ""
    return f"{_opt_int(fields.get('rcount'))}/{_opt_int(fields.get('rwindow'))}ms"


def unreadable_field(f: dict[str, str]) -> str:
    """The first field lua/lib/schedule.lua sched_load refuses, by the same rules ('' = none)."""
    lim = codec.LIMITS
    checks = (
        ("kind", f.get("kind") in ("every", "cron")),
        ("task", TASK_RE.fullmatch(f.get("task", "")) is not None),
        ("payload", "payload" in f),
        ("max_attempts", codec.stored_int_in(f.get("max_attempts"), "max_attempts") is not None),
        ("backoff", parse_stored_backoff(f.get("backoff", "")) is not None),
        ("every_ms", codec.stored_int(f.get("every_ms", "0"), 0, lim["delay_ms"][1]) is not None),
        ("offset_ms", codec.stored_int(f.get("offset_ms", "0"), 0, lim["delay_ms"][1]) is not None),
        ("misfire_n", codec.stored_int(f.get("misfire_n", "1"), 0, lim["attempts"][1]) is not None),
        (
            "cursor_ms",
            codec.stored_int(f.get("cursor_ms", "0"), 0, lim["run_at_ms"][1]) is not None,
        ),
        ("every_ms", f.get("kind") != "every" or (codec.stored_int(f.get("every_ms")) or 0) >= 1),
        (
            "start_within_ms",
            "start_within_ms" not in f
            or codec.stored_int_in(f["start_within_ms"], "start_within_ms") is not None,
        ),
    )
    return next((name for name, ok in checks if not ok), "")


def flow_unreadable_field(f: dict[str, str]) -> str:
    """The first flow field lua/lib/flow.lua's stored reader takes as unset, by its rules ('' =
    none): a priority; a key, and its limit while the key is good; a rate key, and its count
    and window while the rate key is good. Fields of a part that is not set are not read."""
    lim = FLOW_LIMITS
    ckey, rkey = f.get("ckey", ""), f.get("rkey", "")
    checks = (
        ("priority", f.get("priority", "0") == "0" or _in(f.get("priority"), lim["priority"])),
        ("ckey", not ckey or FLOW_KEY_RE.fullmatch(ckey) is not None),
        ("climit", not ckey or _in(f.get("climit"), lim["concurrency_limit"])),
        ("rkey", not rkey or FLOW_KEY_RE.fullmatch(rkey) is not None),
        ("rcount", not rkey or _in(f.get("rcount"), lim["rate.count"])),
        ("rwindow", not rkey or _in(f.get("rwindow"), lim["rate.window_ms"])),
    )
    return next((name for name, ok in checks if not ok), "")


def _in(v: str | None, bounds: tuple[int, int]) -> bool:
    return codec.stored_int(v, *bounds) is not None


def parse_schedule(name: str, fields: dict[str, str]) -> Schedule | None:
    if not fields:
        return None
    pending = fields.get("pending", "")
    cursor = _opt_int(fields.get("cursor_ms"))
    offset = _opt_int(fields.get("offset_ms")) or 0
    return Schedule(
        name=name,
        task=fields.get("task", ""),
        payload_json=fields.get("payload", "null"),
        kind=fields.get("kind", ""),
        cron=fields.get("cron", ""),
        tz=fields.get("tz", ""),
        every_ms=_opt_int(fields.get("every_ms")) or 0,
        jitter_ms=_opt_int(fields.get("jitter_ms")) or 0,
        offset_ms=offset,
        misfire=fields.get("misfire", ""),
        paused=fields.get("paused") == "1",
        pending=pending,
        next_run_ms=cursor + offset if pending and cursor is not None else None,
        created_ms=_opt_int(fields.get("created_ms")),
        updated_ms=_opt_int(fields.get("updated_ms")),
        priority=_opt_int(fields.get("priority")) or 0,
        concurrency_key=fields.get("ckey", ""),
        concurrency_limit=_opt_int(fields.get("climit")) or 0,
        rate_limit=_rate_text(fields),
        rate_key=fields.get("rkey", ""),
        start_within_ms=codec.stored_int_in(fields.get("start_within_ms"), "start_within_ms"),
        unreadable=unreadable_field(fields),
        flow_unreadable=flow_unreadable_field(fields),
    )
