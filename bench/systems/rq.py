"""RQ driver: ``Queue.enqueue`` / ``Queue.enqueue_many``; ``rq worker`` (forks per job)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import common as c
import redis
from rq import Queue

_R: redis.Redis | None = None


def task(data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = c.client(c.env_url())
    c.handle_sync(_R, data)


def _queue(url: str) -> Queue:
    return Queue(c.QUEUE, connection=c.client(url))


def meta() -> dict[str, Any]:
    return {
        "version": version("rq"),
        "settings": {
            "enqueue": "Queue.enqueue(func, payload)",
            "bulk": "Queue.enqueue_many([Queue.prepare_data(...)]) (one pipeline)",
            "worker": "rq worker --burst (default Worker: forks a work horse per job)",
            "scheduler": "Queue.enqueue_at + rq worker --with-scheduler",
            "concurrency": 1,
        },
    }


def enqueue_single(url: str, n: int) -> float:
    q = _queue(url)
    t0 = time.perf_counter()
    for i in range(n):
        q.enqueue(task, c.payload(i))
    return time.perf_counter() - t0


def _bulk(q: Queue, n: int, start: int = 0) -> None:
    q.enqueue_many([Queue.prepare_data(task, (c.payload(i),)) for i in range(start, start + n)])


def enqueue_bulk(url: str, n: int) -> float:
    q = _queue(url)
    t0 = time.perf_counter()
    _bulk(q, n)
    return time.perf_counter() - t0


def _worker_cmd(url: str, *extra: str) -> list[str]:
    return [c.bin_path("rq"), "worker", "--url", url, "--logging_level", "WARNING", *extra, c.QUEUE]


def drain(url: str, n: int, concurrency: int | None) -> float:
    q = _queue(url)
    _bulk(q, n)
    r = c.client(url)
    with c.running("rq-drain", _worker_cmd(url, "--burst"), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    q = _queue(url)
    r = c.client(url)

    def warm() -> None:
        q.enqueue(task, c.payload(-1))

    with c.running("rq-sched", _worker_cmd(url, "--with-scheduler"), url) as proc:
        c.wait_ready(r, warm, proc, "rq-sched")
        due = c.due_in(delay_s)
        when = datetime.fromtimestamp(due, tz=UTC)
        with r.pipeline() as pipe:
            for i in range(n):
                q.enqueue_at(when, task, c.payload(i, True), pipeline=pipe)
            pipe.execute()
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)


def pending(url: str, n: int) -> None:
    _bulk(_queue(url), n)
