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


def _pdue(client: redis.Redis, q: Queue, job_id: str) -> float | None:
    score = client.zscore(q.keys.prefix + "flow:pdue:5", job_id)
    return None if score is None else float(score)


def test_a_repair_that_takes_a_job_out_of_due_takes_it_out_of_its_priority_index(
    q: Queue, client: redis.Redis
) -> None:
    # Parked (its record unusable) or kept in its other place (in two at once): out of due, so
    # out of its level's index too. Before, the entry stayed until a claim's scan met it.
    parked = q.enqueue("sync", 1, priority=5, delay_ms=HOUR_MS)
    doubled = q.enqueue("sync", 2, priority=5, delay_ms=HOUR_MS)
    assert _pdue(client, q, parked) is not None and _pdue(client, q, doubled) is not None
    client.hset(q.keys.job(parked), "max_attempts", "many")  # no worker can run it
    client.zadd(q.keys.leased, {doubled: server_now_ms(client) + HOUR_MS})
    client.hset(q.keys.job(doubled), "state", "leased")
    codes = {i.job_id: i.code for i in check_queue(client, q.name)}
    assert codes == {parked: "invalid-job", doubled: "two-places"}, codes
    repair_queue(client, q.name)
    assert q.status(parked) == "dead" and client.zscore(q.keys.due, doubled) is None
    assert _pdue(client, q, parked) is None and _pdue(client, q, doubled) is None


def test_a_bad_due_score_set_to_now_moves_its_priority_index_entry_too(
    q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("sync", 1, priority=5, delay_ms=HOUR_MS)
    client.zadd(q.keys.due, {job_id: float("inf")})
    assert [i.code for i in check_queue(client, q.name)] == ["bad-score"]
    repair_queue(client, q.name)
    due_ms = client.zscore(q.keys.due, job_id)
    assert due_ms is not None and due_ms <= server_now_ms(client)
    # The priority pass takes it now, not an hour from now (its old entry).
    assert _pdue(client, q, job_id) == due_ms
    assert [j.id for j in q.claim("w", limit=1).jobs] == [job_id]
