"""JobContext: what a handler knows about its run, and how the worker tells it to stop."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.errors import JobCancelled, JobTimeout, LeaseExpired, RunStopped
from scheduler.core.progress import ProgressText, encode_progress

# Stores a run's `stopped` Event once: one lock for every context (held for a check and a store
# on first use only), not one made per job.
_EVENT_LOCK = threading.Lock()


@dataclass
class JobContext:
    """What a handler knows about its run. `stopped` is set (and async handlers are cancelled)
    when the worker must not report a result any more: lease expired, cancelled, timed out, or
    shut down past the grace period. Deduplicate side effects on `job_id` (every run of the
    job shares it); order overwrites by `fence` (it grows with every claim): docs/guide/
    workers.md, "Making side effects idempotent"."""

    job_id: str
    task: str
    queue: str  # the queue the job was claimed from: a partitioned queue's partition (`q.p1`)
    attempt: int
    max_attempts: int
    token: str
    fence: int
    run_at_ms: int
    claimed_ms: int
    stop_reason: str | None = None  # 'expired' | 'cancelled' | 'timeout' | 'shutdown'
    _event: threading.Event | None = field(default=None, repr=False)
    # The latest set_progress, and the one a call carried last (worker/progress_sends.py).
    _progress: ProgressText | None = field(default=None, repr=False)
    _progress_sent: ProgressText | None = field(default=None, repr=False)

    @classmethod
    def for_test(
        cls,
        task: str = "test.task",
        *,
        job_id: str = "test-job-0000001",
        queue: str = "default",
        attempt: int = 1,
        max_attempts: int = 5,
        fence: int = 1,
    ) -> JobContext:
        """A context to call a handler with in a unit test, without Redis or a worker:
        `send_reminder(Reminder(user=42), JobContext.for_test("send_reminder"))`."""
        token = f"{fence}-test"
        return cls(job_id, task, queue, attempt, max_attempts, token, fence, 0, 0)

    @property
    def stopped(self) -> threading.Event:
        """Set when the run must stop; wait on it from a thread (made on first use: most
        handlers never look, and a job costs microseconds)."""
        event = self._event
        if event is None:
            # Made outside the lock, stored under it once: threads first using it at once get
            # the one the worker's stop sets (two Events, one never set, left a thread waiting).
            made = threading.Event()
            with _EVENT_LOCK:
                if self._event is None:
                    self._event = made
                event = self._event
            if self.stop_reason is not None:  # after the store: see _stop
                event.set()
        return event

    def set_progress(self, progress: Any) -> None:
        """Report how far the run has got: any JSON value up to 4,096 bytes encoded, e.g.
        `{"done": 40, "of": 100}`. The worker writes the latest one to the job with its next
        heartbeat (every `heartbeat_ms`, 5 s by default) and ahead of the run's complete or
        fail, while this run still holds the lease; `get_job(id).progress` reads it. Cheap to
        call often: only the latest is sent. Raises InvalidPayload (not JSON-serialisable, too
        large); safe from a sync handler's thread."""
        self._progress = encode_progress(progress)

    @property
    def progress(self) -> Any:
        """The value last given to `set_progress` in this run (None before the first)."""
        return None if self._progress is None else json.loads(self._progress)

    @property
    def lease_expired(self) -> bool:
        """True once the lease lapsed: another worker may run the job now, so stop."""
        return self.stop_reason == "expired"

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled (seen at a heartbeat): its result will be refused."""
        return self.stop_reason == "cancelled"

    def should_stop(self) -> bool:
        """True once the run must stop (lease lapsed, cancelled, timed out or shutting down)."""
        return self.stop_reason is not None

    def raise_if_stopped(self) -> None:
        """For long sync loops: raise instead of carrying on with a lease we no longer hold."""
        if self.stop_reason is None:
            return
        if self.stop_reason == "cancelled":
            raise JobCancelled(self.job_id, self.token, "job was cancelled")
        # LeaseExpired says another worker may run the job: true only of a lapsed lease.
        if self.stop_reason == "timeout":
            raise JobTimeout(self.job_id, self.token, "the run timed out")
        if self.stop_reason == "shutdown":
            raise RunStopped(self.job_id, self.token, "the worker is shutting down")
        raise LeaseExpired(self.job_id, self.token, self.stop_reason or "expired")

    def _stop(self, reason: str) -> bool:
        """Mark the run stopped; the first reason wins. Returns False if already stopped."""
        if self.stop_reason is not None:
            return False
        self.stop_reason = reason  # before the event check: see `stopped`
        if self._event is not None:
            self._event.set()
        return True
