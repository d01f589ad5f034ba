"""The worker process's exit cannot hang: once the worker has returned (its jobs finished or
given back, its exit code decided), the event loop's close and the interpreter's exit each get
EXIT_WATCHDOG_S, then the process ends with that code. uvloop's close was once seen never to
return (tests/test_transport_race.py), and the interpreter's exit joins every non-daemon thread,
a handler's own included: either held a supervisor's stop until it killed the worker.

Only the process's own exit is cut: when the CLI runs in-process (click's CliRunner, an app
calling it), the main thread lives on after the loop's close and the watchdog stands down."""

from __future__ import annotations

import logging
import os
import threading
import time

from scheduler.worker import logs

EXIT_WATCHDOG_S = 10.0
_POLL_S = 0.05


class ExitWatchdog:
    """arm() after the worker returned; closed() once the loop is closed."""

    def __init__(self, code: int, timeout_s: float | None = None) -> None:
        self.code = code
        self.timeout_s = EXIT_WATCHDOG_S if timeout_s is None else timeout_s
        self._closed = threading.Event()
        self._on_main = True

    def arm(self) -> None:
        # Run from another thread, the CLI is embedded: the main thread's end is not ours.
        self._on_main = threading.current_thread() is threading.main_thread()
        threading.Thread(target=self._watch, name="sched-exit-watchdog", daemon=True).start()

    def closed(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        if not self._closed.wait(self.timeout_s):
            self._force("the event loop's close")
        if not self._on_main:
            return
        # The interpreter's exit marks the main thread stopped before it joins the others.
        main = threading.main_thread()
        stand_down = time.monotonic() + self.timeout_s
        while main.is_alive():
            if time.monotonic() > stand_down:
                return  # in-process: the caller goes on, nothing of ours to end
            time.sleep(_POLL_S)
        time.sleep(self.timeout_s)  # a normal exit ends this daemon thread first
        self._force("the interpreter's exit (a non-daemon thread, an atexit hook)")

    def _force(self, where: str) -> None:
        try:
            logging.getLogger(logs.LOGGER).warning(
                "%s did not end within %.0fs of the worker's stop: exiting now with code %d",
                where,
                self.timeout_s,
                self.code,
            )
        finally:
            os._exit(self.code)
