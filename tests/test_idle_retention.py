"""Dead-letter retention by age on a queue where nothing happens (the brief of a lifecycle
audit: is it ever applied without a claim or a death?). A worker with nothing to do still
claims at least every claiming's idle safety net (settings._MAX_IDLE_SLEEP_S, 30 s), and each
claim applies the retention (lua/claim.lua, eba2d9c), so dead letters past the max age go
within that while a worker runs."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.worker.settings import _MAX_IDLE_SLEEP_S
from tests.workers.procs import spawn_worker, stop_all, wait_for


def test_an_idle_worker_trims_dead_letters_by_age(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    q.set_dead_retention(max_age_ms=15_000)
    for i in range(5):  # parked by hand, young: kept by the park's own trim
        q.enqueue("nope", i)
    batch = q.claim("hand", limit=5, lease_ms=60_000)
    for job in batch.jobs:
        q.fail(job.id, job.token, ("X", "boom", ""), retryable=False)
    assert q.counts().dead == 5
    worker = spawn_worker(redis_url, q.name)
    try:
        # its first claims come before they are 15 s old: kept; only its idle claims are left
        wait_for(lambda: client.zcard(q.keys.workers) >= 1, what="the worker up")
        assert q.counts().dead == 5
        wait_for(lambda: q.counts().dead == 0, timeout_s=15 + _MAX_IDLE_SLEEP_S + 20,
                 what="the idle worker's claim trims them")  # fmt: skip
    finally:
        stop_all([worker])
