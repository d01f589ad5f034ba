"""A worker that stops by itself, as after a SIGTERM (exit 0): burst mode (`burst`, run what
is claimable now, for tests and one-off drains) and the job quota (`max_jobs`, a process
recycled after N jobs, as Celery's max-tasks-per-child, or once over `max_memory_mb`, as its
max-memory-per-child: a handler that leaks memory or file descriptors is contained; the pool or
the service manager starts the next process)."""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time

from scheduler.worker.core import WorkerCore
from scheduler.worker.execution import Running
from scheduler.worker.settings import EXIT_ERROR, EXIT_USAGE

BURST_FAILING_S = 30.0  # a burst worker whose claims of a queue fail this long stops (exit 1)


class SelfStop(WorkerCore):
    """When a burst worker is done, and when a worker's job quota is used up."""

    _quota_met = False

    def _burst_next(self, rounded: bool) -> bool:
        """After a round of claims that took nothing and all answered. rounded: every queue
        was claimed from in it. True: claim again now (the worker may be stopping), False:
        wait as usual. Jobs held here (running, waiting to start or for their outcome to be
        acknowledged) may still release dependants or retry at once: not done yet."""
        if not rounded:  # a queue that sat the round out may have jobs due since
            self._skip_until.clear()
            return True
        if self._held or self._nonce:
            return False
        if self._wake.is_set():
            # Since the round's claims were sent: the last job held ended (its complete may
            # have released dependants those claims did not see), an enqueue, a retry due.
            return True
        self.log.info("burst: nothing claimable is left; stopping")
        self.request_stop()
        return True

    def _quota(self, room: int) -> int:
        """`room` (what the next claim may take) within what is left of max_jobs, or 0 once
        the quota is used up or the process is over max_memory_mb (read before each claim,
        so only while the option is set): no more claims; the worker stops once the jobs it
        holds have ended, each within its task's timeout; with a job that has none running (or
        starting later: Dispatch._run), at once as after a SIGTERM (grace, then released)."""
        s = self.settings
        if s.max_jobs is None and s.max_memory_mb is None:
            return room
        if not self._quota_met:
            why = None
            if s.max_jobs is not None and self.claimed >= s.max_jobs:
                why = f"max_jobs: {self.claimed} jobs claimed"
            elif s.max_memory_mb is not None:
                rss = rss_mb()
                if rss is not None and rss > s.max_memory_mb:
                    why = f"max_memory_mb: {rss:.0f} MB resident, over {s.max_memory_mb} MB"
                    if not self.claimed:  # a replacement would stop at once too, for ever
                        self._fatal(EXIT_USAGE, f"{why} before its first job: raise it")
                        return 0
            if why is None:
                return room if s.max_jobs is None else min(room, s.max_jobs - self.claimed)
            self._quota_met = True
            self.log.info("%s; stopping once the %d jobs held end", why, len(self._held))
            # A running job with no timeout may never end: stop as a SIGTERM does (--grace,
            # then its lease is released); one with a timeout ends by it.
            untimed = any(r.timeout_s is None for r in self.running.values())
            if not self._held or untimed:  # after the claim loop's wait begins
                asyncio.get_running_loop().call_soon(self.request_stop)
        return 0

    def _loop_error(self, what: str, exc: BaseException) -> None:
        """A burst worker whose claims of a queue have failed for BURST_FAILING_S (a queue
        key edited by hand, a node gone) stops with exit 1: it would never find that queue
        empty, so never end."""
        super()._loop_error(what, exc)
        if what != "claim" or not self.settings.burst or not self._nonce:
            return
        if time.monotonic() - min(t for _, t in self._nonce.values()) > BURST_FAILING_S:
            self._fatal(EXIT_ERROR, f"burst: claims have failed for over {BURST_FAILING_S:g} "
                                    f"s ({type(exc).__name__}: {exc})")  # fmt: skip

    def _forget(self, r: Running) -> None:
        super()._forget(r)
        if self._held:
            return
        if self._quota_met:
            self.request_stop()
        elif self.settings.burst:
            self._wake.set()  # the last job held ended: one more round decides


def rss_mb() -> float | None:
    """This process's resident memory in MB: /proc/self/statm on Linux, else the peak
    (getrusage, KB on Linux, bytes on macOS); None when neither can be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        pass
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def memory_at_start_error(max_memory_mb: int | None) -> str | None:
    """The refusal of a max_memory_mb this process is over before its first job (each
    replacement would stop at once too); None when it is not."""
    rss = rss_mb() if max_memory_mb is not None else None
    if rss is None or max_memory_mb is None or rss <= max_memory_mb:
        return None
    return (f"--max-memory-mb {max_memory_mb} is below this process's memory before its "
            f"first job ({rss:.0f} MB): raise it")  # fmt: skip
