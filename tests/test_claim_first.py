"""A job's first claim writes the spec's fields a finished record needs, also for a job parked
before it was ever claimed (a dead parent) and then requeued (review of the settlement
scripts: its hash held a state, so claim took the re-claim path and complete then made a lean
record with the defaults: keep_payload, result_ttl_ms, max_attempts and task lost)."""

from __future__ import annotations

import redis

from scheduler import Queue


def test_a_requeued_child_parked_before_its_first_claim_keeps_its_options(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("p.t", {}, job_id="P")
    q.enqueue(
        "c.t",
        {"keep": "me"},
        job_id="C",
        after=["P"],
        keep_payload=True,
        max_attempts=3,
        result_ttl_ms=123_456,
    )
    (p,) = q.claim("w", limit=10, lease_ms=10_000).jobs
    q.fail(p.id, p.token, ("E", "m", ""), retryable=False)
    assert q.status("C") == "dead"  # parked with its parent, never claimed
    assert q.requeue_dead(["C"]) == 1
    (c,) = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert (c.id, c.task, c.max_attempts) == ("C", "c.t", 3)
    q.complete(c.id, c.token, "ok")
    job = q.get_job("C")
    assert (job.task, job.max_attempts, job.payload_dropped) == ("c.t", 3, False)
    assert job.payload() == {"keep": "me"}
    assert 0 < client.pttl(q.keys.job("C")) <= 123_456


def test_a_retried_job_is_not_taken_for_a_first_claim(q: Queue, client: redis.Redis) -> None:
    # The first-claim write (fence 1) happens once: a job claimed before keeps counting up.
    j = q.enqueue("t", None, max_attempts=4)
    first = q.claim("w", limit=1, lease_ms=10_000).jobs[0]
    q.fail(j, first.token, ("E", "m", ""), retryable=True, delay_ms=0)
    again = q.claim("w", limit=1, lease_ms=10_000).jobs[0]
    assert first.token.split("-")[0] == "1" and again.token.split("-")[0] == "2"
    assert client.hget(q.keys.job(j), "fence") == "2"
