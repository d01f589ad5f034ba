"""bullmq-py (the Python port of BullMQ) driver: ``Queue.add`` / ``Queue.addBulk``; a ``Worker``
process."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from importlib.metadata import version
from typing import Any

import common as c
from bullmq import Queue, Worker
from redis.asyncio import Redis

CONCURRENCY = 10  # bullmq's default is 1; its docs show raising it for I/O-bound async work

_R: Redis | None = None


async def process(job: Any, token: str) -> None:
    global _R
    if _R is None:
        _R = Redis.from_url(c.env_url())
    await c.handle_async(_R, job.data)


def meta() -> dict[str, Any]:
    return {
        "version": version("bullmq"),
        "settings": {
            "enqueue": "Queue.add('task', payload)",
            "bulk": "Queue.addBulk([...]) (one pipeline)",
            "worker": f"Worker(queue, processor, concurrency={CONCURRENCY}) in its own process",
            "scheduler": "Queue.add(..., opts={'delay': ms})",
            "concurrency": CONCURRENCY,
        },
    }


async def enqueue_single(url: str, n: int) -> float:
    q = Queue(c.QUEUE, {"connection": url})
    try:
        t0 = time.perf_counter()
        for i in range(n):
            await q.add("task", c.payload(i))
        return time.perf_counter() - t0
    finally:
        await q.close()


async def _bulk(url: str, n: int, due: float = 0.0) -> None:
    q = Queue(c.QUEUE, {"connection": url})
    try:
        jobs: list[dict[str, Any]] = []
        for i in range(n):
            job: dict[str, Any] = {"name": "task", "data": c.payload(i, bool(due))}
            if due:
                job["opts"] = {"delay": max(0, int((due - time.time()) * 1000))}
            jobs.append(job)
        await q.addBulk(jobs)
    finally:
        await q.close()


async def enqueue_bulk(url: str, n: int) -> float:
    t0 = time.perf_counter()
    await _bulk(url, n)
    return time.perf_counter() - t0


async def pending(url: str, n: int) -> None:
    await _bulk(url, n)


def _cmd(concurrency: int | None) -> list[str]:
    return [sys.executable, "-m", "systems.bullmq_py", str(concurrency or CONCURRENCY)]


def drain(url: str, n: int, concurrency: int | None) -> float:
    asyncio.run(pending(url, n))
    r = c.client(url)
    with c.running("bullmq-py-drain", _cmd(concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("bullmq-py-sched", _cmd(None), url) as proc:
        c.wait_ready(r, lambda: asyncio.run(pending(url, 1)), proc, "bullmq-py-sched")
        due = c.due_in(delay_s)
        asyncio.run(_bulk(url, n, due))
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)


async def _worker_main(concurrency: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(c.QUEUE, process, {"connection": c.env_url(), "concurrency": concurrency})
    try:
        await stop.wait()
    finally:
        await worker.close()


if __name__ == "__main__":
    asyncio.run(_worker_main(int(sys.argv[1]) if len(sys.argv) > 1 else CONCURRENCY))
