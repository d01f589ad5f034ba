"""The state every part of the worker shares, and the error policy of its loops: a Redis
error is classified (scheduler.worker.execution.classify), transient ones are logged, counted and
retried, anything else stops the worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.core import cluster_io
from scheduler.core.connection import is_cluster
from scheduler.core.errors import CorruptKey, NewerStorage
from scheduler.core.keys import QueueKeys
from scheduler.operations.ops import Ops, Settings
from scheduler.worker import logs, outcomes
from scheduler.worker.execution import Pipeline, Running, ThreadRunner, classify
from scheduler.worker.holding_claim import HoldingClaim
from scheduler.worker.log_limit import LogLimit
from scheduler.worker.metrics import WorkerMetrics
from scheduler.worker.registry import Registry
from scheduler.worker.settings import _CLAIM_WAIT_S, EXIT_OK, EXIT_REDIS_REFUSED, WorkerSettings
from scheduler.worker.settings import check_worker_id as check_worker_id


class _Queue:
    """Per-queue state of this worker."""

    def __init__(self, client: aredis.Redis, name: str, clock: str) -> None:
        self.aq = HoldingClaim(client, name, _clock=clock)  # its claim says what is held
        self.name = name
        self.keys = QueueKeys(name)
        self.script_keys = self.keys.script_keys()
        self.ops = Ops(self.keys, Settings())
        self._ops_by_ttl: dict[int, Ops] = {}

    def ops_for(self, result_ttl_ms: int) -> Ops:
        """Ops whose complete keeps the outcome for result_ttl_ms (one per retention used)."""
        if (ops := self._ops_by_ttl.get(result_ttl_ms)) is None:
            ops = self._ops_by_ttl[result_ttl_ms] = Ops(self.keys, Settings(result_ttl_ms))
        return ops


class _Fatal(Exception):
    """A loop met an error retrying cannot help with; the worker stops with `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Deadline(Exception):
    """_within: the call did not end in time (it may still be running)."""


async def _within(coro: Any, timeout_s: float) -> Any:
    """Await coro for at most timeout_s. Unlike asyncio.wait_for this does not wait for the
    cancelled call to wind down: a library that swallows the cancellation cannot hang us. Out of
    time, or cancelled itself (a loop cut at shutdown), it cancels the call and reads the error
    it may still end in (else asyncio prints "Task exception was never retrieved" past the logs)."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.05))
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
    if not done:
        raise _Deadline
    return task.result()


async def _or_timeout(coro: Any, timeout_s: float | None) -> Any:
    """Await coro; with timeout_s, at most that long, then cancel it and raise a redis
    TimeoutError (transient, as a socket timeout is)."""
    if timeout_s is None:
        return await coro
    try:
        return await _within(coro, timeout_s)
    except _Deadline:
        raise RedisTimeoutError(f"no answer in {timeout_s:g} s") from None


class WorkerCore:
    """State shared by the worker's parts (claiming, dispatch, reporting, heartbeats and
    presence, the runtime); the parts are mixins over it, wired in runtime.Worker."""

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
        check_worker_id(worker_id)
        self.client = client
        self.registry = registry
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.metrics = metrics or WorkerMetrics()
        self.metrics.tasks = registry  # an unknown task's jobs: one series, not one per name
        self.log = logger or logging.getLogger(logs.LOGGER)
        self._clock = _clock
        self.queues = [_Queue(client, n, _clock) for n in self.settings.queues]
        self._result_ttl_ms = self.settings.result_ttl_ms or Settings.result_ttl_ms
        self._by_name = {q.name: q for q in self.queues}
        self._pipe = Pipeline(client, _clock)
        self._threads = ThreadRunner()
        self._log_limit = LogLimit()  # repeated "redis error during ..." / report lines
        self.running: dict[tuple[str, str], Running] = {}  # handler still running
        self._held: dict[tuple[str, str], Running] = {}  # leased until the outcome is acked
        self._completes: list[tuple[Running, Any]] = []
        self._fails: list[tuple[Running, tuple[str, str, str], bool]] = []
        # The reports a call has in flight: shutdown re-sends them if the call never returns
        # (complete and fail are idempotent per token).
        self._sending: tuple[list[tuple[Running, Any]], list[Any]] = ([], [])
        self._report_gen = 0
        # Runs stopped (timeout, lease expired, ...) whose thread or task is still running, and
        # jobs claimed again while such a run of theirs is alive: they start when it ends.
        self._abandoned: dict[tuple[str, str], Running] = {}
        self._behind: dict[tuple[str, str], Running] = {}
        self._capped = False
        # (queue, job id) of the suspects leased (ClaimBatch.suspect): the claim loop claims
        # again when one's lease is gone (_forget); the suspects it skipped sent no wake-up.
        self._suspects: set[tuple[str, str]] = set()
        self._alone: tuple[str, str] | None = None  # the one on its last attempt (alone.py)
        self._stop_claiming, self._stop_reporter = asyncio.Event(), asyncio.Event()
        # _beat_now: set to send a heartbeat now (also set with _stop_heartbeat, to end its wait).
        self._stop_heartbeat, self._beat_now = asyncio.Event(), asyncio.Event()
        self._slot_free, self._wake = asyncio.Event(), asyncio.Event()
        self._report, self._idle = asyncio.Event(), asyncio.Event()
        # The reporter's last call failed; _report_retry ends its backoff (and is set with
        # _stop_reporter), _report_tried is set after each of its calls (_reports_first).
        self._report_failing = False
        self._report_retry, self._report_tried = asyncio.Event(), asyncio.Event()
        self._signals, self._closed, self._shutting_down = 0, False, False
        self._exit_code = EXIT_OK
        self._loop: asyncio.AbstractEventLoop | None = None
        self.claimed = 0
        self.names_read = False  # its queues' partitions records read (the CLI's start): not again
        self._backlog: deque[Running] = deque()
        # Runs that could not start for a reason of this process (no thread): released by the
        # heartbeat loop; claiming pauses until _no_claim_until (monotonic, 0: not paused).
        self._give_back: list[Running] = []
        self._no_claim_until = 0.0
        self._loops: dict[str, asyncio.Task[None]] = {}  # the runtime's background loops
        self._no_grace = False  # run() was cancelled: shut down as after a fatal error
        self._mean_run_s: float | None = None  # EWMA of handler run time
        # claim nonce per queue, kept across a failed call (claim.lua replays by nonce), and
        # when that nonce's first call was sent (the lease counts from then)
        self._nonce: dict[str, tuple[str, float]] = {}
        # Several queues (a partitioned queue's partitions): a queue whose claim took nothing
        # is skipped until this monotonic time (its next due time, its own wake-up, a retry of
        # one of its jobs, or claiming._SKIP_MAX_S), so an empty partition costs about one
        # claim a second instead of one per claim of the others.
        self._skip_until: dict[str, float] = {}
        # Partitions on several cluster nodes: a claim on a node that hangs (no answer, no
        # error: 20 s and more with redis-py's retries) must not hold up the others' claims.
        # Its lost answer is replayed by its nonce, as after any failed claim.
        self._claim_wait_s = _CLAIM_WAIT_S if is_cluster(client) and len(self.queues) > 1 else None
        # There too, a claim refused while its partition's slot moves (TRYAGAIN) fails at once
        # and that partition sits out its skip: the others' claims do not wait out its ~0.5 s
        # of re-sends (cluster_io; docs/cluster.md). None: the driver's default.
        self._claim_resends = None if self._claim_wait_s is None else 0
        # Queues _due_soon named since their claim now in flight was sent: that claim's answer
        # (it ran before the retry) must not set a skip.
        self._due_again: set[str] = set()
        self.metrics.in_flight.set_function(lambda: len(self.running))
        self.metrics.abandoned_threads.set_function(lambda: len(self._abandoned))

    async def _claim_call(self, call: Any) -> Any:
        """Await one claim call with this worker's wait and TRYAGAIN re-sends (set for this
        call only: the handlers the claim loop starts keep the driver's default)."""
        if self._claim_resends is None:
            return await _or_timeout(call, self._claim_wait_s)
        resending = cluster_io.TRYAGAIN_ROUNDS.set(self._claim_resends)
        try:
            return await _or_timeout(call, self._claim_wait_s)
        finally:
            cluster_io.TRYAGAIN_ROUNDS.reset(resending)

    def _node_of(self, key: str) -> str:
        """The cluster node holding `key` (calls are grouped by it: a node that fails fails
        only its own queues' calls)."""
        client: Any = self.client  # a redis.asyncio RedisCluster here
        try:
            return str(client.get_node_from_key(key).name)
        except Exception:  # no slot map yet (a node down, a refresh): the key alone
            return key

    def _due_soon(self, queue: str) -> None:
        """A job of `queue` is due again without a wake-up token (fail.lua's retry pushes
        none): end the idle wait and the queue's skip, so the claim loop re-plans its sleep
        around the job's run_at instead of the skip's end or the idle safety net."""
        self._skip_until.pop(queue, None)
        self._due_again.add(queue)
        self._wake.set()

    def request_stop(self) -> None:
        """Stop claiming and shut down gracefully (what the first SIGTERM/SIGINT does). Thread-safe:
        called off its running loop's thread (an app's atexit hook), it is handed to that loop."""
        if (loop := self._loop) and loop.is_running() and asyncio._get_running_loop() is not loop:
            with contextlib.suppress(RuntimeError):  # closed since: no waiter, set them here
                loop.call_soon_threadsafe(self.request_stop)
                return
        self._stop_claiming.set()
        self._wake.set()
        self._slot_free.set()
        self._report_tried.set()  # ends the claim loop's wait for the reporter (_reports_first)

    def _fatal(self, code: int, message: str) -> None:
        """Stop the worker (no grace period) and exit with `code`; the first reason wins."""
        if self._exit_code == EXIT_OK:
            self._exit_code = code
            self.log.error("%s: stopping the worker (exit %d)", message, code)
        self.request_stop()

    # -- the loops' error policy and logging -------------------------------------------
    def _forget(self, r: Running) -> None:
        """r no longer holds a lease here. Only r's own entry goes: the same job claimed again
        (its lease lapsed while r ran) is another Running under the same key."""
        key = (r.queue, r.job.id)
        if self._held.get(key) is r:
            del self._held[key]
            # A suspect's lease gone (settled, lost, released): claim the next one now, not at
            # its handler's end (a claim sent before the outcome landed skipped it and slept).
            if self._suspects and key in self._suspects:
                self._suspects.discard(key)
                self._due_soon(r.queue)
            if key == self._alone or not self._held:  # ran one alone, or drained (alone.py)
                self._slot_free.set()

    def _loop_error(self, what: str, exc: BaseException) -> None:
        """A loop's call failed: transient -> log, count (the caller backs off and retries);
        anything else -> raise _Fatal, which ends the loop and stops the worker."""
        if isinstance(exc, _Fatal):
            raise exc
        if classify(exc) == "transient":  # also redis-py's cluster errors, not RedisErrors
            self._redis_error(what, exc)
            return
        if not isinstance(exc, RedisError | OSError):
            raise exc  # not Redis's (a cross-slot call too): a bug; the runtime stops (EXIT_ERROR)
        # Redis keeps a script's writes made before a command it refused (an ACL edited
        # mid-run): `scheduler doctor` finds and repairs what such a call left half-done.
        raise _Fatal(
            EXIT_REDIS_REFUSED,
            f"redis refused the worker's {what} call: {type(exc).__name__}: {exc} (once fixed, "
            "run `scheduler doctor`: a script refused part-way may leave a job to repair)",
        )

    def _redis_error(self, what: str, exc: BaseException) -> None:
        self.metrics.redis_errors.inc()
        self.metrics.redis_backoffs.labels(what, type(exc).__name__).inc()
        hint = ""
        if isinstance(exc, OutOfMemoryError):
            hint = "the server is full (maxmemory); "
        elif isinstance(exc, CorruptKey):
            hint = "a queue key was edited by hand: see `scheduler doctor`; "
        elif isinstance(exc, NewerStorage):
            hint = "upgrade this worker; "
        note = self._log_limit.admit((what, type(exc).__name__))
        if note is None:
            return
        self.log.warning("redis error during %s: %s: %s (%sbacking off, retrying%s)",
                         what, type(exc).__name__, exc, hint, note)  # fmt: skip

    def _ttl_for(self, r: Running) -> int:
        """Outcome retention: the task's default, else this worker's, else 1 h."""
        t = r.spec.result_ttl_ms if r.spec is not None else None
        return self._result_ttl_ms if t is None else t

    def _log_job(self, event: str, r: Running, level: int = logging.INFO, **extra: Any) -> None:
        logs.transition(
            self.log,
            event,
            queue=r.queue,
            job_id=r.job.id,
            task=r.job.task,
            attempt=r.job.attempts,
            token=r.job.token,
            level=level,
            worker=self.id,
            # A run that ended (done, retry, dead, timeout, ...) says how long it took.
            **(extra if r.run_s is None else {"duration_ms": int(r.run_s * 1000), **extra}),
        )
        if self.registry.outcome_hooks and event != "claimed":
            outcomes.emit(self.registry.outcome_hooks, event, r, extra, self.log)
