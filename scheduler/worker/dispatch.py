"""Running claimed jobs: async handlers on the loop, sync ones in threads; timeouts, stops,
the abandoned-thread cap, and the rule that a job never runs twice at once in one process."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from scheduler.core.errors import UnknownTask
from scheduler.core.models import ClaimedJob
from scheduler.worker import failures, payload_decode, task_exits
from scheduler.worker.execution import Running, _Slot
from scheduler.worker.payload_decode import OFF_LOOP_CHARS, STEP_CHARS, Undecodable, Undecoded
from scheduler.worker.payloads import PayloadMisfit, load_stored
from scheduler.worker.registry import JobContext
from scheduler.worker.settings import _LEASE_MARGIN_S
from scheduler.worker.starting import Starting

# A handler slot lets the loop run at least once every this many jobs (_run_async).
_SLOT_YIELD_EVERY = 8


class Dispatch(Starting):
    """Starting, timing out and stopping handlers; the backlog and the abandoned threads."""

    # Set only while a handler slot reports the run that just ended: _run hands it the next.
    _free_slot: _Slot | None = None
    _quota_met = False  # self_stop.SelfStop's: max_jobs or max_memory_mb reached
    _decode_left = STEP_CHARS  # of the claim being started (Claiming._take resets it)

    def _start(
        self,
        queue: str,
        job: ClaimedJob,
        now_ms: int,
        t_sent: float,
        now_s: float,
        log: bool,
        resent: bool = False,
    ) -> None:
        """now_s: monotonic, read once per claimed batch; log: INFO is enabled; resent: by a
        claim re-sent after a lost answer, or answered too late (Running.beat_sent)."""
        self.claimed += 1
        # The lease counts from when the server ran the claim, which is after we sent it.
        lease_end = t_sent - _LEASE_MARGIN_S + self.settings.lease_ms / 1000
        spec = self.registry._tasks.get(job.task)
        key = (queue, job.id)
        r: Running | None = None
        try:
            ctx = JobContext(job.id, job.task, queue, job.attempts, job.max_attempts, job.token,
                             job.fence, job.run_at_ms, job.claimed_ms)  # fmt: skip
            r = Running(queue, job, ctx, spec, now_s, lease_end, beat_sent=not resent)
            self._held[key] = r
            self._prepare(r, now_ms, now_s, log)
        except Exception as exc:  # one job's data must never take the worker down
            self._start_failed(queue, job, r, exc, (now_s, lease_end))

    def _prepare(self, r: Running, now_ms: int, now_s: float, log: bool) -> None:
        job, queue, spec = r.job, r.queue, r.spec
        r.stats = stats = self.metrics.per_task(queue, job.task)
        stats.lateness.observe(max(now_ms - job.run_at_ms, 0) / 1000)
        if log:
            self._log_job("claimed", r, late_ms=now_ms - job.run_at_ms)
        if spec is None:
            # Retried by the job's backoff, then parked: during a rolling deploy a new task's
            # job an old worker claims is run by a new one on a later attempt.
            err = UnknownTask(failures.unknown_task_text(job.task, self.registry.names()))
            self._queue_fail(r, ("UnknownTask", str(err), ""), retryable=True)
            return
        text = job.payload_json
        n = len(text)
        try:
            if n < OFF_LOOP_CHARS and n <= self._decode_left:
                self._decode_left -= n
                payload = load_stored(text)
            else:  # as its run starts, off the loop (payload_decode.py)
                payload = Undecoded(text)
        except (ValueError, RecursionError) as exc:  # never anything but JSON (a pickle)
            msg = payload_decode.not_json(exc)
            self._queue_fail(r, ("InvalidPayload", msg, ""), retryable=False)
            return
        r.payload = payload
        r.timeout_s = spec.timeout_for(job.timeout_ms)  # a bad number fails here, not in _run
        key = (queue, job.id)
        old = self.running.get(key)
        if old is not None and old is not r:
            # Claimed again while a run of it goes on here (its lease lapsed: its outcome would
            # be refused): stop it; this one waits until it has ended (below).
            self._stop(old, "expired")
        if key in self._abandoned:  # its previous run is still alive here: wait for it
            self._behind[key] = r
        elif self._can_start():
            self._run(r, now_s)
        else:
            self._backlog.append(r)

    def _run(self, r: Running, now_s: float) -> None:
        spec, job, ctx, payload = r.spec, r.job, r.ctx, r.payload
        assert spec is not None
        r.started_s = now_s
        self.running[(r.queue, job.id)] = r
        timeout_s = r.timeout_s
        loop = self._loop
        assert loop is not None
        if timeout_s is not None:
            r.timer = loop.call_later(timeout_s, self._on_timeout, r, timeout_s)
        elif self._quota_met:  # held past the quota, it may never end: a SIGTERM stop
            loop.call_soon(self.request_stop)
        if spec.is_async:
            slot = self._free_slot
            if slot is not None:  # a run of that task just ended in this call: it runs r next
                self._free_slot = None
                slot.next = r
                r.task = slot.task
            else:
                r.task = loop.create_task(self._run_async(r))
        else:
            call = payload_decode.in_thread(spec.fn, payload, ctx, loop, self._thread_done, r)
            try:
                self._threads.submit(call)
            except Exception as exc:  # no thread could start (a pids limit): not the job's fault
                self._cannot_start(r, exc)

    def _thread_done(self, r: Running, result: Any, exc: BaseException | None) -> None:
        self._gone(r)
        self._finish(r, result, exc)

    def _gone(self, r: Running, _task: object = None) -> None:
        """A stopped run's thread returned or its task ended: a claim of the same job held
        back behind it may start now."""
        key = (r.queue, r.job.id)
        if self._abandoned.get(key) is r:
            del self._abandoned[key]
            nxt = self._behind.pop(key, None)
            if nxt is not None and not nxt.finished:
                self._backlog.appendleft(nxt)
            self._pump(time.monotonic())

    async def _run_async(self, r: Running) -> None:
        """A handler slot: runs r, then each async job handed to it as a run of it ends (the
        backlog's next, in _pump), so a busy worker makes no asyncio Task per job (issue 16).
        A stop cancels this task while it runs exactly that job (r.task is this task from the
        hand-over on, and r is not finished before its handler returned); a stopped run ends
        the slot, so a cancellation is never carried over to the next job."""
        task = asyncio.current_task()
        assert task is not None
        task_exits.IN_HANDLER.set(True)  # the tasks its handlers start: see task_exits.py
        slot = _Slot(task)
        runs = 0
        while True:
            assert r.spec is not None
            try:
                if runs % _SLOT_YIELD_EVERY == _SLOT_YIELD_EVERY - 1:
                    # A Task per job let the loop run between any two jobs; handlers that never
                    # suspend would otherwise run the whole backlog in one step.
                    await asyncio.sleep(0)
                if type(r.payload) is Undecoded:  # a large one (payload_decode.py)
                    result = await payload_decode.run_async(r, r.payload)
                else:
                    result = await r.spec.fn(r.payload, r.ctx)
            except asyncio.CancelledError as exc:
                if r.finished:  # we cancelled it (lease lost, timeout, shutdown)
                    return
                if task.cancelling():  # not by us (we end the run first): see _cancelled
                    task.get_loop().call_soon(self._cancelled, r, exc)
                    raise
                # The handler's own (it awaited a task someone else cancelled): it failed.
                out: tuple[Any, BaseException | None] = (None, exc)
            except BaseException as exc:
                out = (None, task_exits.cause(exc))
            else:
                out = (result, None)
            if r.finished or task.cancelling():
                # A cancellation the handler swallowed (ours: r was stopped, its outcome is
                # dropped in _finish): this task may still have one pending, so it takes no
                # next job.
                self._finish(r, *out)
                return
            self._free_slot = slot
            try:
                self._finish(r, *out)
            except BaseException:
                if slot.next is not None and self._loop is not None:  # handed over already
                    slot.next.task = self._loop.create_task(self._run_async(slot.next))
                raise
            finally:
                self._free_slot = None
            nxt, slot.next = slot.next, None
            if nxt is None:
                return
            del out  # the finished job's outcome (a traceback's frames) is not kept
            result = None
            r = nxt
            runs += 1

    def _cancelled(self, r: Running, exc: BaseException) -> None:
        """Its task was cancelled, not by us: by the handler's own code (a home-made time limit),
        a failure; during a stop (asyncio.run's cancel of every task at its exit), the shutdown
        gives it back. A step later: a stop cancelled with it has been seen by then."""
        if not self._stop_claiming.is_set():
            self._finish(r, None, exc)

    def _end(self, r: Running) -> None:
        r.finished = True
        if r.timer is not None:
            r.timer.cancel()
        now_s = time.monotonic()  # the job's one clock read after its claim's batch
        key = (r.queue, r.job.id)
        if self.running.get(key) is r:
            del self.running[key]
            r.run_s = run_s = now_s - r.started_s  # in ms only if a line says it (_log_job)
            stats = r.stats or self.metrics.per_task(r.queue, r.job.task)
            stats.duration.observe(run_s)
            m = self._mean_run_s
            self._mean_run_s = run_s if m is None else m + 0.05 * (run_s - m)
        self._pump(now_s)

    def _pump(self, now_s: float) -> None:
        """Start backlog jobs while there are free slots (and the thread cap allows), never
        after the stop (shutdown gives them back); now_s: monotonic, when the job that freed
        the slot ended."""
        cap = self.settings.abandoned_cap
        while (
            self._backlog
            and len(self.running) < self.settings.concurrency
            and len(self._abandoned) < cap
            and not self._shutting_down
            and not self._stop_claiming.is_set()
        ):
            nxt = self._backlog.popleft()
            if not nxt.finished and not self._late_to_start(nxt, now_s):
                try:
                    self._run(nxt, now_s)
                except Exception as exc:  # never out of here: we are inside another job's end
                    self._cannot_start(nxt, exc)
        self._slot_free.set()

    def _finish(self, r: Running, result: Any, exc: BaseException | None) -> None:
        if r.finished:
            return  # stopped earlier: its outcome is not ours to report
        try:
            if exc is None:
                if result is not None:  # a sync handler's was, in its thread (in_thread)
                    result = failures.encoded_result(result)
                if type(result) is not failures.BadResult:
                    self._end(r)
                    self._completes.append((r, result))
                    self._report.set()
                    return
                err, retryable = ("InvalidResult", result.why, ""), False
            elif type(exc) is Undecodable:  # decoded off the loop: parked as at claim, unrun
                if self.running.get(key := (r.queue, r.job.id)) is r:
                    del self.running[key]  # so _end measures no run time
                err, retryable = ("InvalidPayload", str(exc), ""), False
            else:  # read before _end: an error that cannot be described must still be sent
                err, retryable, r.retry_delay_ms = failures.failure_of(exc, r.spec)
                if self.registry.outcome_hooks and type(exc) is not PayloadMisfit:
                    r.error = exc  # only then are its frames kept; a misfit is our decode's
            self._end(r)
            self._queue_fail(r, err, retryable=retryable)
        except Exception as bug:  # ours: the run still gets an outcome, never a lease for good
            self._end_failed(r, bug)

    def _on_timeout(self, r: Running, timeout_s: float) -> None:
        if r.finished:
            return
        self._stop(r, "timeout")
        self._queue_fail(r, ("JobTimeout", f"timed out after {timeout_s:g}s", ""), retryable=True)

    def _stop(self, r: Running, reason: str, status: str | None = None) -> None:
        """Tell the handler to stop (event; async: cancel) and free its slot. Its result, if
        any comes, is dropped. A sync handler's thread keeps running: it counts as abandoned
        until it returns."""
        if r.finished:
            return
        r.ctx._stop("expired" if reason == "stale" else reason)  # JobContext's words
        key = (r.queue, r.job.id)
        if r.spec is not None and self.running.get(key) is r:
            if not r.spec.is_async:
                self._abandoned[key] = r  # until its thread returns (_thread_done)
            elif r.task is not None and not r.task.done():
                # Until its task ends (a handler may swallow the cancel or await cleanup).
                self._abandoned[key] = r
                r.task.add_done_callback(functools.partial(self._gone, r))
        self._end(r)
        if r.task is not None:
            r.task.cancel()
        if reason in ("expired", "stale", "cancelled", "timeout"):  # the outcome word
            self.metrics.outcome(r.queue, r.job.task, reason)
            seen = {} if status is None else {"status": status}  # the heartbeat's answer
            self._log_job(reason, r, level=logging.WARNING, **seen)
        if reason in ("expired", "stale", "cancelled"):
            self._forget(r)
