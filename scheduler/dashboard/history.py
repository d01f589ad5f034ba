"""The lateness history behind the overview chart: how late each queue's oldest due job was,
per 10 seconds, for the last hour. No stored history of lateness exists (the per-minute stats
hashes count outcomes only), so the dashboard samples `counts()` (one O(log N) script call)
every few seconds and keeps the worst value of each 10 s in memory: bounded (360 buckets per
queue), nothing written to Redis. The chart covers the time this process has been serving."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

BUCKET_MS = 10_000
KEEP_BUCKETS = 360  # one hour


class LatenessHistory:
    """Per queue, 10 s bucket -> the largest `oldest_overdue_ms` sampled in it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: dict[str, OrderedDict[int, int]] = {}

    def record(self, queue: str, now_ms: int, overdue_ms: int) -> None:
        bucket = now_ms // BUCKET_MS
        with self._lock:
            buckets = self._by_queue.setdefault(queue, OrderedDict())
            buckets[bucket] = max(buckets.get(bucket, 0), overdue_ms)
            while buckets and next(iter(buckets)) <= bucket - KEEP_BUCKETS:
                buckets.popitem(last=False)

    def series(self, queue: str, now_ms: int) -> list[int | None]:
        """The last hour, oldest bucket first; None for a bucket with no sample."""
        last = now_ms // BUCKET_MS
        with self._lock:
            buckets = dict(self._by_queue.get(queue, {}))
        return [buckets.get(b) for b in range(last - KEEP_BUCKETS + 1, last + 1)]


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
    """Bucket-wise maximum over several queues' series (the 'all queues' line)."""
    if not rows:
        return []
    out: list[int | None] = []
    for column in zip(*rows, strict=True):
        present = [v for v in column if v is not None]
        out.append(max(present) if present else None)
    return out
