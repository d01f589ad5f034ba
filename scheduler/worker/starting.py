"""When a claimed job cannot start: its data is at fault (parked, never retried: a hash edited
by hand, a claim reply field the client cannot read), or this process is (no handler thread
could start: the job is given back with its attempt). Also whether a slot is free to start
one, a run whose end raised (Dispatch._finish's guard), and queueing a fail for the reporter."""

from __future__ import annotations

import time
import traceback

from scheduler.core import codec
from scheduler.core.models import ClaimedJob
from scheduler.worker.core import WorkerCore
from scheduler.worker.execution import Running
from scheduler.worker.failures import error_text
from scheduler.worker.registry import JobContext

# Claiming pauses this long after a handler thread could not start (a pids limit): the job
# given back is not claimed again at once, here, only to fail the same way.
_NO_THREAD_PAUSE_S = 1.0


class Starting(WorkerCore):
    """The slot check before a start, and the two ways a start fails."""

    def _can_start(self) -> bool:
        """A slot is free and the worker is not stopping: a job claimed by a call answered
        after the stop waits in the backlog, which shutdown gives back, instead of starting."""
        return (
            not self._stop_claiming.is_set()
            and len(self.running) < self.settings.concurrency
            and not self._backlog
            and len(self._abandoned) < self.settings.abandoned_cap
        )

    def _start_failed(
        self,
        queue: str,
        job: ClaimedJob,
        r: Running | None,
        exc: Exception,
        times: tuple[float, float],
    ) -> None:
        """The job's data could not be started (a hash edited by hand): parked, alone.
        times: (now_s, lease_end) as _start read them."""
        msg = f"the worker could not start this job: {type(exc).__name__}: {error_text(exc)}"
        self.log.error("job %s: %s", job.id, msg)
        key = (queue, job.id)
        if r is not None and self.running.get(key) is r:
            del self.running[key]
        if r is None:
            ctx = JobContext(job.id, job.task, queue, 0, 0, job.token, 0, 0, 0)
            r = Running(queue, job, ctx, None, *times)
            self._held[key] = r
        r.finished = True
        self._queue_fail(r, ("InvalidJob", msg, traceback.format_exc()), retryable=False)

    def _fail_unreadable(self, queue: str, job_id: str, token: str, reason: str) -> None:
        """A job of a claim reply the client could not read: failed non-retryably (parked)."""
        job = ClaimedJob(
            id=job_id,
            token=token,
            attempts=0,
            max_attempts=0,
            task="?",
            payload_json="null",
            run_at_ms=0,
            claimed_ms=0,
            backoff=codec.stored_backoff(""),
            timeout_ms=0,
            schedule="",
        )
        ctx = JobContext(job_id, "?", queue, 0, 0, token, 0, 0, 0)
        r = Running(queue, job, ctx, None, time.monotonic(), time.monotonic() + 1.0)
        r.finished = True
        self._held[(queue, job_id)] = r
        self._queue_fail(r, ("InvalidJob", f"unreadable job: {reason}", ""), retryable=False)

    def _late_to_start(self, r: Running, now_s: float) -> bool:
        """A job held back here (prefetched behind others) whose start deadline (enqueue's
        start_within_ms) has passed by the server's clock (its claim's, plus the time since):
        given back unstarted at the next heartbeat, so the next claim parks it there."""
        start_by = r.job.start_by_ms
        if start_by is None or r.job.claimed_ms + (now_s - r.started_s) * 1000 <= start_by:
            return False
        r.finished = True
        self._give_back.append(r)
        self._beat_now.set()
        self.log.info(
            "job %s: its start deadline passed while it waited here; given back", r.job.id
        )
        return True

    def _sweep_backlog(self, now_s: float) -> None:
        """At each heartbeat, the jobs held back here (prefetched behind running ones): one
        past its start deadline, or held longer than a lease, is given back unstarted (the
        release returns its attempt), for another worker: behind a handler that hangs (no
        timeout) they were held, heartbeated, for as long as it ran while other workers idled,
        and a deadline passed was noticed only once a slot freed."""
        lease_s = self.settings.lease_ms / 1000
        keep = [r for r in self._backlog if not r.finished and not self._late_to_start(r, now_s)]
        waited = [r for r in keep if now_s - r.started_s > lease_s]
        stay = [r for r in keep if now_s - r.started_s <= lease_s]
        for r in waited:
            r.finished = True
            self._give_back.append(r)
        if waited:
            self.log.warning(
                "%d job(s) held back here for more than a lease behind running ones; given "
                "back for other workers",
                len(waited),
            )
        self._backlog.clear()
        self._backlog.extend(stay)

    def _cannot_start(self, r: Running, exc: Exception) -> None:
        """_run failed for a reason of this process, not of the job (a thread that cannot
        start: RuntimeError at a pids limit): the start is undone and the job released at the
        heartbeat this asks for, its attempt given back; claiming pauses a moment. It stays
        held until then: a failed release leaves its lease to lapse, never a lost job."""
        key = (r.queue, r.job.id)
        if self.running.get(key) is r:
            del self.running[key]
        if r.timer is not None:
            r.timer.cancel()
        r.finished = True
        self._give_back.append(r)
        self._beat_now.set()
        self._no_claim_until = time.monotonic() + _NO_THREAD_PAUSE_S
        self.metrics.claim_paused.labels("no_thread").set(1)
        if self._loop is not None:  # the claim loop may be waiting for a free slot: wake it
            self._loop.call_later(_NO_THREAD_PAUSE_S, self._slot_free.set)
        self.log.warning(
            "job %s: could not start (%s: %s); given back now, claiming paused %.0f s",
            r.job.id,
            type(exc).__name__,
            error_text(exc),
            _NO_THREAD_PAUSE_S,
        )

    def _end_failed(self, r: Running, bug: Exception) -> None:
        """Dispatch._finish raised (a bug of ours): the run is ended here and failed, retried,
        so the job is not left leased, heartbeated while this worker lives."""
        self.log.error("job %s: ending its run failed", r.job.id, exc_info=bug)
        key = (r.queue, r.job.id)
        if self.running.get(key) is r:
            del self.running[key]
        r.finished = True
        self._queue_fail(r, ("WorkerError", error_text(bug), ""), retryable=True)
        self._slot_free.set()

    def _queue_fail(self, r: Running, err: tuple[str, str, str], *, retryable: bool) -> None:
        # Its outcome is this fail: a cancel or lapse seen before it is sent is not one more.
        r.finished = True
        self._fails.append((r, err, retryable))
        self._report.set()
