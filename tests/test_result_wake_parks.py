"""Every park pushes the result wake-up a `Queue.result()` waiter blocks on, as fail's park and
cancel do: a job parked by the reaper (its last lease lapsed), by claim (its start deadline
passed) or by doctor --fix, and a child parked because its parent ended dead or cancelled.
Before: those paths wrote no `result:<id>`, so its waiters learnt the outcome only at their
next re-read."""

from __future__ import annotations

import pytest
import redis

from scheduler import Queue
from scheduler.admin.inspection import server_now_ms
from scheduler.core import scripts
from tests.conftest import Clock


def _announce(client: redis.Redis, q: Queue, job_id: str) -> None:
    # What a waiting Queue.result() has written (operations/result_wait.py).
    client.sadd(q.keys.result_wait(job_id), "waiter")
    client.pexpire(q.keys.result_wait(job_id), 600_000)


def _wake(client: redis.Redis, q: Queue, job_id: str) -> list[str]:
    return client.lrange(q.keys.result_wake(job_id), 0, -1)  # type: ignore[return-value]


def test_the_reaper_wakes_a_waiter_of_the_job_it_parks(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1_000)
    job_id = q.enqueue("t", {}, max_attempts=1)
    assert len(q.claim("w", limit=1, lease_ms=1_000).jobs) == 1
    _announce(client, q, job_id)
    clock.set_ms(10_000)
    assert q.claim("w2", limit=1).jobs == []  # reaps: out of attempts, parked
    assert q.get_job(job_id).fields["dead_reason"] == "lease expired"
    assert _wake(client, q, job_id) == ["dead"]


def test_claim_wakes_a_waiter_of_a_job_past_its_start_deadline(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1_000)
    job_id = q.enqueue("t", {}, start_within_ms=1_000)
    _announce(client, q, job_id)
    clock.set_ms(10_000)
    assert q.claim("w", limit=1).jobs == []
    assert q.get_job(job_id).fields["dead_reason"] == "start deadline passed"
    assert _wake(client, q, job_id) == ["dead"]


@pytest.mark.parametrize("end", ["dead", "cancelled"])
def test_a_parents_end_wakes_the_waiters_of_the_children_it_parks(
    q: Queue, client: redis.Redis, end: str
) -> None:
    parent = q.enqueue("t", {}, max_attempts=1)
    child = q.enqueue("t", {}, after=[parent])
    grandchild = q.enqueue("t", {}, after=[child])
    _announce(client, q, child)
    _announce(client, q, grandchild)
    if end == "dead":
        (lease,) = q.claim("w", limit=1).jobs
        assert q.fail(parent, lease.token, ValueError("x")).status == "dead"
    else:
        assert q.cancel(parent) == "due"
    assert q.get_job(child).fields["dead_reason"] == f"parent {end}: {parent}"
    assert q.get_job(grandchild).fields["dead_reason"] == f"parent dead: {child}"
    assert _wake(client, q, child) == ["dead"]
    assert _wake(client, q, grandchild) == ["dead"]


def test_doctors_park_wakes_a_waiter_of_the_job(q: Queue, client: redis.Redis) -> None:
    job_id = q.enqueue("t", {}, max_attempts=1)
    q.claim("w-gone", limit=1)
    _announce(client, q, job_id)
    now_ms = server_now_ms(client)
    keys = q.keys.script_keys()
    argv: list[str | int] = ["dead", job_id, "leased", "", now_ms, "lease expired", now_ms]
    assert client.eval(scripts.source("repair"), len(keys), *keys, *argv) == 1
    assert q.get_job(job_id).state == "dead"
    assert _wake(client, q, job_id) == ["dead"]
