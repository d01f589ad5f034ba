"""Dramatiq driver (Redis broker): ``actor.send``; ``dramatiq systems.dramatiq`` worker."""

from __future__ import annotations

import os
import time
from importlib.metadata import version
from typing import Any

import common as c
import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

PROCESSES = 1
THREADS = 8  # dramatiq's default --threads

broker = RedisBroker(url=os.environ.get(c.ENV_URL, "unix:///nonexistent"))
dramatiq.set_broker(broker)

_R: redis.Redis | None = None


@dramatiq.actor(queue_name=c.QUEUE, max_retries=0)
def task(data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = c.client(c.env_url())
    c.handle_sync(_R, data)


def meta() -> dict[str, Any]:
    return {
        "version": version("dramatiq"),
        "settings": {
            "enqueue": "actor.send(payload)",
            "bulk": "no batch API: group([actor.message(...)]).run() (one enqueue per message)",
            "worker": f"dramatiq systems.dramatiq --processes {PROCESSES} --threads {THREADS}",
            "scheduler": "actor.send_with_options(args=..., delay=ms)",
            "concurrency": THREADS,
        },
    }


def enqueue_single(url: str, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        task.send(c.payload(i))
    return time.perf_counter() - t0


def enqueue_bulk(url: str, n: int) -> float:
    t0 = time.perf_counter()
    dramatiq.group([task.message(c.payload(i)) for i in range(n)]).run()
    return time.perf_counter() - t0


def pending(url: str, n: int) -> None:
    dramatiq.group([task.message(c.payload(i)) for i in range(n)]).run()


def _cmd(concurrency: int | None) -> list[str]:
    return [
        c.bin_path("dramatiq"),
        "systems.dramatiq",
        "--processes",
        str(PROCESSES),
        "--threads",
        str(concurrency or THREADS),
        "--queues",
        c.QUEUE,
    ]


def drain(url: str, n: int, concurrency: int | None) -> float:
    pending(url, n)
    r = c.client(url)
    with c.running("dramatiq-drain", _cmd(concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("dramatiq-sched", _cmd(None), url) as proc:
        c.wait_ready(r, lambda: task.send(c.payload(-1)) and None, proc, "dramatiq-sched")
        due = c.due_in(delay_s)
        for i in range(n):
            delay_ms = max(0, int((due - time.time()) * 1000))
            task.send_with_options(args=(c.payload(i, True),), delay=delay_ms)
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
