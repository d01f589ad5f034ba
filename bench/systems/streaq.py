"""streaq driver: ``task.enqueue`` / ``Worker.enqueue_many``; ``streaq run`` worker."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import common as c
from redis.asyncio import Redis
from streaq import Worker

CONCURRENCY = 16  # streaq's default

worker = Worker(
    redis_url=os.environ.get(c.ENV_URL, "unix:///nonexistent"),
    queue_name=c.QUEUE,
    concurrency=CONCURRENCY,
)

_R: Redis | None = None


@worker.task()
async def task(data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = Redis.from_url(c.env_url())
    await c.handle_async(_R, data)


def meta() -> dict[str, Any]:
    return {
        "version": version("streaq"),
        "settings": {
            "enqueue": "await task.enqueue(payload) inside `async with worker`",
            "bulk": "Worker.enqueue_many([task.enqueue(...)]) (one pipeline)",
            "worker": f"streaq run systems.streaq:worker --burst (concurrency={CONCURRENCY})",
            "scheduler": "await task.enqueue(...).start(schedule=datetime)",
            "concurrency": CONCURRENCY,
        },
    }


async def enqueue_single(url: str, n: int) -> float:
    async with worker:
        t0 = time.perf_counter()
        for i in range(n):
            await task.enqueue(c.payload(i))
        return time.perf_counter() - t0


async def enqueue_bulk(url: str, n: int) -> float:
    async with worker:
        t0 = time.perf_counter()
        await worker.enqueue_many([task.enqueue(c.payload(i)) for i in range(n)])
        return time.perf_counter() - t0


async def pending(url: str, n: int) -> None:
    async with worker:
        await worker.enqueue_many([task.enqueue(c.payload(i)) for i in range(n)])


def _cmd(*extra: str) -> list[str]:
    return [c.bin_path("streaq"), "run", "systems.streaq:worker", *extra]


def drain(url: str, n: int, concurrency: int | None) -> float:
    asyncio.run(pending(url, n))
    r = c.client(url)
    with c.running("streaq-drain", _cmd("--burst"), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


async def _schedule(n: int, due: float) -> None:
    when = datetime.fromtimestamp(due, tz=UTC)
    async with worker:
        for i in range(n):
            await task.enqueue(c.payload(i, True)).start(schedule=when)


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("streaq-sched", _cmd(), url) as proc:
        c.wait_ready(r, lambda: asyncio.run(pending(url, 1)), proc, "streaq-sched")
        due = c.due_in(delay_s)
        asyncio.run(_schedule(n, due))
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
