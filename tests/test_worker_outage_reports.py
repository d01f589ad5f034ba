"""Outcomes held through a write outage longer than the lease are reported before the worker's
next claim. Redis accepts complete / fail for a lapsed lease until a claim reaps it, but the
first claim after the outage was often this worker's own (woken by an enqueue while its
reporter still sat in its backoff): it reaped the finished jobs, whose results were then
refused as stale, and every one of them ran again (an audit: 14 of 14 after MISCONF, 10 of 10
after READONLY). A private server: writes are refused with min-replicas-to-write."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import redis

from scheduler import JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings
from tests.embedded_worker import until

registry = Registry()
runs: Counter[str] = Counter()


@registry.task("outage.job")
def job(payload: Any, ctx: JobContext) -> str:
    runs[ctx.job_id] += 1
    time.sleep(0.3)
    return "ok"


def test_results_held_through_an_outage_go_before_the_next_claim(
    module_server: RedisProcess,
) -> None:
    admin = redis.Redis.from_url(module_server.url)
    q = Queue.from_url(module_server.url, "outage")
    first = [q.enqueue("outage.job", {"n": i}) for i in range(6)]

    async def main() -> list[str]:
        client = connect_async(module_server.url)
        settings = WorkerSettings(queues=("outage",), lease_ms=3_000, heartbeat_ms=500, grace_s=0)
        task = asyncio.create_task(Worker(client, registry, settings).run(install_signals=False))
        try:
            await until(lambda: len(runs) >= len(first) or task.done())
            admin.config_set("min-replicas-to-write", 1)  # every write refused from here
            await asyncio.sleep(4.5)  # past every lease: none got a heartbeat through
            admin.config_set("min-replicas-to-write", 0)
            later = [q.enqueue("outage.job", {"n": i}) for i in range(3)]  # wakes the claims
            # Until all are done (a 30 s liveness bound), not a fixed 400 x 25 ms loop.
            await until(lambda: all(q.status(j) == "done" for j in first + later) or task.done())
            return later
        finally:
            admin.config_set("min-replicas-to-write", 0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()

    later = asyncio.run(main())
    assert {j: q.status(j) for j in first + later} == dict.fromkeys(first + later, "done")
    assert {j: runs[j] for j in first + later} == dict.fromkeys(first + later, 1)
