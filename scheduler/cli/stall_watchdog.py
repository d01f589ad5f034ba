"""A worker process whose event loop stops turning ends itself. An async handler that never
awaits (a CPU loop, a blocking call in an `async def`) holds the loop: its timeout cannot fire,
heartbeats, claims and signals all stop, and the process stays up doing nothing while its
leases lapse. The lapsed job goes to the next worker, which it freezes in turn, so without this
a queue's every worker ends up frozen and the job is never parked.

A thread of its own watches a tick the loop writes every TICK_S. Stalled longer than the lease
(at least STALL_MIN_S: a loaded machine's pause is no reason), the leases have lapsed already:
the process logs the loop's stack (the handler to blame) and exits with EXIT_FAILED. The pool's
supervisor (or systemd's Restart=on-failure) starts another; each lapse is counted on the job,
so the job that did it is isolated, then parked after its last attempt (docs/durability.md).

A handler that holds the GIL (a C call that never releases it: a pathological regex, an
extension's loop) freezes every thread, this one too. The backstop is faulthandler's timer,
a C thread that needs no GIL: armed for the stall limit plus FROZEN_MARGIN_S and re-armed by
this thread while the loop turns, it fires only when neither could run, writes every thread's
stack to stderr and ends the process with exit 1 (faulthandler's own _exit(1), EXIT_FAILED).
faulthandler has one timer per process and no way to ask whether it is armed, so an app's own
timer (a registry's or a handler's dump_traceback_later) and this backstop cancelled each
other: each re-arm replaced the app's, whose dumps never came, and the stop cancelled it.
While a watchdog runs, faulthandler's two timer functions are wrapped (`_Timer`): an app's
timer is left alone while it is armed (until cancelled, or its timeout past unless it repeats),
the backstop standing down meanwhile; one armed before the watchdog started (at the registry's
import) cannot be seen and is replaced (docs/guide/workers.md, "An embedded worker's bounds")."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import math
import os
import sys
import threading
import time
import traceback
from typing import Any

from scheduler.core.exits import EXIT_FAILED
from scheduler.worker import logs

STALL_MIN_S = 10.0
TICK_S = 0.5
_STACK_FRAMES = 8  # the innermost frames logged: where the loop is held
FROZEN_MARGIN_S = 15.0  # the GIL backstop's time past the stall limit (after this thread's)
_REARM_S = 5.0  # how often this thread re-arms it while the loop turns


class StallWatchdog:
    """start() on the loop's thread before it runs; stop() once it is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lease_s: float) -> None:
        self.loop = loop
        self.stall_s = max(lease_s, STALL_MIN_S)
        self._tick = time.monotonic()
        self._stopped = threading.Event()
        self._loop_thread = threading.get_ident()
        self._armed_at = 0.0

    def start(self) -> None:
        _TIMER.watch()
        self._arm()  # now: a job claimed at once may hold the GIL before this thread first runs
        self.loop.call_soon(self._beat)
        threading.Thread(target=self._watch, name="sched-stall-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        _TIMER.cancel_ours()
        _TIMER.unwatch()

    def _beat(self) -> None:
        self._tick = time.monotonic()
        if not self._stopped.is_set():
            self.loop.call_later(TICK_S, self._beat)

    def _poke(self) -> None:
        self._tick = time.monotonic()

    def _watch(self) -> None:
        while not self._stopped.wait(TICK_S):
            if time.monotonic() - self._tick <= self.stall_s:
                self._arm()
                continue
            # Confirmed before anything is done: a loop that turns answers a poke within a
            # tick, also right after the whole process was paused (SIGSTOP, a debugger), when
            # the tick read is stale though the loop is fine.
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(self._poke)
            if self._stopped.wait(2 * TICK_S):
                return
            stalled_s = time.monotonic() - self._tick
            if stalled_s > self.stall_s:
                self._exit(stalled_s)

    def _arm(self) -> None:
        """(Re-)arm the GIL backstop, at most every _REARM_S, while the loop turns (a tick
        within one interval): a held loop with the GIL free is this thread's to end first."""
        now = time.monotonic()
        if now - self._armed_at < _REARM_S or now - self._tick > 2 * TICK_S:
            return
        out = _stderr_file()
        if out is None or self._stopped.is_set():
            return
        if _TIMER.arm_ours(self.stall_s + FROZEN_MARGIN_S, out):
            self._armed_at = now

    def _exit(self, stalled_s: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        stack = traceback.format_stack(frame)[-_STACK_FRAMES:] if frame is not None else []
        where = " <- ".join(
            line.strip().splitlines()[0].removeprefix("File ") for line in reversed(stack)
        )
        try:
            logging.getLogger(logs.LOGGER).critical(
                "the event loop has not turned for %.1f s (longer than the lease): a handler "
                "holds it (a CPU loop or a blocking call in an async def); exiting, so its "
                "jobs go to other workers and the job that did it is parked after its last "
                "attempt. The loop was at: %s",
                stalled_s,
                where or "(unknown)",
            )
        finally:
            os._exit(EXIT_FAILED)


def _stderr_file() -> Any:
    """The worker log's own stream (its dup of stderr: a handler may close sys.stderr), else
    the process's stderr; None when neither has a file descriptor faulthandler can write."""
    streams = [getattr(h, "stream", None) for h in logging.getLogger("scheduler").handlers]
    for stream in [*streams, sys.__stderr__]:
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, ValueError, OSError):
            continue
    return None


class _Timer:
    """faulthandler's one timer, shared with the app: arm_ours() leaves an app's armed timer
    alone; watch() wraps faulthandler's timer functions so the app's calls are seen."""

    _OVER_S = 1.0  # past an app's timeout: its one dump has been written, the timer is free

    def __init__(self) -> None:
        self._lock = threading.RLock()  # an app's call from a signal handler on our thread
        self._real = (faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later)
        self._theirs_until: float | None = None  # monotonic; inf: it repeats until cancelled
        self._ours = False
        self._watchers = 0
        self._told = False

    def watch(self) -> None:
        with self._lock:
            self._watchers += 1
            faulthandler.dump_traceback_later = self._their_dump
            faulthandler.cancel_dump_traceback_later = self._their_cancel

    def unwatch(self) -> None:
        with self._lock:
            self._watchers = max(0, self._watchers - 1)
            if self._watchers == 0 and faulthandler.dump_traceback_later == self._their_dump:
                faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later = (
                    self._real
                )

    def arm_ours(self, timeout_s: float, out: Any) -> bool:
        with self._lock:
            until = self._theirs_until
            if until is not None and time.monotonic() < until + self._OVER_S:
                return False
            self._theirs_until = None
            self._real[0](timeout_s, file=out, exit=True)
            self._ours = True
            return True

    def cancel_ours(self) -> None:
        with self._lock:
            if self._ours:
                self._real[1]()
                self._ours = False

    def _their_dump(
        self, timeout: float, repeat: bool = False, file: Any = None, exit: bool = False
    ) -> None:
        with self._lock:
            self._real[0](timeout, repeat=repeat, file=file, exit=exit)  # a bad value: raises
            self._theirs_until = math.inf if repeat else time.monotonic() + timeout
            self._ours, told, self._told = False, self._told, True
        if not told:
            logging.getLogger(logs.LOGGER).info(
                "faulthandler's timer armed by the app (dump_traceback_later): the stall "
                "watchdog's GIL backstop stands down while it is armed"
            )

    def _their_cancel(self) -> None:
        with self._lock:
            self._real[1]()
            self._theirs_until, self._ours = None, False


_TIMER = _Timer()
