"""A key's limit raised for new jobs (a task's concurrency_limit 1 -> 5 in a deploy) while jobs
enqueued with the old limit wait on it. Claim applies the limit of the job it examines, so a
held job of limit 1 may start only when none of its key is leased, and its promotion (a lease
of the key ends) met a key kept busy by the newer jobs of limit 5 every time: under steady
traffic the old job was held for ever. A key's held jobs now go first: a newer job of the key is
held behind an older held one (the key is FIFO, as the page says), the key drains, and the old
job runs."""

from __future__ import annotations

from typing import Any

from scheduler import Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock


def test_a_job_held_under_a_lower_limit_runs_while_newer_jobs_keep_the_key_busy(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    for n in range(3):  # the key is busy with jobs of the raised limit
        q.enqueue("t", n, concurrency_key="k", concurrency_limit=5)
    leases = {j.id: j.token for j in q.claim("w", limit=10, lease_ms=60_000).jobs}
    assert len(leases) == 3
    old = q.enqueue("t", "old", concurrency_key="k", concurrency_limit=1)
    assert q.claim("w", limit=10, lease_ms=60_000).jobs == []  # held: k is full for it
    ran: list[str] = []
    for step in range(1, 30):  # steady traffic of the raised limit, one job per step
        clock.set_ms(T0 + 10 * step)
        q.enqueue("t", step, concurrency_key="k", concurrency_limit=5)
        oldest = next(iter(leases))
        q.complete(oldest, leases.pop(oldest), None)
        for job in q.claim("w", limit=10, lease_ms=60_000).jobs:
            leases[job.id] = job.token
            ran.append(job.id)
        assert len(leases) <= 5
        if old in ran:
            break
    assert old in ran, "the job of the old limit never ran"


def test_a_rate_windows_room_skips_a_job_held_behind_an_older_one_of_its_key(
    fq: tuple[Queue, Clock],
) -> None:
    # The rate step gives its room to jobs that can start: one claim would hold behind its
    # key's older held job goes back without taking it, and the room goes to another job.
    q, clock = fq
    # No aging time: r1's priority gives it no place ahead of b in k's hold set (a priority-9
    # job is placed up to priority_aging_ms before its run_at), and every job is aged, met by
    # run_at: r1 first.
    q.client.hset(q.keys.config, "priority_aging_ms", 0)
    rate: dict[str, Any] = {"rate_limit": "1/1s", "rate_key": "r"}
    c1 = q.enqueue("t", "c1", concurrency_key="k", concurrency_limit=5)
    x = q.enqueue("t", "x", **rate)
    assert sorted(j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs) == sorted([c1, x])
    clock.set_ms(T0 + 1)
    b = q.enqueue("t", "b", concurrency_key="k", concurrency_limit=1)  # older than r1
    clock.set_ms(T0 + 2)
    r1 = q.enqueue("t", "r1", priority=9, concurrency_key="k", concurrency_limit=5, **rate)
    clock.set_ms(T0 + 3)
    r2 = q.enqueue("t", "r2", **rate)
    assert q.claim("w", limit=10, lease_ms=60_000).jobs == []  # r1, r2 by r; b by k
    assert q.client.zscore(q.keys.prefix + "flow:ckheld:k", b) is not None
    clock.set_ms(T0 + 1_000)
    assert [j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs] == [r2]
    assert q.client.zscore(q.keys.prefix + "flow:ckheld:k", r1) is not None
