"""The worker process: one claim loop, handlers on an event loop (async) or in threads (sync),
batched reporting, one heartbeat call per interval for every lease held.

Timeouts: an async handler past its timeout is cancelled; a sync handler past it is abandoned
(Python cannot kill a thread): its slot is freed at once, the job is failed with JobTimeout
(retried per its backoff), `ctx.stopped` is set so a cooperative handler can stop, and whatever
it returns later is dropped. The same applies when a lease is lost or the job is cancelled,
except that nothing is reported (the server refuses a stale token anyway)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from scheduler import codec, logs
from scheduler.aio import AsyncQueue
from scheduler.errors import BadArgument, InvalidPayload, SchedulerError, UnknownTask
from scheduler.execution import TRANSIENT, Backoff, Pipeline, Running, ThreadRunner
from scheduler.keys import QueueKeys
from scheduler.metrics import WorkerMetrics
from scheduler.models import ClaimedJob, FailOutcome
from scheduler.ops import Ops, Settings
from scheduler.registry import JobContext, Registry

EXIT_OK = 0
EXIT_ERROR = 1  # unexpected crash
EXIT_USAGE = 2  # unsafe or invalid settings
EXIT_IMPORT = 3  # the registry could not be imported
EXIT_REDIS = 4  # Redis unreachable at start
EXIT_FORCED = 130  # second signal: exited without waiting or releasing

_MAX_IDLE_SLEEP_S = 30.0  # safety net: re-claim at least this often even with no wake-up
PREFETCH_MAX_RUN_S = 0.02
_WAKE_BLOCK_S = 1  # BLPOP timeout; the due-time timer is local, so precision does not matter


class SettingsError(BadArgument):
    """The worker refuses to start with these settings."""


@dataclass(frozen=True)
class WorkerSettings:
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 16
    lease_ms: int = 30_000
    heartbeat_ms: int = 5_000
    batch_size: int = 100
    grace_s: float = 25.0
    reap_limit: int = 100
    # Jobs claimed beyond the free slots, started as slots free. Used only while jobs are short
    # (mean run < PREFETCH_MAX_RUN_S): it overlaps the next claim with running this batch;
    # with long jobs it would hold work another idle worker could run.
    prefetch: int = 100

    def check(self) -> None:
        if not self.queues:
            raise SettingsError("give at least one queue")
        for q in self.queues:
            QueueKeys(q)
        if self.concurrency < 1:
            raise SettingsError(f"concurrency must be >= 1, got {self.concurrency}")
        if not 1 <= self.batch_size <= 1000:
            raise SettingsError(f"batch size must be within 1..1000, got {self.batch_size}")
        if self.heartbeat_ms < 10:
            raise SettingsError(f"heartbeat must be >= 10 ms, got {self.heartbeat_ms}")
        if self.lease_ms < 3 * self.heartbeat_ms:
            raise SettingsError(
                f"unsafe: lease {self.lease_ms} ms is less than 3 heartbeat intervals "
                f"({3 * self.heartbeat_ms} ms); a single slow heartbeat would lose every lease. "
                "Raise --lease-ms or lower --heartbeat-ms."
            )
        if self.prefetch < 0:
            raise SettingsError(f"prefetch must be >= 0, got {self.prefetch}")
        if self.grace_s < 0:
            raise SettingsError(f"grace must be >= 0, got {self.grace_s}")


class _Queue:
    """Per-queue state of this worker."""

    def __init__(self, client: aredis.Redis, name: str, clock: str) -> None:
        self.aq = AsyncQueue(client, name, _clock=clock)
        self.name = name
        self.keys = QueueKeys(name)
        self.script_keys = self.keys.script_keys()
        self.ops = Ops(self.keys, Settings())


class Worker:
    def __init__(
        self,
        client: aredis.Redis,
        registry: Registry,
        settings: WorkerSettings | None = None,
        *,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
        logger: logging.Logger | None = None,
        _clock: str = "server",
    ) -> None:
        self.settings = settings or WorkerSettings()
        self.settings.check()
        self.client = client
        self.registry = registry
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.metrics = metrics or WorkerMetrics()
        self.log = logger or logging.getLogger(logs.LOGGER)
        self.queues = [_Queue(client, n, _clock) for n in self.settings.queues]
        self._by_name = {q.name: q for q in self.queues}
        self._pipe = Pipeline(client, _clock)
        self._threads = ThreadRunner()
        self.running: dict[tuple[str, str], Running] = {}  # handler still running
        self._held: dict[tuple[str, str], Running] = {}  # leased until the outcome is acked
        self._completes: list[tuple[Running, Any]] = []
        self._fails: list[tuple[Running, tuple[str, str, str], bool]] = []
        self._stop_claiming = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._wake = asyncio.Event()
        self._report = asyncio.Event()
        self._idle = asyncio.Event()
        self._signals = 0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.claimed = 0
        self._backlog: deque[Running] = deque()
        self._mean_run_s: float | None = None  # EWMA of handler run time
        self.metrics.in_flight.set_function(lambda: len(self.running))

    # -- lifecycle ------------------------------------------------------------------------
    async def preflight(self) -> None:
        """Raise (redis ConnectionError etc.) when Redis cannot be reached; load the scripts."""
        await self.client.ping()
        for _, text in self._pipe.scripts.preload_commands():
            await self.client.script_load(text)

    def request_stop(self) -> None:
        """Stop claiming and shut down gracefully (what the first SIGTERM/SIGINT does)."""
        self._stop_claiming.set()
        self._wake.set()
        self._slot_free.set()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            self.log.warning("second signal: exiting now, leases lapse on their own")
            os._exit(EXIT_FORCED)
        self.log.info("signal %s: stopping (grace %.1fs)", signum, self.settings.grace_s)
        self.request_stop()

    async def run(self, *, install_signals: bool = True) -> int:
        self._loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        self.log.info(
            "worker %s started: queues=%s concurrency=%d lease=%dms heartbeat=%dms",
            self.id, ",".join(self.settings.queues), self.settings.concurrency,
            self.settings.lease_ms, self.settings.heartbeat_ms,
        )  # fmt: skip
        await self._beat_workers()
        bg = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._reporter_loop(), name="reporter"),
            # One blocking pop per queue: the queues' keys live in different cluster slots.
            *(asyncio.create_task(self._waker_loop(q.keys.wake), name=f"waker:{q.name}")
              for q in self.queues),
        ]  # fmt: skip
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            self._closed = True
            self._idle.set()  # lets the waker see _closed
            for t in bg:
                t.cancel()
            await asyncio.gather(*bg, return_exceptions=True)
            self._threads.close()
            with contextlib.suppress(*TRANSIENT):
                await self._beat_workers(remove=True)
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
        self.log.info("worker %s stopped", self.id)
        return EXIT_OK

    async def _drain(self) -> None:
        """After claiming stopped: wait up to the grace period, release the rest, flush."""
        deadline = time.monotonic() + self.settings.grace_s
        for r in self._backlog:  # never started: give them back at once
            r.finished = True
        await self._release(list(self._backlog))
        self._backlog.clear()
        while self.running and time.monotonic() < deadline:
            self._slot_free.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_free.wait(), deadline - time.monotonic())
        leftover = list(self.running.values()) + list(self._backlog)
        self._backlog.clear()
        for r in leftover:
            self._stop(r, "shutdown")
        await self._release(leftover)
        await self._flush(timeout_s=max(5.0, self.settings.heartbeat_ms / 1000))

    async def _release(self, rs: Sequence[Running]) -> None:
        if not rs:
            return
        by_queue: dict[str, list[Running]] = {}
        for r in rs:
            by_queue.setdefault(r.queue, []).append(r)
        items = [(self._by_name[qn].script_keys,
                  self._by_name[qn].ops.release([(r.job.id, r.job.token) for r in group]))
                 for qn, group in by_queue.items()]  # fmt: skip
        backoff = Backoff()
        for _ in range(5):
            try:
                await self._pipe.run(items)
                break
            except TRANSIENT as exc:
                self.log.warning("release failed (%s); retrying", exc)
                await asyncio.sleep(backoff())
                items = [(self._by_name[qn].script_keys,
                          self._by_name[qn].ops.release([(r.job.id, r.job.token) for r in g]))
                         for qn, g in by_queue.items()]  # fmt: skip
        for r in rs:
            self._held.pop((r.queue, r.job.id), None)
            self.metrics.outcome(r.queue, r.job.task, "released")
            self._log_job("released", r)

    async def _flush(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (self._completes or self._fails) and time.monotonic() < deadline:
            try:
                await self._send_reports()
            except TRANSIENT:
                await asyncio.sleep(0.1)

    # -- claiming -------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        s = self.settings
        backoff = Backoff()
        rr = 0
        while not self._stop_claiming.is_set():
            free = self._room()
            if free <= 0:
                self._slot_free.clear()
                if self._room() <= 0:
                    await self._slot_free.wait()
                continue
            full = False
            claimed = 0
            sleep_s = _MAX_IDLE_SLEEP_S
            order = self.queues[rr:] + self.queues[:rr]
            rr = (rr + 1) % len(self.queues)
            try:
                for q in order:
                    limit = min(free, s.batch_size)
                    batch = await q.aq.claim(
                        self.id, limit=limit, lease_ms=s.lease_ms, reap_limit=s.reap_limit
                    )
                    t_recv = time.monotonic()
                    for job in batch.jobs:
                        self._start(q.name, job, batch.now_ms, t_recv)
                    n = len(batch.jobs)
                    claimed += n
                    free -= n
                    full = full or n == limit
                    if batch.next_ms >= 0:
                        sleep_s = min(sleep_s, (batch.next_ms - batch.now_ms) / 1000)
                    if free <= 0:
                        break
            except TRANSIENT as exc:
                self._redis_error("claim", exc)
                await self._sleep_or_stop(backoff())
                continue
            backoff.reset()
            if full:
                continue
            if sleep_s <= 0:
                if claimed:
                    continue
                sleep_s = 0.001  # something is due but was not claimable: do not spin
            await self._idle_wait(sleep_s)

    def _room(self) -> int:
        """How many jobs the next claim may take."""
        s = self.settings
        ahead = s.prefetch if (self._mean_run_s is not None
                               and self._mean_run_s < PREFETCH_MAX_RUN_S) else 0  # fmt: skip
        return s.concurrency + ahead - len(self.running) - len(self._backlog)

    async def _idle_wait(self, sleep_s: float) -> None:
        """Sleep until the next due time (a local timer) or an enqueue's wake-up, whichever
        comes first. The waker task does the BLPOP so no blocking call is ever cancelled."""
        self._wake.clear()
        self._idle.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), sleep_s)
        finally:
            self._idle.clear()

    async def _waker_loop(self, key: str) -> None:
        backoff = Backoff()
        while not self._closed:
            await self._idle.wait()
            if self._closed:
                return
            try:
                got = await self.client.blpop([key], timeout=_WAKE_BLOCK_S)
            except TRANSIENT as exc:
                if self._closed:  # redis-py turns a cancelled BLPOP into a ConnectionError
                    return
                self._redis_error("wake", exc)
                await asyncio.sleep(backoff())
                continue
            backoff.reset()
            if got is None:
                continue
            if self._idle.is_set():
                self._wake.set()
            else:  # we got busy meanwhile: hand the wake-up on to an idle worker
                with contextlib.suppress(*TRANSIENT):
                    await self.client.lpush(got[0], "1")

    async def _sleep_or_stop(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_claiming.wait(), delay_s)

    # -- running --------------------------------------------------------------------------
    def _start(self, queue: str, job: ClaimedJob, now_ms: int, t_recv: float) -> None:
        self.claimed += 1
        ctx = JobContext(job.id, job.task, queue, job.attempts, job.max_attempts, job.token,
                         job.fence, job.run_at_ms, job.claimed_ms)  # fmt: skip
        lease_end = t_recv - 0.05 + self.settings.lease_ms / 1000  # minus a margin for RTT
        spec = self.registry._tasks.get(job.task)
        r = Running(queue, job, ctx, spec, time.monotonic(), lease_end)
        key = (queue, job.id)
        self._held[key] = r
        self.metrics.per_task(queue, job.task)[0].observe(max(now_ms - job.run_at_ms, 0) / 1000)
        if self.log.isEnabledFor(logging.INFO):
            self._log_job("claimed", r, late_ms=now_ms - job.run_at_ms)
        if spec is None:
            err = UnknownTask(f"no handler registered for task {job.task!r}")
            self._queue_fail(r, ("UnknownTask", str(err), ""), retryable=False)
            return
        try:
            payload = json.loads(job.payload_json)
        except ValueError as exc:  # never anything but JSON: a hand-written pickle lands here
            msg = f"payload is not valid JSON ({exc}); it was not decoded further"
            self._queue_fail(r, ("InvalidPayload", msg, ""), retryable=False)
            return
        r.payload = payload
        if len(self.running) < self.settings.concurrency and not self._backlog:
            self._run(r)
        else:
            self._backlog.append(r)

    def _run(self, r: Running) -> None:
        spec, job, ctx, payload = r.spec, r.job, r.ctx, r.payload
        assert spec is not None
        r.started_s = time.monotonic()
        self.running[(r.queue, job.id)] = r
        timeout_s = spec.timeout_for(job.timeout_ms)
        loop = self._loop
        assert loop is not None
        if timeout_s is not None:
            r.timer = loop.call_later(timeout_s, self._on_timeout, r, timeout_s)
        if spec.is_async:
            r.task = loop.create_task(self._run_async(r, payload))
        else:
            fn = spec.fn

            def call() -> None:
                try:
                    result = fn(payload, ctx)
                except BaseException as exc:
                    loop.call_soon_threadsafe(self._finish, r, None, exc)
                else:
                    loop.call_soon_threadsafe(self._finish, r, result, None)

            self._threads.submit(call)

    async def _run_async(self, r: Running, payload: Any) -> None:
        assert r.spec is not None
        try:
            result = await r.spec.fn(payload, r.ctx)
        except asyncio.CancelledError:
            if r.finished:  # we cancelled it (lease lost, timeout, shutdown)
                return
            raise
        except BaseException as exc:
            self._finish(r, None, exc)
            return
        self._finish(r, result, None)

    def _end(self, r: Running) -> None:
        r.finished = True
        if r.timer is not None:
            r.timer.cancel()
        if self.running.pop((r.queue, r.job.id), None) is not None:
            run_s = time.monotonic() - r.started_s
            self.metrics.per_task(r.queue, r.job.task)[1].observe(run_s)
            m = self._mean_run_s
            self._mean_run_s = run_s if m is None else m + 0.05 * (run_s - m)
        while self._backlog and len(self.running) < self.settings.concurrency:
            nxt = self._backlog.popleft()
            if not nxt.finished:
                self._run(nxt)
        self._slot_free.set()

    def _finish(self, r: Running, result: Any, exc: BaseException | None) -> None:
        if r.finished:
            return  # stopped earlier: its outcome is not ours to report
        self._end(r)
        if exc is None:
            if result is not None:
                try:
                    codec.encode_json(result, "result", codec.MAX_PAYLOAD_BYTES)
                except InvalidPayload as bad:
                    self._queue_fail(r, ("InvalidResult", str(bad), ""), retryable=False)
                    return
            self._completes.append((r, result))
            self._report.set()
            return
        assert r.spec is not None
        retryable = not isinstance(exc, r.spec.non_retryable)
        import traceback

        tb = "".join(traceback.format_exception(exc))
        self._queue_fail(r, (type(exc).__name__, str(exc), tb), retryable=retryable)

    def _on_timeout(self, r: Running, timeout_s: float) -> None:
        if r.finished:
            return
        self._stop(r, "timeout")
        self._queue_fail(r, ("JobTimeout", f"timed out after {timeout_s:g}s", ""), retryable=True)

    def _stop(self, r: Running, reason: str) -> None:
        """Tell the handler to stop (event; async: cancel) and free its slot. Its result, if
        any comes, is dropped."""
        if r.finished:
            return
        r.ctx._stop(reason)
        self._end(r)
        if r.task is not None:
            r.task.cancel()
        outcome = {"lease lost": "lease_lost", "cancelled": "cancelled", "timeout": "timeout"}
        if reason in outcome:
            self.metrics.outcome(r.queue, r.job.task, outcome[reason])
            self._log_job(outcome[reason], r, level=logging.WARNING)
        if reason in ("lease lost", "cancelled"):
            self._held.pop((r.queue, r.job.id), None)

    def _queue_fail(self, r: Running, err: tuple[str, str, str], *, retryable: bool) -> None:
        self._fails.append((r, err, retryable))
        self._report.set()

    # -- reporting ------------------------------------------------------------------------
    async def _reporter_loop(self) -> None:
        """Completes coalesce while a call is in flight: one complete_many per queue per round
        trip, failures pipelined next to them."""
        backoff = Backoff()
        while True:
            await self._report.wait()
            self._report.clear()
            while self._completes or self._fails:
                try:
                    await self._send_reports()
                    backoff.reset()
                except TRANSIENT as exc:
                    self._redis_error("report", exc)
                    await asyncio.sleep(backoff())

    async def _send_reports(self) -> None:
        completes, self._completes = self._completes, []
        fails, self._fails = self._fails, []
        try:
            by_queue: dict[str, list[tuple[Running, Any]]] = {}
            for r, result in completes:
                by_queue.setdefault(r.queue, []).append((r, result))
            if len(by_queue) == 1 and not fails:  # the hot path: one plain EVALSHA
                ((qn, items),) = by_queue.items()
                statuses = await self._by_name[qn].aq.complete_many(
                    [(r.job.id, r.job.token, res) for r, res in items]
                )
                self._completed(items, statuses)
                return
            calls: list[tuple[list[str], Any]] = []
            for qn, items in by_queue.items():
                q = self._by_name[qn]
                calls.append((q.script_keys, q.ops.complete_many(
                    [(r.job.id, r.job.token, res) for r, res in items])))  # fmt: skip
            for r, err, retryable in fails:
                q = self._by_name[r.queue]
                calls.append((q.script_keys, q.ops.fail(r.job.id, r.job.token, err,
                                                        retryable=retryable)))  # fmt: skip
            replies = await self._pipe.run(calls)
        except BaseException:
            # Not sent (or unknown): try again; complete and fail are idempotent per token.
            self._completes[:0] = completes
            self._fails[:0] = fails
            raise
        for items, statuses in zip(by_queue.values(), replies, strict=False):
            self._completed(items, statuses)
        for (r, err, _), out in zip(fails, replies[len(by_queue) :], strict=True):
            self._failed(r, err, out)

    def _completed(self, items: list[tuple[Running, Any]], statuses: Any) -> None:
        if isinstance(statuses, BaseException):
            self.log.error("complete refused: %s", statuses)
            for r, _ in items:
                self._held.pop((r.queue, r.job.id), None)
            return
        log_info = self.log.isEnabledFor(logging.INFO)
        for (r, _), st in zip(items, statuses, strict=True):
            self._held.pop((r.queue, r.job.id), None)
            if st == "done":
                self.metrics.per_task(r.queue, r.job.task)[2].inc()
                if log_info:
                    self._log_job("done", r)
            else:
                self.metrics.outcome(r.queue, r.job.task, "cancelled" if st == "cancelled"
                                     else "stale")  # fmt: skip
                self._log_job("refused", r, level=logging.WARNING, status=st)

    def _failed(self, r: Running, err: tuple[str, str, str], out: Any) -> None:
        self._held.pop((r.queue, r.job.id), None)
        if isinstance(out, FailOutcome):
            self.metrics.outcome(r.queue, r.job.task, out.status)
            extra: dict[str, Any] = {"error_type": err[0], "error": err[1][:200]}
            if out.status == "retry":
                extra["retry_at_ms"] = out.run_at_ms
                # fail.lua pushes no wake-up: re-plan our sleep around the retry's run_at.
                self._wake.set()
            else:
                extra["reason"] = out.dead_reason
            self._log_job(out.status, r, level=logging.WARNING, **extra)
        elif isinstance(out, SchedulerError):
            self.metrics.outcome(r.queue, r.job.task, "stale")
            self._log_job("refused", r, level=logging.WARNING, status=str(out))
        else:
            self.log.error("fail of job %s errored: %s", r.job.id, out)

    # -- heartbeat ------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        interval_s = self.settings.heartbeat_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._heartbeat()
            except TRANSIENT as exc:
                self._redis_error("heartbeat", exc)
            # Without a successful heartbeat our leases run out: stop before the server
            # hands the job to someone else.
            now = time.monotonic()
            for r in list(self._held.values()):
                if r.lease_deadline_s <= now and not r.finished:
                    self._stop(r, "lease lost")

    async def _heartbeat(self) -> None:
        held = list(self._held.values())
        by_queue: dict[str, list[Running]] = {q.name: [] for q in self.queues}
        for r in held:
            by_queue[r.queue].append(r)
        calls: list[tuple[list[str], Any]] = []
        for qn, rs in by_queue.items():
            q = self._by_name[qn]
            if rs:
                calls.append(
                    (
                        q.script_keys,
                        q.ops.heartbeat(
                            [(r.job.id, r.job.token) for r in rs], lease_ms=self.settings.lease_ms
                        ),
                    )
                )
            calls.append((q.script_keys, q.ops.counts()))
        t_sent = time.monotonic()
        replies = await self._pipe.run(calls)
        await self._beat_workers()
        i = 0
        for qn, rs in by_queue.items():
            if rs:
                reply = replies[i]
                i += 1
                if not isinstance(reply, BaseException):
                    _, statuses = reply
                    for r in rs:
                        st = statuses.get(r.job.id)
                        if st == "held":
                            r.lease_deadline_s = t_sent + self.settings.lease_ms / 1000
                        elif st == "cancelled":
                            self._lost(r, "cancelled")
                        else:
                            self._lost(r, "lease lost")
            counts = replies[i]
            i += 1
            if not isinstance(counts, BaseException):
                self.metrics.set_depth(qn, counts)

    def _lost(self, r: Running, reason: str) -> None:
        if r.finished:  # finished, outcome not yet acked: the report will be refused
            self._held.pop((r.queue, r.job.id), None)
            return
        self._stop(r, reason)

    async def _beat_workers(self, *, remove: bool = False) -> None:
        pipe = self.client.pipeline(transaction=False)
        ttl = 3 * self.settings.heartbeat_ms
        for q in self.queues:
            await self._pipe.scripts["worker_beat"](keys=q.script_keys, args=[
                self.id, str(ttl), "remove" if remove else "beat", socket.gethostname(),
                str(os.getpid()), ",".join(self.settings.queues), str(len(self.running)),
                str(self.settings.concurrency)], client=pipe)  # fmt: skip
        await pipe.execute()

    # -- helpers --------------------------------------------------------------------------
    def _redis_error(self, what: str, exc: BaseException) -> None:
        self.metrics.redis_errors.inc()
        self.log.warning("redis error during %s: %s: %s (retrying)", what,
                         type(exc).__name__, exc)  # fmt: skip

    def _log_job(self, event: str, r: Running, level: int = logging.INFO, **extra: Any) -> None:
        logs.transition(self.log, event, queue=r.queue, job_id=r.job.id, task=r.job.task,
                        attempt=r.job.attempts, token=r.job.token, level=level, worker=self.id,
                        **extra)  # fmt: skip
