"""arq driver: ``ArqRedis.enqueue_job``; ``arq --burst WorkerSettings`` (asyncio, max_jobs=10)."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any, ClassVar

import common as c
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

CHUNK = 200  # arq has no batch API: bulk = asyncio.gather over chunks of this many enqueue_job


async def task(ctx: dict[str, Any], data: dict[str, Any]) -> None:
    await c.handle_async(ctx["redis"], data)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [task]
    redis_settings = RedisSettings.from_dsn(os.environ.get(c.ENV_URL, "unix:///nonexistent"))
    queue_name = c.QUEUE


def meta() -> dict[str, Any]:
    return {
        "version": version("arq"),
        "settings": {
            "enqueue": "ArqRedis.enqueue_job('task', payload, _queue_name=...)",
            "bulk": f"no batch API: asyncio.gather of enqueue_job, {CHUNK} in flight",
            "worker": "arq --burst WorkerSettings (defaults: max_jobs=10, poll_delay=0.5s)",
            "scheduler": "enqueue_job(..., _defer_until=datetime)",
            "concurrency": 10,
        },
    }


async def _pool(url: str) -> ArqRedis:
    return await create_pool(RedisSettings.from_dsn(url), default_queue_name=c.QUEUE)


async def enqueue_single(url: str, n: int) -> float:
    pool = await _pool(url)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            await pool.enqueue_job("task", c.payload(i))
        return time.perf_counter() - t0
    finally:
        await pool.aclose()


async def _bulk(pool: ArqRedis, n: int, **kw: Any) -> None:
    for start in range(0, n, CHUNK):
        await asyncio.gather(
            *(
                pool.enqueue_job("task", c.payload(i, bool(kw)), **kw)
                for i in range(start, min(n, start + CHUNK))
            )
        )


async def enqueue_bulk(url: str, n: int) -> float:
    pool = await _pool(url)
    try:
        t0 = time.perf_counter()
        await _bulk(pool, n)
        return time.perf_counter() - t0
    finally:
        await pool.aclose()


def _cmd(*extra: str) -> list[str]:
    return [c.bin_path("arq"), *extra, "systems.arq.WorkerSettings"]


def drain(url: str, n: int, concurrency: int | None) -> float:
    asyncio.run(pending(url, n))
    r = c.client(url)
    with c.running("arq-drain", _cmd("--burst"), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)

    async def one() -> None:
        pool = await _pool(url)
        try:
            await pool.enqueue_job("task", c.payload(-1))
        finally:
            await pool.aclose()

    async def schedule(due: float) -> None:
        pool = await _pool(url)
        try:
            await _bulk(pool, n, _defer_until=datetime.fromtimestamp(due, tz=UTC))
        finally:
            await pool.aclose()

    with c.running("arq-sched", _cmd(), url) as proc:
        c.wait_ready(r, lambda: asyncio.run(one()), proc, "arq-sched")
        due = c.due_in(delay_s)
        asyncio.run(schedule(due))
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)


async def pending(url: str, n: int) -> None:
    pool = await _pool(url)
    try:
        await _bulk(pool, n)
    finally:
        await pool.aclose()
