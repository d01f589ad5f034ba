"""A stored schedule as read back (get_schedule, list_schedules, the dashboard and CLI): the
schedule hash's fields, read strictly (scheduler/schedules/recurring.py defines and writes them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scheduler.core import codec


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
        }


def _opt_int(v: str | None) -> int | None:
    return codec.stored_int(v)


def _rate_text(fields: dict[str, str]) -> str:
    if not fields.get("rkey"):
        return ""
    return f"{_opt_int(fields.get('rcount'))}/{_opt_int(fields.get('rwindow'))}ms"


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
    )
