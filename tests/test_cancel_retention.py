"""A cancelled job is kept for its own `result_ttl_ms`, as a completed one is (docs/limits.md:
the job's own retention, else the Queue's). cancel.lua used only the Queue's setting: a job
enqueued with `result_ttl_ms=9000` and cancelled was kept the Queue's hour."""

from __future__ import annotations

import redis

from scheduler import JobState, Queue


def record_ttl_ms(client: redis.Redis, q: Queue, job_id: str) -> int:
    """PTTL of the job's record."""
    return int(client.pttl(f"{q.keys.prefix}job:{job_id}"))


def test_cancelled_pending_job_keeps_its_own_retention(client: redis.Redis, q: Queue) -> None:
    own = q.enqueue("t", 1, result_ttl_ms=9000)
    other = q.enqueue("t", 2)
    assert q.cancel(own) == "due" and q.cancel(other) == "due"
    assert 0 < record_ttl_ms(client, q, own) <= 9000
    assert record_ttl_ms(client, q, other) > 9000  # the Queue's (an hour by default)
    assert q.status(own) == JobState.CANCELLED


def test_cancelled_leased_job_keeps_its_own_retention(client: redis.Redis, q: Queue) -> None:
    own = q.enqueue("t", 1, result_ttl_ms=9000)
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == own and q.cancel(own) == "leased"
    assert 0 < record_ttl_ms(client, q, own) <= 9000


def test_queue_setting_still_applies_without_one(client: redis.Redis, q: Queue) -> None:
    short = Queue(client, q.name, result_ttl_ms=5000)
    plain = short.enqueue("t", 1)
    assert short.cancel(plain) == "due"
    assert 0 < record_ttl_ms(client, q, plain) <= 5000
