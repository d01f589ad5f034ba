"""saq driver: ``Queue.enqueue``; ``saq systems.saq.settings`` (asyncio, concurrency=10)."""

from __future__ import annotations

import asyncio
import os
import time
from importlib.metadata import version
from typing import Any

import common as c
from redis.asyncio import Redis
from saq.queue.redis import RedisQueue as Queue

CHUNK = 200  # no fire-and-forget batch API (Queue.map waits for results): gather chunks

_R: Redis | None = None


async def task(ctx: dict[str, Any], *, data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = Redis.from_url(c.env_url())
    await c.handle_async(_R, data)


settings: dict[str, Any] = {
    "queue": Queue(Redis.from_url(os.environ.get(c.ENV_URL, "unix:///x")), name=c.QUEUE),
    "functions": [task],
    "concurrency": 10,
}


def _queue(url: str) -> Queue:
    # saq's Queue.from_url only accepts redis:// URLs; RedisQueue takes any redis-py client.
    return Queue(Redis.from_url(url), name=c.QUEUE)


def meta() -> dict[str, Any]:
    return {
        "version": version("saq"),
        "settings": {
            "enqueue": "Queue.enqueue('task', data=payload)",
            "bulk": f"no fire-and-forget batch API: asyncio.gather of enqueue, {CHUNK} in flight",
            "worker": "saq systems.saq.settings (1 process, concurrency=10, the default)",
            "scheduler": "enqueue(..., scheduled=<epoch s>)",
            "concurrency": 10,
        },
    }


async def _bulk(q: Queue, n: int, scheduled: int = 0) -> None:
    for start in range(0, n, CHUNK):
        await asyncio.gather(
            *(
                q.enqueue("task", data=c.payload(i, bool(scheduled)), scheduled=scheduled)
                for i in range(start, min(n, start + CHUNK))
            )
        )


async def enqueue_single(url: str, n: int) -> float:
    q = _queue(url)
    await q.connect()
    try:
        t0 = time.perf_counter()
        for i in range(n):
            await q.enqueue("task", data=c.payload(i))
        return time.perf_counter() - t0
    finally:
        await q.disconnect()


async def enqueue_bulk(url: str, n: int) -> float:
    q = _queue(url)
    await q.connect()
    try:
        t0 = time.perf_counter()
        await _bulk(q, n)
        return time.perf_counter() - t0
    finally:
        await q.disconnect()


async def pending(url: str, n: int, scheduled: int = 0) -> None:
    q = _queue(url)
    await q.connect()
    try:
        await _bulk(q, n, scheduled)
    finally:
        await q.disconnect()


CMD = ["saq", "systems.saq.settings", "--quiet"]


def drain(url: str, n: int, concurrency: int | None) -> float:
    asyncio.run(pending(url, n))
    r = c.client(url)
    with c.running("saq-drain", [c.bin_path(CMD[0]), *CMD[1:]], url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("saq-sched", [c.bin_path(CMD[0]), *CMD[1:]], url) as proc:
        c.wait_ready(r, lambda: asyncio.run(pending(url, 1)), proc, "saq-sched")
        r.set(c.COUNTER, 0)
        due = c.due_in(delay_s)
        asyncio.run(pending(url, n, scheduled=int(due)))
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
