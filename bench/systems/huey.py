"""huey driver (RedisHuey): ``task(payload)``; ``huey_consumer`` (1 thread worker, default)."""

from __future__ import annotations

import os
import time
from importlib.metadata import version
from typing import Any

import common as c
import redis
from huey import RedisHuey

WORKERS = 1  # huey_consumer's default -w

huey = RedisHuey(c.QUEUE, url=os.environ.get(c.ENV_URL, "unix:///nonexistent"))

_R: redis.Redis | None = None


@huey.task()
def task(data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = c.client(c.env_url())
    c.handle_sync(_R, data)


def meta() -> dict[str, Any]:
    return {
        "version": version("huey"),
        "settings": {
            "enqueue": "task(payload)",
            "bulk": "task.map(payloads) (one enqueue per job)",
            "worker": f"huey_consumer systems.huey.huey -w {WORKERS} -k thread (defaults)",
            "scheduler": "task.schedule(args=..., delay=s); consumer checks schedule every 1 s",
            "concurrency": WORKERS,
        },
    }


def enqueue_single(url: str, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        task(c.payload(i))
    return time.perf_counter() - t0


def enqueue_bulk(url: str, n: int) -> float:
    t0 = time.perf_counter()
    task.map([c.payload(i) for i in range(n)])
    return time.perf_counter() - t0


def pending(url: str, n: int) -> None:
    task.map([c.payload(i) for i in range(n)])


def _cmd(concurrency: int | None) -> list[str]:
    return [
        c.bin_path("huey_consumer"),
        "systems.huey.huey",
        "-w",
        str(concurrency or WORKERS),
        "-k",
        "thread",
        "-q",
    ]


def drain(url: str, n: int, concurrency: int | None) -> float:
    pending(url, n)
    r = c.client(url)
    with c.running("huey-drain", _cmd(concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("huey-sched", _cmd(None), url) as proc:
        c.wait_ready(r, lambda: task(c.payload(-1)) and None, proc, "huey-sched")
        due = c.due_in(delay_s)
        for i in range(n):
            task.schedule(args=(c.payload(i, True),), delay=max(0.0, due - time.time()))
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
