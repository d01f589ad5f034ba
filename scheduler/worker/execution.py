"""Pieces the worker is built from: the per-job record, a thread pool that can abandon a thread,
and a driver that sends several sans-I/O operations in one pipeline."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.core.connection import cluster_unreachable
from scheduler.core.direct_io import transport_race
from scheduler.core.errors import (
    REFUSED_UNTIL_FIXED,
    CorruptKey,
    SchedulerError,
    is_permission_error,
    refused_for_now,
)
from scheduler.core.models import ClaimedJob
from scheduler.core.scripts import Scripts, run_async
from scheduler.operations.ops import Op, Request, Script, ScriptPipeline
from scheduler.worker import fork_guard
from scheduler.worker.metrics import TaskStats
from scheduler.worker.registry import JobContext, TaskSpec

# Errors after which a call is retried later (the worker carries on; nothing is lost).
TRANSIENT: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)

# How the worker treats each Redis error (classify):
#   transient  the server cannot serve the call now: a dropped connection, a timeout, OOM
#              (maxmemory with noeviction), BUSY (a slow script), LOADING, READONLY (a failover
#              in progress), TRYAGAIN / CLUSTERDOWN / MASTERDOWN, MISCONF (a failed RDB save),
#              NOSCRIPT left after the driver's reloads; on a cluster, redis-py's own errors
#              when no node answers or the slot map is being rebuilt (RedisClusterException
#              "cannot be connected", SlotNotCoveredError, ClusterError "TTL exhausted");
#              an AttributeError / TypeError from asyncio's transport, or uvloop's RuntimeError
#              "the handler is closed", on a dropped connection (direct_io.transport_race);
#              a CorruptKey (a queue key edited by hand into another type: the script
#              refused, nothing written, until the key is fixed), a NewerStorage (the queue
#              is stored by a newer version: until this worker is upgraded):
#              log, count, back off, retry (a stopping worker's: given up, retry_at_stop).
#   fatal      retrying cannot help: authentication / ACL permission (NOPERM), and any other
#              error where a call of the worker's own loop is refused (a bug, an unknown
#              command): the worker stops with EXIT_REDIS_REFUSED and says why. A cross-slot
#              call refused by redis-py itself is a bug of ours (WorkerCore._loop_error).
#   refused    (replies to one job's report only) that job's outcome was refused: logged, the
#              lease lapses and the job is retried by the server's rules.
_FATAL = (AuthenticationError, AuthorizationError, NoPermissionError)


def wake_error(exc: BaseException) -> CorruptKey | None:
    """A wake-up pop refused as WRONGTYPE: a wake-up key edited by hand into another type. It
    is advisory (the next enqueue's wake-up replaces it; doctor names it): the worker claims by
    polling meanwhile instead of stopping (exit 5, which supervisors do not restart)."""
    if isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE"):
        return CorruptKey(f"a wake-up key is of another type: {exc}")
    return None


def may_resend(exc: BaseException) -> bool:
    """A report's error that classify may call transient: not one of ours (an answer read as an
    error, or its arguments refused and never sent: sending again changes nothing), except a
    key edited by hand or a newer storage, sent again once fixed."""
    return not isinstance(exc, SchedulerError) or isinstance(exc, REFUSED_UNTIL_FIXED)


def retry_at_stop(exc: BaseException) -> bool:
    """A call of a stopping worker to send again until the settle bound: a transient error, but
    not one refused until a key is fixed or this worker upgraded, which no stop sees."""
    return classify(exc) == "transient" and not isinstance(exc, REFUSED_UNTIL_FIXED)


def classify(exc: BaseException) -> str:
    """'transient' | 'fatal' | 'refused' (see above)."""
    if isinstance(exc, _FATAL):
        return "fatal"
    if isinstance(exc, TRANSIENT):
        return "transient"
    if isinstance(exc, REFUSED_UNTIL_FIXED):
        # A queue key edited by hand into another type, or a queue a newer version stores,
        # refused with nothing written: that queue waits for the fix (`scheduler doctor`, or
        # this worker's upgrade), the worker's other queues go on.
        return "transient"
    if isinstance(exc, ResponseError):
        if isinstance(exc, NoScriptError) or refused_for_now(exc):
            return "transient"
        code = str(getattr(exc, "status_code", "") or str(exc).split(" ", 1)[0]).upper()
        # Also Redis 7.0's ACL refusal inside a script, which has no NOPERM code: as "refused",
        # a report's refusal dropped its outcome and the worker went on running jobs.
        if code in ("NOAUTH", "WRONGPASS") or is_permission_error(exc):
            return "fatal"
        return "refused"
    if cluster_unreachable(exc) or transport_race(exc):  # redis-py's cluster path has no
        return "transient"  # direct_io to turn the race into a ConnectionError
    return "fatal"


@dataclass(eq=False)
class Running:
    """One claimed job, from claim until the server acknowledged its outcome."""

    queue: str
    job: ClaimedJob
    ctx: JobContext
    spec: TaskSpec | None
    started_s: float  # monotonic
    lease_deadline_s: float  # monotonic; conservative local view of the lease end
    # The local lease end may stop it: from its claim, or, claimed by a re-sent call (whose
    # lease counts from the first send, long past if that one never arrived), from the first
    # heartbeat sent for it.
    beat_sent: bool = True
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    finished: bool = False  # the handler's outcome is decided (or it was stopped)
    payload: Any = None
    timeout_s: float | None = None
    error: BaseException | None = None  # the handler's, for the outcome hooks (outcomes.py)
    retry_delay_ms: int | None = None  # a RetryLater's delay: its retry's, not the backoff's
    # Its (queue, task) metrics, looked up once at claim (lateness, duration, done).
    stats: TaskStats | None = None
    run_s: float | None = None  # how long its handler ran, once it ended (Dispatch._end): logged


class _Slot:
    """A running handler task that takes the next async job when its run ends (_run_async)."""

    __slots__ = ("next", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.next: Running | None = None


class ThreadRunner:
    """Runs sync handlers in threads. Unlike ThreadPoolExecutor it has no size cap of its own: the
    worker's concurrency slots bound the running jobs and its `max_abandoned_threads` the threads
    abandoned after a timeout or a lost lease (which must not block the next job). Idle threads
    exit after `idle_s`."""

    def __init__(self, idle_s: float = 30.0) -> None:
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.threads = 0
        self._idle_s = idle_s
        self._closed = False

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # reserve an idle thread
            else:
                self.threads += 1
                try:
                    threading.Thread(target=self._loop, name="sched-job", daemon=True).start()
                except BaseException:  # "can't start new thread" (a pids limit): none added
                    self.threads -= 1
                    raise
        self._work.put(fn)

    def _loop(self) -> None:
        # This thread's process: a child a handler forked returns here with another pid (not
        # the process that built the runner: a worker built and then forked runs fine).
        pid = os.getpid()
        while True:
            try:
                fn = self._work.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody reserved us: leave
                        self._idle -= 1
                        self.threads -= 1
                        return
                continue  # reserved: the item is on its way
            if fn is None:
                with self._lock:
                    self.threads -= 1
                return
            fn()
            if os.getpid() != pid:  # a child the handler forked returned here
                fork_guard.child_exit("returned from its handler")
            fn = None  # its closure (the run, a raised exception's frames) is not kept while idle
            with self._lock:
                if self._closed:  # a busy thread at close: it ends now, not after idle_s
                    self.threads -= 1
                    return
                self._idle += 1

    def close(self) -> None:
        """Ask idle threads to exit, and busy ones to exit once their job returns (they are
        daemons: one that never returns does not hold up the process's exit)."""
        with self._lock:
            self._closed = True
            n, self._idle = self._idle, 0
        for _ in range(n):
            self._work.put(None)


class Pipeline:
    """Send single-request operations of several queues in one round trip, through the one
    driver (scheduler.core.scripts.Scripts.drive: NOSCRIPT is reloaded and re-sent there)."""

    def __init__(self, client: aredis.Redis, clock: str = "server") -> None:
        self.client = client
        self.scripts = Scripts(clock=clock)

    async def requests(self, items: Sequence[tuple[Sequence[str], Request]]) -> list[Any]:
        """Each request's reply, or the error its reply carried. Connection errors propagate."""
        if not items:
            return []
        return await run_async(self.client, self.scripts.drive(items))

    async def run(self, items: Sequence[tuple[list[str], Op[Any]]]) -> list[Any]:
        """items: (script KEYS, operation). Returns each operation's result, or the exception
        its reply raised (a refused lease, a script error) or its arguments did (not sent).
        Connection errors propagate."""
        ops: list[Op[Any] | None] = []
        reqs: list[tuple[Sequence[str], Request]] = []
        out: list[Any] = []
        for keys, op in items:
            try:
                req = op.send(None)
            except StopIteration as done:  # answered without a request
                ops.append(None)
                out.append(done.value)
                continue
            except Exception as exc:  # its arguments refused (BadArgument): that call alone
                ops.append(None)  # is not sent, the others are (one bad report held them all)
                out.append(exc)
                continue
            # A ScriptPipeline: a settle call of more than SETTLE_CHUNK leases, as several
            # calls (operations/leasing.py _chunked); drive answers it as one list.
            if not isinstance(req, Script | ScriptPipeline):
                raise TypeError("Pipeline runs script operations only")
            reqs.append((keys, req))
            ops.append(op)
            out.append(None)
        replies = iter(await self.requests(reqs))
        for i, sent in enumerate(ops):
            if sent is None:
                continue
            op, reply = sent, next(replies)
            if isinstance(reply, BaseException):
                out[i] = reply
                op.close()
                continue
            try:
                op.send(reply)
            except StopIteration as done:
                out[i] = done.value
            except Exception as exc:  # a parser refusing the reply (StaleToken, ...)
                out[i] = exc
            else:
                raise TypeError("operation asked for a second request")
        return out


class RetryDelay:
    """Delays between retries of a failing Redis call: 50 ms doubling to 1 s. The wait is
    the only cost of a retry, so the cap is short: a Redis Cluster failover promotes a replica
    ~8 s after the primary died, and a worker capped at 5 s sat idle up to 4.5 s after it
    (docs/durability.md); at 1 s each loop tries at most once a second while Redis is away."""

    def __init__(self, first_s: float = 0.05, cap_s: float = 1.0) -> None:
        self.first_s, self.cap_s, self.next_s = first_s, cap_s, first_s

    def __call__(self) -> float:
        d = self.next_s
        self.next_s = min(self.next_s * 2, self.cap_s)
        return d

    def reset(self) -> None:
        self.next_s = self.first_s
