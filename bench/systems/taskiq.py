"""taskiq + taskiq-redis driver: ``RedisStreamBroker`` (the README's default), ``task.kiq``."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import common as c
from redis.asyncio import Redis
from taskiq import TaskiqScheduler
from taskiq_redis import ListRedisScheduleSource, RedisStreamBroker

CHUNK = 200  # no batch API: asyncio.gather of kiq, this many in flight
WORKERS = 1  # one worker process (taskiq's default is 2)
_URL = os.environ.get(c.ENV_URL, "unix:///nonexistent")

# consumer_id="0": the consumer group also sees jobs enqueued before the worker started.
broker = RedisStreamBroker(url=_URL, queue_name=c.QUEUE, consumer_id="0")
source = ListRedisScheduleSource(_URL)
scheduler = TaskiqScheduler(broker, sources=[source])

_R: Redis | None = None


@broker.task(task_name="bench.task")
async def task(data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = Redis.from_url(c.env_url())
    await c.handle_async(_R, data)


def meta() -> dict[str, Any]:
    return {
        "version": version("taskiq"),
        "taskiq-redis": version("taskiq-redis"),
        "settings": {
            "broker": "RedisStreamBroker(consumer_id='0')",
            "enqueue": "await task.kiq(payload)",
            "bulk": f"no batch API: asyncio.gather of kiq, {CHUNK} in flight",
            "worker": f"taskiq worker systems.taskiq:broker --workers {WORKERS} "
            "(default max async tasks)",
            "scheduler": "task.schedule_by_time(ListRedisScheduleSource, dt) + "
            "taskiq scheduler --update-interval 1",
            "concurrency": "max_async_tasks default",
        },
    }


async def _bulk(n: int) -> None:
    for start in range(0, n, CHUNK):
        await asyncio.gather(*(task.kiq(c.payload(i)) for i in range(start, min(n, start + CHUNK))))


async def enqueue_single(url: str, n: int) -> float:
    await broker.startup()
    try:
        t0 = time.perf_counter()
        for i in range(n):
            await task.kiq(c.payload(i))
        return time.perf_counter() - t0
    finally:
        await broker.shutdown()


async def enqueue_bulk(url: str, n: int) -> float:
    await broker.startup()
    try:
        t0 = time.perf_counter()
        await _bulk(n)
        return time.perf_counter() - t0
    finally:
        await broker.shutdown()


async def pending(url: str, n: int) -> None:
    await broker.startup()
    try:
        await _bulk(n)
    finally:
        await broker.shutdown()


def _worker_cmd(concurrency: int | None) -> list[str]:
    cmd = [
        c.bin_path("taskiq"),
        "worker",
        "systems.taskiq:broker",
        "--workers",
        str(WORKERS),
        "--log-level",
        "WARNING",
    ]
    if concurrency:
        cmd += ["--max-async-tasks", str(concurrency)]
    return cmd


def drain(url: str, n: int, concurrency: int | None) -> float:
    asyncio.run(pending(url, n))
    r = c.client(url)
    with c.running("taskiq-drain", _worker_cmd(concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


async def _schedule(n: int, due: float) -> None:
    await broker.startup()
    await source.startup()
    try:
        when = datetime.fromtimestamp(due, tz=UTC)
        for start in range(0, n, CHUNK):
            await asyncio.gather(
                *(
                    task.schedule_by_time(source, when, c.payload(i, True))
                    for i in range(start, min(n, start + CHUNK))
                )
            )
    finally:
        await source.shutdown()
        await broker.shutdown()


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    sched_cmd = [
        c.bin_path("taskiq"),
        "scheduler",
        "systems.taskiq:scheduler",
        "--update-interval",
        "1",
        "--log-level",
        "WARNING",
    ]
    with (
        c.running("taskiq-sched-worker", _worker_cmd(None), url) as proc,
        c.running("taskiq-scheduler", sched_cmd, url) as sproc,
    ):
        c.wait_ready(r, lambda: asyncio.run(pending(url, 1)), proc, "taskiq-sched-worker")
        due = c.due_in(delay_s)
        asyncio.run(_schedule(n, due))
        if sproc.poll() is not None:
            raise RuntimeError(f"scheduler exited: {c.log_tail('taskiq-scheduler')}")
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
