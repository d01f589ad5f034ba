"""The same behaviour on fakeredis, which users may want for their own unit tests. fakeredis is
faithful for what the scripts use (sorted sets, hashes, TIME, error replies; see the guide), but
the real server stays the reference: every other test runs on redis-server."""

from __future__ import annotations

import fakeredis
import pytest

from scheduler import Queue, StaleToken
from tests.conftest import Clock
from tests.test_simulation import run_one


@pytest.fixture
def fq() -> tuple[Queue, Clock]:
    client = fakeredis.FakeRedis(decode_responses=True)
    q = Queue(client, "fake", _clock="test")
    clock = Clock(client, q)
    clock.set_ms(0)
    return q, clock


def test_seeded_simulations_on_fakeredis(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    for seed in range(20):
        run_one(q, clock, seed)
        q.client.delete(q.keys.dead)


def test_fencing_on_fakeredis(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    job_id = q.enqueue("t", None)
    (first,) = q.claim("a", limit=1, lease_ms=1_000).jobs
    clock.set_ms(1_001)
    (second,) = q.claim("b", limit=1, lease_ms=1_000).jobs
    with pytest.raises(StaleToken):
        q.complete(job_id, first.token)
    q.complete(job_id, second.token)
    assert (second.fence, q.status(job_id)) == (2, "done")
