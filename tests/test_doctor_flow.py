"""doctor --fix moves a job as the transitions do with flow control (docs/flow-control.md):
into due, it goes back into its priority index and frees its key's slot (the key's held job is
promoted); parked, its waiting children are parked too. Real scripts on a private Redis."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms

HOUR_MS = 3_600_000


def lapse(client: redis.Redis, q: Queue, job_id: str) -> None:
    """The worker died an hour ago: its lease is long past (doctor finds lease-expired)."""
    client.zadd(q.keys.leased, {job_id: server_now_ms(client) - HOUR_MS})


def test_a_reaped_lease_goes_back_into_its_priority_index_and_frees_its_key(
    q: Queue, client: redis.Redis
) -> None:
    a, b = (
        q.enqueue("sync", i, priority=5, concurrency_key="tenant:7", concurrency_limit=1)
        for i in range(2)
    )
    assert [j.id for j in q.claim("w-gone", limit=2).jobs] == [a]  # b is held by the key
    assert client.zscore(q.keys.prefix + "flow:pdue:5", a) is None  # claimed: out of the index
    lapse(client, q, a)
    assert "lease-expired" in [i.code for i in check_queue(client, q.name)]
    repair_queue(client, q.name)
    assert client.zscore(q.keys.due, a) is not None
    assert client.zscore(q.keys.prefix + "flow:pdue:5", a) is not None  # before: left out
    assert client.zcard(q.keys.prefix + "flow:ck:tenant:7") == 0
    # The key's slot is free: its held job is due again, not held until another lease ends.
    assert client.zscore(q.keys.flow_held, b) is None
    assert client.zscore(q.keys.due, b) is not None
    assert q.get_job(b).fields.get("flow_reason") is None
    assert check_queue(client, q.name) == []


def test_a_parent_parked_by_doctor_parks_its_waiting_child(q: Queue, client: redis.Redis) -> None:
    parent = q.enqueue("fetch", None, max_attempts=1)
    child = q.enqueue("index", None, after=[parent])
    assert [j.id for j in q.claim("w-gone", limit=2).jobs] == [parent]
    lapse(client, q, parent)
    repair_queue(client, q.name)
    assert q.get_job(parent).state == "dead"
    job = q.get_job(child)
    assert job.state == "dead"  # before: waiting for a parent that will never be done
    assert job.dead_reason == f"parent dead: {parent}"
    assert client.zscore(q.keys.flow_waiting, child) is None
