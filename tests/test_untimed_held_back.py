"""A sync handler with no timeout whose lease lapsed in a stall and that never returns: the
job's next claim in the same worker, held behind that run for a lease, was released with its
attempt given back every lease, for ever (an untimed run is never past its timeout). It now
fails with StillRunning, an attempt spent, so the job parks after its last, as README says."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis

from scheduler import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect_async
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.failures import STILL_RUNNING
from scheduler.worker.registry import JobContext, Registry
from tests.fixtures.polling import poll


def test_an_untimed_run_held_past_a_stall_parks_its_job_with_still_running(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    reg = Registry()
    release = threading.Event()
    runs: list[str] = []

    @reg.task(name="hang")  # no timeout of its own (0 = none)
    def hang(payload: Any, ctx: JobContext) -> None:
        runs.append(ctx.token)
        release.wait(60)  # ignores ctx.stopped

    job = q.enqueue("hang", max_attempts=2, backoff=Backoff(10, 1.0, 10, 0.0))
    settings = WorkerSettings(queues=(q.name,), concurrency=2, lease_ms=1000, heartbeat_ms=100,
                              grace_s=0)  # fmt: skip

    async def main() -> int:
        aclient = connect_async(redis_url)
        w = Worker(aclient, reg, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: len(runs) == 1, timeout_s=30, what="the first run")
        client.client_pause(1500, all=False)  # WRITE: its heartbeats wait, the lease lapses
        await poll(lambda: q.get_job(job).state == "dead", timeout_s=30, what="parked")
        w.request_stop()
        code = await task
        await aclient.aclose()
        return code

    try:
        assert asyncio.run(main()) == EXIT_OK
    finally:
        release.set()
    parked = q.get_job(job)
    assert len(runs) == 1  # the second claim never ran beside the first run
    assert parked.attempts == 2
    assert parked.fields["last_error_type"] == STILL_RUNNING
