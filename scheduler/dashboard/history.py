"""The lateness history behind the overview chart: how late each queue's oldest due job was,
per minute, for the last hour. No stored history of lateness exists (the per-minute stats
hashes count outcomes only), so the dashboard samples `counts()` (one O(log N) script call)
every few seconds and keeps the worst value of each minute in memory: bounded (60 minutes x
queues), nothing written to Redis. The chart covers the time this process has been serving."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

KEEP_MINUTES = 60


class LatenessHistory:
    """Per queue, minute -> the largest `oldest_overdue_ms` sampled in that minute."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: dict[str, OrderedDict[int, int]] = {}

    def record(self, queue: str, now_ms: int, overdue_ms: int) -> None:
        minute = now_ms // 60_000
        with self._lock:
            buckets = self._by_queue.setdefault(queue, OrderedDict())
            buckets[minute] = max(buckets.get(minute, 0), overdue_ms)
            while buckets and next(iter(buckets)) <= minute - KEEP_MINUTES:
                buckets.popitem(last=False)

    def series(self, queue: str, now_ms: int) -> list[int | None]:
        """The last hour, oldest minute first; None for a minute with no sample."""
        minute = now_ms // 60_000
        with self._lock:
            buckets = dict(self._by_queue.get(queue, {}))
        return [buckets.get(m) for m in range(minute - KEEP_MINUTES + 1, minute + 1)]


class Sampler:
    """A daemon thread calling `sample()` every `interval_s` (started on the first request,
    so it runs whether the app is served by the CLI or mounted in another app)."""

    def __init__(self, sample: Callable[[], None], interval_s: float) -> None:
        self._sample = sample
        self._interval_s = interval_s
        self._started = False
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def ensure_started(self) -> None:
        if self._interval_s <= 0 or self._started:
            return
        with self._lock:
            if self._started:
                return
            self._started = True
            threading.Thread(target=self._loop, name="dashboard-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._sample()
            except Exception:  # a Redis hiccup: the next tick tries again
                continue


def merge_max(rows: Sequence[list[int | None]]) -> list[int | None]:
    """Minute-wise maximum over several queues' series (the 'all queues' line)."""
    if not rows:
        return []
    out: list[int | None] = []
    for column in zip(*rows, strict=True):
        present = [v for v in column if v is not None]
        out.append(max(present) if present else None)
    return out
