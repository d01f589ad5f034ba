"""A job hash with no `backoff` field (the project's first layout kept it in `backoff_*` fields)
retried at once after a failure, while claim reported the default backoff to its handler: fail
now uses the default backoff too (at least 750 ms: 1 s less a jitter of at most 25%)."""

from __future__ import annotations

import redis

from scheduler import Queue
from tests.old_layout import old_enqueue


def test_a_job_without_a_stored_backoff_retries_by_the_default(
    client: redis.Redis, q: Queue
) -> None:
    job_id = old_enqueue(q, client, "t")
    client.hdel(q.keys.job(job_id), "backoff")
    client.hset(q.keys.job(job_id), mapping={"backoff_base_ms": "700", "backoff_factor": "1.0"})
    (job,) = q.claim("w", limit=1).jobs
    out = q.fail(job.id, job.token, ("E", "m", ""))
    assert out.status == "retry"
    assert out.run_at_ms is not None and out.run_at_ms - q.counts().now_ms >= 700
