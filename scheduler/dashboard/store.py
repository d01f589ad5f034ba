"""What the pages read, through the client (`Queue`), the browsing operations
(scheduler/operations/browsing.py) and the admin readers: never a job key by hand. Every read
is O(page): counts are one script call, listings are ZRANGE pages, records come by id."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import redis

from scheduler.admin.inspection import discover_queues, live_workers
from scheduler.client.queue import Queue
from scheduler.core.keys import check_queue_name
from scheduler.core.models import QueueCounts
from scheduler.core.scripts import Scripts, run_sync
from scheduler.dashboard.history import LatenessHistory, Sampler
from scheduler.operations import browsing
from scheduler.operations.requests import Op

T = TypeVar("T")
DISCOVER_EVERY_S = 60.0  # a SCAN of the keyspace: at most once a minute, never per page


class Store:
    """The dashboard's one connection and its per-queue clients."""

    def __init__(
        self,
        client: redis.Redis,
        queues: Sequence[str] = (),
        *,
        sample_every_s: float = 10.0,
    ) -> None:
        self.client = client
        self.fixed_queues = [check_queue_name(q) for q in queues]
        self._queues: dict[str, Queue] = {}
        self._scripts = Scripts()
        self._lock = threading.Lock()
        self._discovered: list[str] = []
        self._discovered_at: float | None = None  # never
        self._discover_lock = threading.Lock()
        self.lateness = LatenessHistory()
        self.sampler = Sampler(self.sample, sample_every_s)

    def queue(self, name: str) -> Queue:
        """The client of queue `name` (raises BadArgument for an invalid name)."""
        check_queue_name(name)
        with self._lock:
            q = self._queues.get(name)
            if q is None:
                q = self._queues[name] = Queue(self.client, name)
            return q

    def queue_names(self) -> list[str]:
        """The configured queues, else those found by SCAN. The SCAN walks the whole keyspace,
        so only the very first request waits for it; later, a stale list (older than
        DISCOVER_EVERY_S) is returned at once and refreshed in a background thread."""
        if self.fixed_queues:
            return list(self.fixed_queues)
        if self._discovered_at is None:
            with self._discover_lock:
                if self._discovered_at is None:
                    self._discover()
        elif (
            time.monotonic() - self._discovered_at >= DISCOVER_EVERY_S
            and self._discover_lock.acquire(blocking=False)
        ):
            threading.Thread(target=self._discover_in_background, daemon=True).start()
        return list(self._discovered)

    def _discover(self) -> None:
        self._discovered = discover_queues(self.client)
        self._discovered_at = time.monotonic()

    def _discover_in_background(self) -> None:
        try:
            self._discover()
        except Exception:  # Redis unavailable: the old list stays, the next request retries
            self._discovered_at = time.monotonic() - DISCOVER_EVERY_S / 2
        finally:
            self._discover_lock.release()

    def run(self, q: Queue, op: Op[T]) -> T:
        """Drive one operation on the queue's connection (the same driver Queue uses)."""
        keys = q.keys.script_keys()
        try:
            req = next(op)
            while True:
                try:
                    (reply,) = run_sync(self.client, self._scripts.drive([(keys, req)]))
                    if isinstance(reply, BaseException):
                        raise reply
                except Exception as exc:
                    req = op.throw(exc)
                else:
                    req = op.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def counts(self, name: str) -> QueueCounts:
        c = self.queue(name).counts()
        self.lateness.record(name, c.now_ms, c.oldest_overdue_ms)
        return c

    def sample(self) -> None:
        for name in self.queue_names():
            self.counts(name)

    def queue_summary(self, name: str, minutes: int = 60) -> dict[str, Any]:
        """Counts, per-minute outcomes and lateness of one queue: one script call and one
        pipeline of `minutes` small stats hashes."""
        q = self.queue(name)
        c = self.counts(name)
        series = self.run(q, browsing.minute_series(q.keys, c.now_ms, minutes))
        last = series[-2] if len(series) > 1 else series[-1]  # the last whole minute
        return {
            "queue": name,
            "now_ms": c.now_ms,
            "due": c.due,
            "scheduled": c.scheduled,
            "leased": c.leased,
            "dead": c.dead,
            "lapsed": c.lapsed,
            "oldest_overdue_ms": c.oldest_overdue_ms,
            "done_per_min": last.get("done", 0),
            "failed_per_min": last.get("fail", 0),
            "minutes": [r["minute_ms"] for r in series],
            "done": [r.get("done", 0) for r in series],
            "failed": [r.get("fail", 0) for r in series],
            "dead_per_min": [r.get("dead", 0) for r in series],
            "lateness_ms": self.lateness.series(name, c.now_ms),
        }

    def workers(self, name: str) -> list[dict[str, Any]]:
        live, _gone = live_workers(self.client, self.queue(name).keys)
        return [w.to_json() for w in live]
