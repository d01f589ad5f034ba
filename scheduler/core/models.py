"""Typed values that cross the package boundary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from scheduler.core.backoff import Backoff
from scheduler.core.job_spec import JobSpec as JobSpec  # re-exported: callers import it here


class JobState(StrEnum):
    """A job's state as status() and get_job() report it: the job hash's stored `state` (a copy
    of set membership), except that a waiting job is HELD while flow control sets it aside
    (whatever its run_at), else SCHEDULED while its run_at is after the server's now and DUE
    from then on, and MOVING while `scheduler queue move` holds it in the queue's `moving` set.
    Only `due` is ever stored (docs/glossary.md). Before HELD, a held job read DUE."""

    SCHEDULED = "scheduled"  # waiting, run_at in the future: reported, never stored
    DUE = "due"  # waiting, run_at reached, not held: a worker may claim it now
    HELD = "held"  # waiting, set aside by flow control (flow:held): reported, never stored
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"
    MOVING = "moving"  # waiting, taken out of due by a queue move (not claimed): never stored


DEFAULT_MAX_ATTEMPTS = 5  # the budget a spec record leaves empty, a lean finished job too
# What complete drops from a finished job unless it keeps its payload (lua/complete.lua).
LEAN_DROPPED = ("payload", "backoff", "timeout_ms", "enqueued_ms", "errors")


class _EncodedResult(str):
    """A result as JSON text, checked and encoded once (the worker's, when its handler returned):
    complete sends it as is, so an object changed since (state the handler shares) cannot make
    the report fail, nor be stored as other than what was checked."""

    __slots__ = ()


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to this worker. `token` must accompany heartbeat / complete / fail / release.

    Attributes:
        id: the job's id.
        token: the fencing token of this claim, `"<fence>-<nonce>"`.
        attempts: attempts counted so far, this one included (claim counts it).
        max_attempts: the job's attempt budget.
        task: the handler's name.
        payload_json: the payload as stored (JSON text); `payload()` decodes it.
        run_at_ms: its run time (server ms): the enqueued or rescheduled one, or a failed
            attempt's retry time. A release or a lapsed lease keeps it (the job is due again
            at once, not at a new run time).
        claimed_ms: when this claim leased it (server ms).
        backoff: the job's retry delays.
        timeout_ms: how long one attempt may run; 0 = none of its own (the task's
            `timeout_s` applies, else none).
        schedule: the recurring schedule's name for an occurrence, else "".
        start_by_ms: its start deadline (server ms; enqueue's start_within_ms), else None.
    """

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
    start_by_ms: int | None = None

    @property
    def fence(self) -> int:
        """Monotonic per-job claim counter: key idempotent downstream writes on (id, fence)."""
        return int(self.token.split("-", 1)[0])

    def payload(self) -> Any:
        """The decoded JSON payload (raises json.JSONDecodeError on a hand-edited hash)."""
        return json.loads(self.payload_json)


@dataclass(frozen=True)
class ClaimBatch:
    """What one `claim` call returns.

    Attributes:
        now_ms: the server's clock at the claim.
        next_ms: the earliest server time anything may become claimable; -1 when the queue
            is empty (a worker sleeps until then, or until woken).
        jobs: the leased jobs, in due order.
        unreadable: leased jobs whose fields this client cannot decode, as (job id, token,
            reason): fail them non-retryably, they would fail the same way at every attempt.
        suspect: the one job of `jobs` that lapsed twice (in two crashed workers' batches):
            this worker holds no other suspect until it ends (docs/durability.md); else None.
        drain: a last-attempt suspect to drain for (told only to a claim saying `holding`).
    """

    now_ms: int
    next_ms: int  # earliest time anything may become claimable; -1 when the queue is empty
    jobs: list[ClaimedJob]
    unreadable: list[tuple[str, str, str]] = field(default_factory=list)
    suspect: str | None = None
    drain: str | None = None


@dataclass(frozen=True)
class FailOutcome:
    """What `fail` returns for an accepted failure.

    Attributes:
        status: `'retry'` (due again at `run_at_ms`) or `'dead'` (parked in the dead letters).
        run_at_ms: server ms of the next attempt, for `'retry'`; else None.
        dead_reason: `'attempts exhausted'`, `'non-retryable error'` or `'start deadline
            passed'` (the retry would start after the job's `start_by_ms`), for `'dead'`.
    """

    status: str  # 'retry' | 'dead'
    run_at_ms: int | None = None
    dead_reason: str | None = None


@dataclass(frozen=True)
class QueueCounts:
    """How many jobs are in each place (one `counts` call, one server instant).

    Attributes:
        now_ms: the server's clock at the call.
        due: waiting jobs whose run time has come.
        scheduled: waiting jobs whose run time is after now_ms.
        leased: jobs held by workers (lapsed leases included until reaped).
        dead: dead letters.
        oldest_due_ms: the run time of the oldest due job; None when none is due.
        lapsed: leases past their end, not yet reaped.
        held_key_limit, held_rate_window, held_waiting: of `due`, set aside by flow control.
        paused_ms: when the queue was paused (`Queue.pause`; 0: a stored value that is no
            time); None while it is not: a paused queue's claims lease nothing.
        moving: waiting jobs a queue move took out of `due` (in no other count).
    """

    now_ms: int
    due: int
    scheduled: int
    leased: int
    dead: int
    oldest_due_ms: int | None
    lapsed: int
    held_key_limit: int = 0
    held_rate_window: int = 0
    held_waiting: int = 0
    paused_ms: int | None = None
    moving: int = 0

    @property
    def held(self) -> dict[str, int]:
        """Due jobs flow control holds back, by reason (scheduler.core.vocabulary.HELD_REASONS)."""
        return {
            "key_limit": self.held_key_limit,
            "rate_window": self.held_rate_window,
            "waiting": self.held_waiting,
        }

    @property
    def paused(self) -> bool:
        """The queue is paused: nothing is claimed until `Queue.resume`."""
        return self.paused_ms is not None

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

    @property
    def stored_state(self) -> str:
        """The job hash's `state` field as stored (`due` for every waiting job)."""
        return self.fields.get("state", "?")

    def as_of(self, now_ms: int) -> Job:
        """This job with `state` as of the server time now_ms: a stored `due` whose run_at_ms
        is after now_ms reads as `scheduled` (an unreadable run_at_ms stays `due`)."""
        run_at = self.run_at_ms
        if self.state == JobState.DUE and run_at is not None and run_at > now_ms:
            return replace(self, state=JobState.SCHEDULED.value)
        return self

    def _int(self, name: str) -> int | None:
        from scheduler.core.codec import stored_int  # the one strict reader (codec imports us)

        return stored_int(self.fields.get(name))

    @property
    def attempts(self) -> int | None:
        """Attempts counted so far (None when unreadable)."""
        return self._int("attempts")

    @property
    def max_attempts(self) -> int | None:
        """The attempt budget (None when unreadable). A lean finished job stores it only when
        it is not the default 5 (lua/claim.lua), so a missing one reads as 5."""
        if "max_attempts" not in self.fields and self.payload_dropped:
            return DEFAULT_MAX_ATTEMPTS
        return self._int("max_attempts")

    @property
    def run_at_ms(self) -> int | None:
        """When the job is or was due, server ms (None when unreadable)."""
        return self._int("run_at_ms")

    @property
    def token(self) -> str | None:
        """The fencing token of the latest claim (None before the first)."""
        return self.fields.get("token")

    @property
    def worker(self) -> str | None:
        """The worker id holding the lease (None unless leased, though an old record keeps one)."""
        return self.fields.get("worker") if self.fields.get("state") == "leased" else None

    @property
    def dead_reason(self) -> str | None:
        """Why the job was parked (None unless dead)."""
        return self.fields.get("dead_reason")

    @property
    def start_by_ms(self) -> int | None:
        """The job's start deadline (server ms; enqueue's `start_within_ms` after its run
        time): no attempt starts after it. None when it has none."""
        return self._int("start_by_ms")

    @property
    def finished_ms(self) -> int | None:
        """When it was done or cancelled (server ms), None until then."""
        return self._int("finished_ms")

    @property
    def result_json(self) -> str | None:
        """The handler's result as stored JSON text (None until done)."""
        return self.fields.get("result")

    @property
    def progress(self) -> Any:
        """The latest `ctx.set_progress` value a run of it reported (any attempt; it stays on
        the finished record), None when none did or the stored text is unreadable."""
        raw = self.fields.get("progress")
        try:
            return None if raw is None else json.loads(raw)
        except (ValueError, RecursionError):
            return None

    @property
    def progress_ms(self) -> int | None:
        """When that progress was written (server ms), None when never."""
        return self._int("progress_ms")

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The last 10 failures, oldest first: type, message, traceback, attempt, at_ms."""
        raw = self.fields.get("errors")
        if not raw:
            return []
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return []
        # cjson encodes an empty table as {}.
        return list(data) if isinstance(data, list) else []

    @property
    def payload_dropped(self) -> bool:
        """True for a done or cancelled job whose payload was dropped (a lean record: complete
        keeps only state, result, finished_ms, attempts, max_attempts, task and run_at_ms, cancel
        its record's head, payload '', unless `keep_payload`; LEAN_DROPPED names what goes)."""
        return not self.fields.get("payload") and self.state in (JobState.DONE, JobState.CANCELLED)

    def payload(self) -> Any:
        """The decoded JSON payload (raises json.JSONDecodeError on a hand-edited hash, and
        ValueError for a finished job whose payload was dropped: see `payload_dropped`)."""
        if self.payload_dropped:
            raise ValueError(f"job {self.id!r} is {self.state} and its payload was not kept")
        return json.loads(self.payload_json)
