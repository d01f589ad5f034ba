"""Worker settings, exit codes and timing constants."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from scheduler.core import claim_reply, codec, exits
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.core.limits import DEFAULT_LEASE_MS

# One exit-code table for every command (scheduler/core/exits.py), under the worker's names.
EXIT_OK, EXIT_ERROR, EXIT_USAGE = exits.EXIT_OK, exits.EXIT_ERROR, exits.EXIT_USAGE
EXIT_IMPORT, EXIT_REDIS = exits.EXIT_IMPORT, exits.EXIT_REDIS
EXIT_REDIS_REFUSED, EXIT_FORCED = exits.EXIT_REDIS_REFUSED, exits.EXIT_FORCED

_MAX_IDLE_SLEEP_S = 30.0  # safety net: re-claim at least this often even with no wake-up
PREFETCH_MAX_RUN_S = 0.02
# Claim hysteresis: while jobs are short (prefetching) and the worker is busy, claim only once
# this many slots are free (capped at half the worker's capacity), so one claim call carries
# a batch rather than a job or two. An idle worker claims at once, whatever is free.
CLAIM_MIN_FREE = 48
_WAKE_BLOCK_S = 1  # BLPOP timeout; the due-time timer is local, so precision does not matter
# Several partitions on a cluster: a claim unanswered this long fails (its node hangs), so
# the others are claimed from; claims take milliseconds, a lost answer is replayed by nonce.
_CLAIM_WAIT_S = 1.0
_LEASE_MARGIN_S = 0.05  # local lease view ends this much before the server's
_STOP_LOOP_S = 1.0  # how long shutdown waits for one loop to notice its stop flag
_SETTLE_S = 5.0  # shutdown budget for flushing outcomes and releasing when Redis is slow
MAX_GRACE_S = 86_400.0  # a day, as the longest lease: a finite wait the event loop can arm


class SettingsError(BadArgument):
    """The worker refuses to start with these settings."""


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs (the `scheduler worker` options); `check()` refuses unsafe values.

    Attributes:
        queues: the queues to claim from, at least one.
        concurrency: handlers running at once, >= 1.
        lease_ms: lease length given at claim and at each heartbeat, >= 3 x heartbeat_ms and
            within [1 ms, 1 day] (codec.LIMITS).
        heartbeat_ms: interval between heartbeats, >= 10 ms.
        batch_size: most jobs per claim call, in [1, 1000].
        grace_s: on shutdown, how long running handlers may finish before their jobs are
            released, a finite number in [0 s, 1 day].
        reap_limit: most lapsed leases one claim reaps, in [0, 10,000]; the script reaps
            500 at most per claim (the rest on the next claims).
        prefetch: jobs claimed beyond the free slots while jobs are short, >= 0.
        max_abandoned_threads: stopped handlers (timeout, lost lease, cancel) still running
            (sync threads, async tasks that ignored their cancel) before the worker stops
            claiming, >= 1; None: 2 x concurrency.
        result_ttl_ms: how long jobs this worker completes keep their record and result,
            in [1 ms, 366 days], unless the task says otherwise; None: 1 h.
        burst: stop, as after a SIGTERM, once a round of claims over every queue takes
            nothing and this worker holds no job (none running, none awaiting its outcome's
            answer): what is claimable now runs, jobs due later (a retry's backoff too) and
            jobs held back by flow control are left. For tests and one-off drains.
        max_jobs: stop, as after a SIGTERM, once this many jobs were claimed and have ended
            (>= 1; None: no limit): a process recycled, as Celery's max-tasks-per-child.
        max_memory_mb: stop the same way once the process's resident memory, read before each
            claim, is over this many MB (>= 1; None: no limit).
    """

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 16
    lease_ms: int = DEFAULT_LEASE_MS
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
    # How long a job this worker completes keeps its outcome record (status, result), unless
    # its task says otherwise (registry.task(result_ttl_ms=...)). None: codec.RESULT_TTL_MS.
    result_ttl_ms: int | None = None
    burst: bool = False
    max_jobs: int | None = None
    max_memory_mb: int | None = None

    @property
    def abandoned_cap(self) -> int:
        """The effective max_abandoned_threads (2 x concurrency when None)."""
        m = self.max_abandoned_threads
        return 2 * self.concurrency if m is None else m

    def check(self) -> None:
        """Raise SettingsError (a BadArgument) on values the worker must not start with. Every
        count is an int (not a bool, not a float: a nan passed every `<` test and stalled or
        stopped the worker after it started)."""
        queues = self.queues
        if isinstance(queues, str) or not isinstance(queues, tuple | list):
            # A bare str is iterated letter by letter: a worker of queues 'e', 'm', 'a', ...
            raise SettingsError(f"queues must be a tuple of queue names, got {queues!r:.80}")
        if not all(isinstance(q, str) for q in queues):
            raise SettingsError(f"queues must be a tuple of queue names, got {queues!r:.80}")
        if not queues:
            raise SettingsError("give at least one queue")
        for q in queues:
            try:
                QueueKeys(q)
            except BadArgument as exc:  # the SettingsError an app catches around Worker(...)
                raise SettingsError(str(exc)) from None
        _count(self.concurrency, "concurrency", 1)
        _count(self.batch_size, "batch size", 1, 1000)
        _count(self.heartbeat_ms, "heartbeat_ms", 10)
        # The claim and heartbeat scripts refuse a lease outside LIMITS: refused here, at start,
        # rather than by the first claim (a crash). heartbeat <= lease / 3 bounds it too.
        _within(self.lease_ms, "lease_ms")
        _within(self.reap_limit, "reap_limit")
        if self.lease_ms < 3 * self.heartbeat_ms:
            raise SettingsError(
                f"unsafe: lease {self.lease_ms} ms is less than 3 heartbeat intervals "
                f"({3 * self.heartbeat_ms} ms); a single slow heartbeat would lose every lease. "
                "Raise --lease-ms or lower --heartbeat-ms."
            )
        _count(self.prefetch, "prefetch", 0)
        # not (0 <= nan), not (inf <= MAX): a nan or inf grace would fail only at the SIGTERM
        # it is for. Compared, not math.isfinite: an int past a float's range (10**400) raised
        # OverflowError there; Python compares an int with a float exactly.
        grace = self.grace_s
        if (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not (0 <= grace <= MAX_GRACE_S)
        ):
            raise SettingsError(f"grace must be within 0..{MAX_GRACE_S:g} s, got {grace!r:.40}")
        if not isinstance(self.burst, bool):
            raise SettingsError(f"burst must be True or False, got {self.burst!r:.40}")
        if self.result_ttl_ms is not None:
            _within(self.result_ttl_ms, "result_ttl_ms")
        if self.max_jobs is not None:
            _count(self.max_jobs, "max_jobs", 1)
        if self.max_memory_mb is not None:
            _count(self.max_memory_mb, "max_memory_mb", 1)
        if self.max_abandoned_threads is not None:
            _count(self.max_abandoned_threads, "max_abandoned_threads", 1)


