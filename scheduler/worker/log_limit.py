"""A cap on the worker's repeated warnings. While a Redis node stays down, every loop retries
about once a second and each failure was one WARNING line: 3,600 an hour per loop, per worker.
Each kind of line (the failing call and its error type) now gets at most `burst` lines per
window; past that its lines are counted, and its first line after the window says how many
were held back. The metrics still count every error (scheduler_redis_errors_total).
The report's ERROR lines ("complete refused", "fail of job ... errored") get the same cap
(`error`): a refusal of every outcome logged one line per job for as long as it lasted."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass
class _Window:
    start_s: float
    lines: int = 1
    held: int = 0


class LogLimit:
    def __init__(
        self, burst: int = 5, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst, self.window_s, self._clock = burst, window_s, clock
        self._windows: dict[Hashable, _Window] = {}

    def admit(self, key: Hashable) -> str | None:
        """None: hold this line back. Else the text to append to it: '' for a plain line, a
        note on the line that uses up the window's burst, or how many the last window held."""
        now = self._clock()
        w = self._windows.get(key)
        if w is None or now - w.start_s >= self.window_s:
            self._windows[key] = _Window(now)
            if w is not None and w.held:
                return f"; {w.held} more like it in the last {self.window_s:.0f}s not logged"
            return ""
        if w.lines >= self.burst:
            w.held += 1
            return None
        w.lines += 1
        if w.lines == self.burst:
            return f"; more like it are counted, not logged, for up to {self.window_s:.0f}s"
        return ""

    def error(self, logger: logging.Logger, msg: str, *args: object) -> None:
        """logger.error(msg, *args), capped per msg and the type of its last argument (the
        error: a job id among the others would give each job a budget of its own)."""
        note = self.admit((msg, type(args[-1]).__name__))
        if note is not None:
            logger.error(msg + "%s", *args, note)
