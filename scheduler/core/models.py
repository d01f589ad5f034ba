"""Typed values that cross the package boundary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from scheduler.core.backoff import Backoff


class JobState(StrEnum):
    """The value stored in the job hash's `state` field (a copy of set membership)."""

    DUE = "due"  # in the due set; "scheduled" when run_at is still in the future
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue (see Queue.enqueue for the meaning of each field)."""

    task: str
    payload: Any = None
    delay_ms: int | None = None
    run_at: datetime | None = None
    max_attempts: int = 5
    backoff: Backoff | None = None
    key: str | None = None
    jitter_ms: int = 0
    timeout_ms: int = 0
    job_id: str | None = None


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to this worker. `token` must accompany complete / fail / release."""

    id: str
    token: str
    attempts: int
    max_attempts: int
    task: str
    payload_json: str
    run_at_ms: int
    claimed_ms: int
    backoff: Backoff
    timeout_ms: int
    schedule: str

    @property
    def fence(self) -> int:
        """Monotonic per-job claim counter: key idempotent downstream writes on (id, fence)."""
        return int(self.token.split("-", 1)[0])

    def payload(self) -> Any:
        """The decoded JSON payload (raises json.JSONDecodeError on a hand-edited hash)."""
        return json.loads(self.payload_json)


@dataclass(frozen=True)
class ClaimBatch:
    now_ms: int
    next_ms: int  # earliest time anything may become claimable; -1 when the queue is empty
    jobs: list[ClaimedJob]
    # Leased jobs whose fields this client cannot read: (job id, token, reason). The worker
    # fails them non-retryably (they would fail the same way at every attempt).
    unreadable: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class FailOutcome:
    status: str  # 'retry' | 'dead'
    run_at_ms: int | None = None
    dead_reason: str | None = None


@dataclass(frozen=True)
class QueueCounts:
    now_ms: int
    due: int
    scheduled: int
    leased: int
    dead: int
    oldest_due_ms: int | None
    lapsed: int

    @property
    def oldest_overdue_ms(self) -> int:
        """How late the oldest due job is (0 when nothing is overdue)."""
        if self.oldest_due_ms is None or self.due == 0:
            return 0
        return max(self.now_ms - self.oldest_due_ms, 0)


@dataclass(frozen=True)
class Job:
    """Everything stored about one job (a read view; it may be stale by the time you read it)."""

    id: str
    state: str
    task: str
    payload_json: str
    fields: dict[str, str] = field(repr=False)
    lease_until_ms: int | None = None

    def _int(self, name: str) -> int | None:
        # The one strict reader (codec imports this module, hence the late import).
        from scheduler.core.codec import stored_int

        return stored_int(self.fields.get(name))

    @property
    def attempts(self) -> int | None:
        return self._int("attempts")

    @property
    def max_attempts(self) -> int | None:
        return self._int("max_attempts")

    @property
    def run_at_ms(self) -> int | None:
        return self._int("run_at_ms")

    @property
    def token(self) -> str | None:
        return self.fields.get("token")

    @property
    def worker(self) -> str | None:
        return self.fields.get("worker")

    @property
    def dead_reason(self) -> str | None:
        return self.fields.get("dead_reason")

    @property
    def result_json(self) -> str | None:
        return self.fields.get("result")

    @property
    def errors(self) -> list[dict[str, Any]]:
        raw = self.fields.get("errors")
        if not raw:
            return []
        try:
            data = json.loads(raw)
        except ValueError:
            return []
        # cjson encodes an empty table as {}.
        return list(data) if isinstance(data, list) else []

    def payload(self) -> Any:
        return json.loads(self.payload_json)
