"""The worker process: one claim loop, handlers on an event loop (async) or in threads (sync),
batched reporting, one heartbeat call per interval for every lease held.

Timeouts: an async handler past its timeout is cancelled; a sync handler past it is abandoned
(Python cannot kill a thread): its slot is freed at once, the job is failed with JobTimeout
(retried per its backoff), `ctx.stopped` is set so a cooperative handler can stop, and whatever
it returns later is dropped. The same applies when a lease is lost or the job is cancelled,
except that nothing is reported (the server refuses a stale token anyway). Abandoned threads
are bounded (`max_abandoned_threads`): at the cap the worker stops claiming until one ends, and
a job whose earlier run is still alive in this process is held back until that run ends.

Every background loop (claim, heartbeat, presence, reporter, wake-up) stops on a flag it checks,
treats each Redis error as scheduler.execution.classify says (transient: log, count, back off;
fatal: stop the worker with EXIT_REDIS_REFUSED), and a loop that dies of anything else stops
the worker with EXIT_ERROR: never a silently dead task.

Shutdown (first SIGTERM/SIGINT), each wait bounded: stop claiming; give back jobs never
started; wait up to the grace period for running handlers; stop the reporter and flush every
outcome known (also those of a call still in flight); release the jobs still running; only
then stop heartbeats; remove the presence entry; exit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import OutOfMemoryError, RedisError

from scheduler import codec, logs
from scheduler.aio import AsyncQueue
from scheduler.errors import BadArgument, InvalidPayload, SchedulerError, UnknownTask
from scheduler.execution import Backoff, Pipeline, Running, ThreadRunner, classify
from scheduler.keys import QueueKeys
from scheduler.metrics import WorkerMetrics
from scheduler.models import ClaimBatch, ClaimedJob, FailOutcome
from scheduler.ops import Ops, Request, Script, Settings
from scheduler.registry import JobContext, Registry

EXIT_OK = 0
EXIT_ERROR = 1  # unexpected crash (also: a background loop died of a bug)
EXIT_USAGE = 2  # unsafe or invalid settings
EXIT_IMPORT = 3  # the registry could not be imported
EXIT_REDIS = 4  # Redis unreachable at start
EXIT_REDIS_REFUSED = 5  # Redis refused the worker's calls for good (ACL permission, auth, bug)
EXIT_FORCED = 130  # second signal: exited without waiting or releasing

_MAX_IDLE_SLEEP_S = 30.0  # safety net: re-claim at least this often even with no wake-up
PREFETCH_MAX_RUN_S = 0.02
_WAKE_BLOCK_S = 1  # BLPOP timeout; the due-time timer is local, so precision does not matter
_LEASE_MARGIN_S = 0.05  # local lease view ends this much before the server's
_STOP_LOOP_S = 1.0  # how long shutdown waits for one loop to notice its stop flag
_SETTLE_S = 5.0  # shutdown budget for flushing outcomes and releasing when Redis is slow


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
    # Sync handlers abandoned after a timeout / lost lease that are still running (Python
    # cannot kill a thread). At the cap the worker stops claiming until one ends. None: 2x
    # concurrency. Live handler threads stay within concurrency + this.
    max_abandoned_threads: int | None = None

    @property
    def abandoned_cap(self) -> int:
        m = self.max_abandoned_threads
        return 2 * self.concurrency if m is None else m

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
        if self.max_abandoned_threads is not None and self.max_abandoned_threads < 1:
            raise SettingsError(
                f"max_abandoned_threads must be >= 1, got {self.max_abandoned_threads}"
            )


class _Queue:
    """Per-queue state of this worker."""

    def __init__(self, client: aredis.Redis, name: str, clock: str) -> None:
        self.aq = AsyncQueue(client, name, _clock=clock)
        self.name = name
        self.keys = QueueKeys(name)
        self.script_keys = self.keys.script_keys()
        self.ops = Ops(self.keys, Settings())


class _Fatal(Exception):
    """A loop met an error retrying cannot help with; the worker stops with `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Deadline(Exception):
    """_within: the call did not end in time (it may still be running)."""


async def _within(coro: Any, timeout_s: float) -> Any:
    """Await coro for at most timeout_s. Unlike asyncio.wait_for this does not wait for the
    cancelled call to wind down: a library that swallows the cancellation cannot hang us."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.05))
    if not done:
        task.cancel()
        raise _Deadline
    return task.result()


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
        # The reports a call has in flight: shutdown re-sends them if the call never returns
        # (complete and fail are idempotent per token).
        self._sending: tuple[list[tuple[Running, Any]], list[Any]] = ([], [])
        self._report_gen = 0
        # Sync runs stopped (timeout, lease lost, ...) whose thread is still running, and jobs
        # claimed again while such a run of theirs is alive: they start when it ends.
        self._abandoned: dict[tuple[str, str], Running] = {}
        self._behind: dict[tuple[str, str], Running] = {}
        self._capped = False
        self._stop_claiming = asyncio.Event()
        self._stop_reporter = asyncio.Event()
        self._stop_heartbeat = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._wake = asyncio.Event()
        self._report = asyncio.Event()
        self._idle = asyncio.Event()
        self._signals = 0
        self._closed = False
        self._shutting_down = False
        self._exit_code = EXIT_OK
        self._loop: asyncio.AbstractEventLoop | None = None
        self.claimed = 0
        self._backlog: deque[Running] = deque()
        self._mean_run_s: float | None = None  # EWMA of handler run time
        # claim nonce per queue, kept across a failed call (claim.lua replays by nonce), and
        # when that nonce's first call was sent (the lease counts from then)
        self._nonce: dict[str, tuple[str, float]] = {}
        self.metrics.in_flight.set_function(lambda: len(self.running))
        self.metrics.abandoned_threads.set_function(lambda: len(self._abandoned))

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

    def _fatal(self, code: int, message: str) -> None:
        """Stop the worker (no grace period) and exit with `code`; the first reason wins."""
        if self._exit_code == EXIT_OK:
            self._exit_code = code
            self.log.error("%s: stopping the worker (exit %d)", message, code)
        self.request_stop()

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio's own reports (e.g. a library's "Unclosed ..." at GC) go through our logger,
        # so --json-logs output stays one JSON object per line.
        exc = context.get("exception")
        self.log.warning("asyncio: %s%s", context.get("message", "unhandled"),
                         f": {type(exc).__name__}: {exc}" if exc else "")  # fmt: skip

    async def run(self, *, install_signals: bool = True) -> int:
        self._loop = loop = asyncio.get_running_loop()
        previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._on_loop_exception)
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        self.log.info(
            "worker %s started: queues=%s concurrency=%d lease=%dms heartbeat=%dms",
            self.id, ",".join(self.settings.queues), self.settings.concurrency,
            self.settings.lease_ms, self.settings.heartbeat_ms,
        )  # fmt: skip
        try:
            await self._guarded("presence", self._beat_workers(), deadline_s=_SETTLE_S)
            hb = self._spawn(self._heartbeat_loop(), "heartbeat")
            reporter = self._spawn(self._reporter_loop(), "reporter")
            # One blocking pop per queue: the queues' keys live in different cluster slots.
            wakers = [self._spawn(self._waker_loop(q.keys.wake), f"waker:{q.name}")
                      for q in self.queues]  # fmt: skip
            claim = self._spawn(self._claim_loop(), "claim")
            await self._stop_claiming.wait()
            fast = self._exit_code != EXIT_OK  # a fatal error: no grace period
            grace_end = time.monotonic() + (0.0 if fast else self.settings.grace_s)
            # a claim in flight may finish (its jobs are then given back), within the grace
            await self._wait_bounded([claim], max(grace_end - time.monotonic(), _STOP_LOOP_S))
            self._closed = True
            self._idle.set()  # lets the wakers see _closed
            for t in wakers:  # a wake-up pop holds nothing: cancel it now
                t.cancel()
            await self._shutdown(reporter, grace_end)
            self._stop_heartbeat.set()
            await self._wait_bounded([hb, *wakers], _STOP_LOOP_S)
            await self._guarded("presence", self._beat_workers(remove=True), deadline_s=2.0)
        finally:
            self._closed = True
            self._shutting_down = True
            self._threads.close()
            loop.set_exception_handler(previous_handler)
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        self.log.info("worker %s stopped", self.id)
        return self._exit_code

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A background loop ended: expected only once shutdown asked it to."""
        if task.cancelled():
            if not self._stop_claiming.is_set():
                self._fatal(EXIT_ERROR, f"loop {task.get_name()} was cancelled")
            return
        exc = task.exception()
        if isinstance(exc, _Fatal):
            self._fatal(exc.code, str(exc))
        elif exc is not None:
            self.log.error("loop %s died", task.get_name(), exc_info=exc)
            self._fatal(EXIT_ERROR, f"loop {task.get_name()} died: {type(exc).__name__}: {exc}")
        elif not self._stop_claiming.is_set():
            self._fatal(EXIT_ERROR, f"loop {task.get_name()} ended early")

    async def _wait_bounded(self, tasks: Sequence[asyncio.Task[None]], timeout_s: float) -> None:
        """Wait for tasks to end, at most timeout_s; cancel what is left and go on (a library
        may swallow a cancellation: the loop's own stop flag ends it later)."""
        tasks = [t for t in tasks if not t.done()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
        for t in pending:
            self.log.warning("loop %s did not stop in %.1fs; cancelled", t.get_name(), timeout_s)
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=0.2)

    async def _guarded(self, what: str, coro: Any, deadline_s: float | None = None) -> None:
        """One call outside a loop (start-up / final presence beat): a transient error is
        logged and counted, a fatal one stops the worker."""
        try:
            if deadline_s is None:
                await coro
            else:
                await _within(coro, deadline_s)
        except _Deadline:
            self.log.warning("%s: no answer from Redis in %.1fs; going on", what, deadline_s)
        except Exception as exc:
            try:
                self._loop_error(what, exc)
            except _Fatal as fatal:
                self._fatal(fatal.code, str(fatal))
            except Exception as bug:
                self.log.error("%s failed", what, exc_info=bug)
                self._fatal(EXIT_ERROR, f"{what} failed: {type(bug).__name__}: {bug}")

    async def _shutdown(self, reporter: asyncio.Task[None], deadline: float) -> None:
        """After claiming stopped. See the module docstring for the order."""
        if self._exit_code != EXIT_OK:
            deadline = time.monotonic()  # a fatal error met meanwhile: no more grace
        never = list(self._backlog) + list(self._behind.values())
        self._backlog.clear()
        self._behind.clear()
        for r in never:  # never started: give them back at once
            r.finished = True
        settle = time.monotonic() + _SETTLE_S
        await self._release(never, settle)
        while self.running and time.monotonic() < deadline:
            self._slot_free.clear()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._slot_free.wait(), deadline - time.monotonic())
        # Reporter: stop it by its flag, let its call in flight end (bounded), then flush all.
        self._stop_reporter.set()
        self._report.set()
        await self._wait_bounded([reporter], _STOP_LOOP_S)
        self._report_gen += 1  # a call that never returned: its reports are sent again here
        sent_c, sent_f = self._sending
        self._sending = ([], [])
        self._completes[:0] = sent_c
        self._fails[:0] = sent_f
        settle = time.monotonic() + _SETTLE_S
        await self._flush(settle)
        leftover = list(self.running.values())
        for r in leftover:
            self._stop(r, "shutdown")
        await self._release(leftover, settle)
        lost = len(self._completes) + len(self._fails)
        if lost:
            self.log.error("%d outcomes could not be reported before exit; their jobs run "
                           "again after the lease", lost)  # fmt: skip

    async def _release(self, rs: Sequence[Running], deadline: float) -> None:
        if not rs:
            return
        by_queue: dict[str, list[Running]] = {}
        for r in rs:
            by_queue.setdefault(r.queue, []).append(r)
        backoff = Backoff()
        while True:
            items = [(self._by_name[qn].script_keys,
                      self._by_name[qn].ops.release([(r.job.id, r.job.token) for r in g]))
                     for qn, g in by_queue.items()]  # fmt: skip
            try:
                replies = await _within(self._pipe.run(items), deadline - time.monotonic())
                err = next((x for x in replies if isinstance(x, BaseException)), None)
                if err is None or classify(err) != "transient":
                    break
                raise err
            except _Deadline:
                break
            except Exception as exc:
                if classify(exc) != "transient" or time.monotonic() >= deadline:
                    self.log.warning("release failed (%s); leases lapse on their own", exc)
                    break
                self._redis_error("release", exc)
                await asyncio.sleep(min(backoff(), max(deadline - time.monotonic(), 0)))
        for r in rs:
            self._held.pop((r.queue, r.job.id), None)
            self.metrics.outcome(r.queue, r.job.task, "released")
            self._log_job("released", r)

    async def _flush(self, deadline: float) -> None:
        backoff = Backoff(cap_s=0.5)
        while (self._completes or self._fails) and time.monotonic() < deadline:
            try:
                await _within(self._send_reports(), deadline - time.monotonic())
            except _Deadline:
                self._restore_sending()
                return
            except _Fatal as exc:
                self._fatal(exc.code, str(exc))
                return
            except Exception as exc:
                if classify(exc) != "transient":
                    self._fatal(EXIT_REDIS_REFUSED, f"flush refused: {type(exc).__name__}: {exc}")
                    return
                self._redis_error("report", exc)
                await asyncio.sleep(min(backoff(), max(deadline - time.monotonic(), 0)))

    def _restore_sending(self) -> None:
        sent_c, sent_f = self._sending
        self._sending = ([], [])
        self._completes[:0] = sent_c
        self._fails[:0] = sent_f

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
                    nonce, t_sent = self._nonce.get(q.name) or (codec.new_nonce(),
                                                                time.monotonic())  # fmt: skip
                    self._nonce[q.name] = (nonce, t_sent)
                    batch = await q.aq.claim(self.id, limit=limit, lease_ms=s.lease_ms,
                                             reap_limit=s.reap_limit, nonce=nonce)  # fmt: skip
                    del self._nonce[q.name]  # answered: the next call gets a fresh nonce
                    self._take(q.name, batch, t_sent)
                    n = len(batch.jobs)
                    claimed += n
                    free -= n
                    full = full or n == limit
                    if batch.next_ms >= 0:
                        sleep_s = min(sleep_s, (batch.next_ms - batch.now_ms) / 1000)
                    if free <= 0:
                        break
            except Exception as exc:
                # The nonce stays: a call whose answer was lost is replayed, not claimed twice.
                self._loop_error("claim", exc)
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

    def _take(self, queue: str, batch: ClaimBatch, t_sent: float) -> None:
        for job in batch.jobs:
            self._start(queue, job, batch.now_ms, t_sent)
        # Jobs in the reply the client could not read (id, token, reason): failed
        # non-retryably so the server parks them, alone.
        for job_id, token, reason in batch.unreadable:
            self._fail_unreadable(queue, job_id, token, reason)

    def _room(self) -> int:
        """How many jobs the next claim may take."""
        s = self.settings
        if len(self._abandoned) >= s.abandoned_cap:
            if not self._capped:
                self._capped = True
                self.metrics.claim_paused.labels("abandoned_threads").set(1)
                self.log.warning("not claiming: %d abandoned handler threads still running "
                                 "(cap %d); waiting for them to end", len(self._abandoned),
                                 s.abandoned_cap)  # fmt: skip
            return 0
        if self._capped:
            self._capped = False
            self.metrics.claim_paused.labels("abandoned_threads").set(0)
            self.log.info("claiming again: abandoned handler threads below the cap")
        ahead = s.prefetch if (self._mean_run_s is not None
                               and self._mean_run_s < PREFETCH_MAX_RUN_S) else 0  # fmt: skip
        return (s.concurrency + ahead - len(self.running) - len(self._backlog)
                - len(self._behind))  # fmt: skip

    async def _idle_wait(self, sleep_s: float) -> None:
        """Sleep until the next due time (a local timer) or an enqueue's wake-up, whichever
        comes first. The waker task does the BLPOP so no blocking call is ever cancelled."""
        self._wake.clear()
        self._idle.set()
        try:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
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
                if got is not None and not self._idle.is_set():
                    # we got busy meanwhile: hand the wake-up on to an idle worker
                    await self.client.lpush(got[0], "1")
            except Exception as exc:
                if self._closed:  # redis-py turns a cancelled BLPOP into a ConnectionError
                    return
                self._loop_error("wake", exc)
                await asyncio.sleep(backoff())
                continue
            backoff.reset()
            if got is not None and self._idle.is_set():
                self._wake.set()

    async def _sleep_or_stop(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_claiming.wait(), delay_s)

    # -- running --------------------------------------------------------------------------
    def _start(self, queue: str, job: ClaimedJob, now_ms: int, t_sent: float) -> None:
        self.claimed += 1
        # The lease counts from when the server ran the claim, which is after we sent it.
        lease_end = t_sent - _LEASE_MARGIN_S + self.settings.lease_ms / 1000
        spec = self.registry._tasks.get(job.task)
        key = (queue, job.id)
        r: Running | None = None
        try:
            ctx = JobContext(job.id, job.task, queue, job.attempts, job.max_attempts, job.token,
                             job.fence, job.run_at_ms, job.claimed_ms)  # fmt: skip
            r = Running(queue, job, ctx, spec, time.monotonic(), lease_end)
            self._held[key] = r
            self._prepare(r, now_ms)
        except Exception as exc:  # one job's data must never take the worker down
            msg = f"the worker could not start this job: {type(exc).__name__}: {exc}"
            self.log.error("job %s: %s", job.id, msg)
            self.running.pop(key, None)
            if r is None:
                ctx = JobContext(job.id, job.task, queue, 0, 0, job.token, 0, 0, 0)
                r = Running(queue, job, ctx, None, time.monotonic(), lease_end)
                self._held[key] = r
            r.finished = True
            self._queue_fail(r, ("InvalidJob", msg, traceback.format_exc()), retryable=False)

    def _prepare(self, r: Running, now_ms: int) -> None:
        job, queue, spec = r.job, r.queue, r.spec
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
        spec.timeout_for(job.timeout_ms)  # a bad number fails here, not in _run
        key = (queue, job.id)
        if key in self._abandoned:  # its previous run is still alive here: wait for it
            self._behind[key] = r
        elif self._can_start():
            self._run(r)
        else:
            self._backlog.append(r)

    def _can_start(self) -> bool:
        return (len(self.running) < self.settings.concurrency and not self._backlog
                and len(self._abandoned) < self.settings.abandoned_cap)  # fmt: skip

    def _fail_unreadable(self, queue: str, job_id: str, token: str, reason: str) -> None:
        job = ClaimedJob(id=job_id, token=token, attempts=0, max_attempts=0, task="?",
                         payload_json="null", run_at_ms=0, claimed_ms=0,
                         backoff=codec.stored_backoff(""), timeout_ms=0,
                         schedule="")  # fmt: skip
        ctx = JobContext(job_id, "?", queue, 0, 0, token, 0, 0, 0)
        r = Running(queue, job, ctx, None, time.monotonic(), time.monotonic() + 1.0)
        r.finished = True
        self._held[(queue, job_id)] = r
        self._queue_fail(r, ("InvalidJob", f"unreadable job: {reason}", ""), retryable=False)

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
                    out: tuple[Any, BaseException | None] = (None, exc)
                else:
                    out = (result, None)
                with contextlib.suppress(RuntimeError):  # the loop is gone: we exited
                    loop.call_soon_threadsafe(self._thread_done, r, *out)

            self._threads.submit(call)

    def _thread_done(self, r: Running, result: Any, exc: BaseException | None) -> None:
        key = (r.queue, r.job.id)
        if self._abandoned.get(key) is r:
            del self._abandoned[key]
            nxt = self._behind.pop(key, None)
            if nxt is not None and not nxt.finished:
                self._backlog.appendleft(nxt)
            self._pump()
        self._finish(r, result, exc)

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
        self._pump()

    def _pump(self) -> None:
        """Start backlog jobs while there are free slots (and the thread cap allows)."""
        cap = self.settings.abandoned_cap
        while (self._backlog and len(self.running) < self.settings.concurrency
               and len(self._abandoned) < cap and not self._shutting_down):  # fmt: skip
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
        tb = "".join(traceback.format_exception(exc))
        self._queue_fail(r, (type(exc).__name__, str(exc), tb), retryable=retryable)

    def _on_timeout(self, r: Running, timeout_s: float) -> None:
        if r.finished:
            return
        self._stop(r, "timeout")
        self._queue_fail(r, ("JobTimeout", f"timed out after {timeout_s:g}s", ""), retryable=True)

    def _stop(self, r: Running, reason: str) -> None:
        """Tell the handler to stop (event; async: cancel) and free its slot. Its result, if
        any comes, is dropped. A sync handler's thread keeps running: it counts as abandoned
        until it returns."""
        if r.finished:
            return
        r.ctx._stop(reason)
        if r.spec is not None and not r.spec.is_async and (r.queue, r.job.id) in self.running:
            self._abandoned[(r.queue, r.job.id)] = r
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
        while not self._stop_reporter.is_set():
            await self._report.wait()
            self._report.clear()
            while (self._completes or self._fails) and not self._stop_reporter.is_set():
                try:
                    await self._send_reports()
                    backoff.reset()
                except Exception as exc:
                    self._loop_error("report", exc)
                    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                        await asyncio.wait_for(self._stop_reporter.wait(), backoff())

    async def _send_reports(self) -> None:
        completes, self._completes = self._completes, []
        fails, self._fails = self._fails, []
        gen = self._report_gen
        self._sending = (completes, fails)
        by_queue: dict[str, list[tuple[Running, Any]]] = {}
        for r, result in completes:
            by_queue.setdefault(r.queue, []).append((r, result))
        calls: list[tuple[list[str], Any]] = []
        try:
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
            if gen == self._report_gen:
                self._sending = ([], [])
                self._completes[:0] = completes
                self._fails[:0] = fails
            raise
        if gen != self._report_gen:
            return  # shutdown took these over and sent them again
        self._sending = ([], [])
        retry: BaseException | None = None
        for items, statuses in zip(by_queue.values(), replies, strict=False):
            retry = self._completed(items, statuses) or retry
        for (r, err, ok), out in zip(fails, replies[len(by_queue) :], strict=True):
            retry = self._failed(r, err, ok, out) or retry
        if retry is not None:
            raise retry  # the loop backs off, then sends what was put back

    def _reply_error(self, what: str, exc: BaseException) -> bool:
        """True when the call is to be sent again (transient); raises _Fatal when fatal."""
        kind = classify(exc)
        if kind == "fatal":
            raise _Fatal(EXIT_REDIS_REFUSED,
                         f"redis refused {what}: {type(exc).__name__}: {exc}")  # fmt: skip
        return kind == "transient"

    def _completed(self, items: list[tuple[Running, Any]], statuses: Any) -> BaseException | None:
        if isinstance(statuses, BaseException):
            if self._reply_error("complete", statuses):
                self._completes[:0] = items
                return statuses
            self.log.error("complete refused: %s", statuses)
            for r, _ in items:
                self._held.pop((r.queue, r.job.id), None)
            return None
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
        return None

    def _failed(
        self, r: Running, err: tuple[str, str, str], retryable: bool, out: Any
    ) -> BaseException | None:
        if isinstance(out, FailOutcome):
            self._held.pop((r.queue, r.job.id), None)
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
            self._held.pop((r.queue, r.job.id), None)
            self.metrics.outcome(r.queue, r.job.task, "stale")
            self._log_job("refused", r, level=logging.WARNING, status=str(out))
        elif isinstance(out, BaseException) and self._reply_error("fail", out):
            self._fails.insert(0, (r, err, retryable))
            return out
        else:
            self._held.pop((r.queue, r.job.id), None)
            self.log.error("fail of job %s errored: %s", r.job.id, out)
        return None

    # -- heartbeat ------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        interval_s = self.settings.heartbeat_ms / 1000
        while not self._stop_heartbeat.is_set():
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._stop_heartbeat.wait(), interval_s)
            if self._stop_heartbeat.is_set():
                return
            try:
                await self._heartbeat()
            except Exception as exc:
                self._loop_error("heartbeat", exc)
            try:  # presence: its own error handling, so a refused beat never skips the above
                await self._beat_workers()
            except Exception as exc:
                self._loop_error("presence", exc)
            # Without a successful heartbeat our leases run out: stop before the server
            # hands the job to someone else.
            now = time.monotonic()
            for r in list(self._held.values()):
                if r.lease_deadline_s <= now and not r.finished:
                    self._stop(r, "lease lost")
            # A job held back behind its own abandoned run: give it back after one lease, so
            # a thread that never ends does not hide the job for good.
            lease_s = self.settings.lease_ms / 1000
            stale = [r for r in self._behind.values() if now - r.started_s > lease_s]
            if stale:
                for r in stale:
                    del self._behind[(r.queue, r.job.id)]
                    r.finished = True
                await self._release(stale, time.monotonic() + _SETTLE_S)

    async def _heartbeat(self) -> None:
        held = list(self._held.values())
        by_queue: dict[str, list[Running]] = {q.name: [] for q in self.queues}
        for r in held:
            by_queue[r.queue].append(r)
        calls: list[tuple[list[str], Any]] = []
        for qn, rs in by_queue.items():
            q = self._by_name[qn]
            if rs:
                leases = [(r.job.id, r.job.token) for r in rs]
                calls.append(
                    (q.script_keys, q.ops.heartbeat(leases, lease_ms=self.settings.lease_ms))
                )
            calls.append((q.script_keys, q.ops.counts()))
        t_sent = time.monotonic()
        replies = await self._pipe.run(calls)
        i = 0
        error: BaseException | None = None
        for qn, rs in by_queue.items():
            if rs:
                reply = replies[i]
                i += 1
                if isinstance(reply, BaseException):
                    error = reply
                else:
                    _, statuses = reply
                    for r in rs:
                        st = statuses.get(r.job.id)
                        if st == "held":
                            r.lease_deadline_s = (t_sent - _LEASE_MARGIN_S
                                                  + self.settings.lease_ms / 1000)  # fmt: skip
                        elif st == "cancelled":
                            self._lost(r, "cancelled")
                        else:
                            self._lost(r, "lease lost")
            counts = replies[i]
            i += 1
            if not isinstance(counts, BaseException):
                self.metrics.set_depth(qn, counts)
        if error is not None:
            raise error

    def _lost(self, r: Running, reason: str) -> None:
        if r.finished:  # finished, outcome not yet acked: the report will be refused
            self._held.pop((r.queue, r.job.id), None)
            return
        self._stop(r, reason)

    async def _beat_workers(self, *, remove: bool = False) -> None:
        ttl = 3 * self.settings.heartbeat_ms
        reqs: list[tuple[Sequence[str], Request]] = [
            (q.script_keys, Script("worker_beat", [
                self.id, str(ttl), "remove" if remove else "beat", socket.gethostname(),
                str(os.getpid()), ",".join(self.settings.queues), str(len(self.running)),
                str(self.settings.concurrency)]))
            for q in self.queues
        ]  # fmt: skip
        for reply in await self._pipe.requests(reqs):
            if isinstance(reply, BaseException):
                raise reply

    # -- helpers --------------------------------------------------------------------------
    def _loop_error(self, what: str, exc: BaseException) -> None:
        """A loop's call failed: transient -> log, count (the caller backs off and retries);
        anything else -> raise _Fatal, which ends the loop and stops the worker."""
        if isinstance(exc, _Fatal) or not isinstance(exc, RedisError | OSError):
            raise exc  # not Redis's: a bug; the loop dies and the runtime stops (EXIT_ERROR)
        kind = classify(exc)
        if kind != "transient":
            raise _Fatal(EXIT_REDIS_REFUSED, f"redis refused the worker's {what} call: "
                         f"{type(exc).__name__}: {exc}")  # fmt: skip
        self._redis_error(what, exc)

    def _redis_error(self, what: str, exc: BaseException) -> None:
        self.metrics.redis_errors.inc()
        self.metrics.redis_backoffs.labels(what, type(exc).__name__).inc()
        hint = "the server is full (maxmemory); " if isinstance(exc, OutOfMemoryError) else ""
        self.log.warning("redis error during %s: %s: %s (%sbacking off, retrying)", what,
                         type(exc).__name__, exc, hint)  # fmt: skip

    def _log_job(self, event: str, r: Running, level: int = logging.INFO, **extra: Any) -> None:
        logs.transition(self.log, event, queue=r.queue, job_id=r.job.id, task=r.job.task,
                        attempt=r.job.attempts, token=r.job.token, level=level, worker=self.id,
                        **extra)  # fmt: skip