def _count(value: object, name: str, lo: int, hi: int | None = None) -> None:
    """SettingsError unless `value` is an int (not a bool) in [lo, hi]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        want = f"an int >= {lo}" if hi is None else f"an int within {lo}..{hi}"
        raise SettingsError(f"{name} must be {want}, got {value!r:.40}")


def _within(value: int, name: str) -> None:
    """SettingsError unless `value` is an int within codec.LIMITS[name]."""
    try:
        codec.check_int(value, name)
    except BadArgument as exc:
        raise SettingsError(str(exc)) from None


def check_worker_id(worker_id: str | None) -> None:
    """A worker id the first claim would refuse (a crash, exit 1): SettingsError at start."""
    if worker_id is not None:
        try:
            claim_reply.check_worker_id(worker_id)
        except BadArgument as exc:
            raise SettingsError(str(exc)) from None


def check_run(ran: bool, install_signals: bool) -> None:
    """Worker.run()'s refusals, before it changes anything of the app's loop: a second run (its
    stop flags, loops and thread pool are the first run's, ended: it returned 0 at once), and
    signals asked for on a thread other than the main one (asyncio's bare RuntimeError)."""
    if ran:
        raise BadArgument("this Worker has run already: make a new Worker to run again")
    if install_signals and threading.current_thread() is not threading.main_thread():
        raise BadArgument(
            "Worker.run() on a thread other than the main one takes install_signals=False: "
            "only the main thread gets signals"
        )
