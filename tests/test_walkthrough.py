"""The seed design's walkthrough, on the real scripts with a clock the test controls:
lease 30 s, 5 attempts, backoff 2^attempt s, no jitter."""

from __future__ import annotations

import pytest

from scheduler import Backoff, Queue, StaleToken
from tests.conftest import Clock

SEED_BACKOFF = Backoff(base_ms=2_000, factor=2.0, cap_ms=10**9, jitter=0.0)
LEASE_MS = 30_000


def test_lease_heartbeat_and_fencing(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    from datetime import UTC, datetime

    j0 = q.enqueue("t", None, run_at=datetime.fromtimestamp(100, UTC), backoff=SEED_BACKOFF)

    clock.set_s(99)
    assert q.claim("w1", limit=10, lease_ms=LEASE_MS).jobs == []
    clock.set_s(100)
    (first,) = q.claim("w1", limit=10, lease_ms=LEASE_MS).jobs
    assert (first.id, first.fence) == (j0, 1)

    clock.set_s(110)
    lease_until, statuses = q.heartbeat([(j0, first.token)], lease_ms=LEASE_MS)
    assert statuses == {j0: "held"} and lease_until == 140_000
    clock.set_s(135)
    assert q.claim("w2", limit=10, lease_ms=LEASE_MS).jobs == []

    clock.set_s(141)
    (second,) = q.claim("w2", limit=10, lease_ms=LEASE_MS).jobs
    assert (second.id, second.fence) == (j0, 2)

    with pytest.raises(StaleToken):
        q.complete(j0, first.token)
    q.complete(j0, second.token)
    assert q.status(j0) == "done"


def test_always_failing_job_backs_off_then_parks(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    job_id = q.enqueue("t", None, max_attempts=5, backoff=SEED_BACKOFF)
    log: list[str] = []
    t = 0
    while q.get_job(job_id).state != "dead":
        clock.set_s(t)
        for job in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs:
            out = q.fail(job.id, job.token, RuntimeError("always"))
            log.append(
                f"retry in {(out.run_at_ms - t * 1000) // 1000}s" if out.status == "retry"
                else "parked"
            )  # fmt: skip
        t += 1
        assert t < 100
    assert log == ["retry in 2s", "retry in 4s", "retry in 8s", "retry in 16s", "parked"]
    assert t - 1 == 30
    job = q.get_job(job_id)
    assert job.dead_reason == "attempts exhausted"
    assert [e["attempt"] for e in job.errors] == [1, 2, 3, 4, 5]
    assert q.counts().dead == 1
