"""A parent of many waiting children (enqueue after=): its end reaches at most FLOW_END_STEP
(300) of them per script, so one call never holds the server for seconds (a scale audit
measured 1.9 s for complete, 2.5 s for cancel of a parent of 100k children); the rest follow in
bounded steps at the next claims. Dead-letter retention trims at most 100 per script, not per
child parked."""

from __future__ import annotations

import redis

from scheduler import JobSpec, Queue
from scheduler.admin.doctor import check_queue

STEP = 300  # lua/lib/flow.lua FLOW_END_STEP
THREE_STEPS = 2 * STEP + 200  # children reached over three steps
TWO_STEPS = STEP + 200


def _fan_out(q: Queue, n: int) -> tuple[str, list[str]]:
    parent = q.enqueue("parent", None)
    kids = q.enqueue_many([JobSpec("kid", i, after=[parent]) for i in range(n)], batch_size=2000)
    return parent, kids


def _lease(q: Queue, job_id: str) -> str:
    """Lease the parent alone (the children wait: no claim would take them)."""
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == job_id
    return job.token


def _waiting(client: redis.Redis, q: Queue) -> int:
    return int(client.zcard(q.keys.flow_waiting))


def test_a_parents_completion_frees_its_children_in_bounded_steps(
    q: Queue, client: redis.Redis
) -> None:
    parent, kids = _fan_out(q, THREE_STEPS)
    q.complete(parent, _lease(q, parent))
    assert _waiting(client, q) == THREE_STEPS - STEP  # one step in complete's own script
    assert client.zrange(q.keys.flow_ending, 0, -1) == [f"done:{parent}"]
    # The rest moved to the end's own set: the id's own set and mark are gone at once.
    assert client.scard(f"{q.keys.flow_ending}:done:{parent}") == THREE_STEPS - STEP
    assert client.exists(f"{q.keys.prefix}flow:children:{parent}") == 0
    assert client.hget(q.keys.job(parent), "kids") is None
    assert [i.code for i in check_queue(client, q.name) if i.code == "stuck-waiting"] == []
    batch = q.claim("w", limit=0)  # a claim takes the next step before it leases
    assert batch.jobs == []
    assert _waiting(client, q) == THREE_STEPS - 2 * STEP
    assert client.llen(q.keys.wake) >= 1  # and wakes an idle worker while any is left
    q.claim("w", limit=0)
    assert _waiting(client, q) == 0
    assert client.exists(q.keys.flow_ending, f"{q.keys.flow_ending}:done:{parent}") == 0
    assert q.counts().due == THREE_STEPS
    leased = {j.id for _ in range(3) for j in q.claim("w", limit=1_000).jobs}
    assert leased == set(kids)


def test_a_dead_parent_parks_its_subtree_in_bounded_steps(q: Queue, client: redis.Redis) -> None:
    parent, kids = _fan_out(q, 450)
    # Ten of its children have 20 children each: 650 jobs to park, more than one step.
    grandkids = {
        kid: q.enqueue_many([JobSpec("grandkid", i, after=[kid]) for i in range(20)])
        for kid in kids[:10]
    }
    token = _lease(q, parent)
    out = q.fail(parent, token, ("E", "boom", ""), retryable=False)
    assert out.status == "dead"
    assert _waiting(client, q) == 650 - STEP
    for _ in range(3):
        q.claim("w", limit=0)
    assert _waiting(client, q) == 0
    assert client.exists(q.keys.flow_ending) == 0
    for kid in kids:
        assert q.get_job(kid).dead_reason == f"parent dead: {parent}"
    for kid, theirs in grandkids.items():
        for g in theirs:
            assert q.get_job(g).dead_reason == f"parent dead: {kid}"
    assert len(q.dead_ids()) == 1 + 650


def test_a_cancelled_parents_children_are_parked_past_one_step(
    q: Queue, client: redis.Redis
) -> None:
    parent, kids = _fan_out(q, TWO_STEPS)
    assert q.cancel(parent) == "due"  # the state it had: cancelled now
    assert _waiting(client, q) == TWO_STEPS - STEP
    q.claim("w", limit=0)
    assert _waiting(client, q) == 0
    assert {q.get_job(k).dead_reason for k in kids} == {f"parent cancelled: {parent}"}


def test_dead_retention_trims_at_most_one_step_per_script(q: Queue, client: redis.Redis) -> None:
    """Before, each child parked trimmed up to 100: one fail could delete a whole backlog."""
    old = q.enqueue_many([JobSpec("old", None, max_attempts=1) for _ in range(100)])
    for job in q.claim("w", limit=100).jobs:
        q.fail(job.id, job.token, ("E", "x", ""), retryable=False)
    q.set_dead_retention(max_count=10)
    parent, _ = _fan_out(q, 300)
    (job,) = [j for j in q.claim("w", limit=10).jobs if j.id == parent]
    q.fail(parent, job.token, ("E", "boom", ""), retryable=False)
    # The claim trimmed the old ones down to 10 (90); then the parent + 300 children parked:
    # that one fail trimmed 100 of the 311, not all 301 beyond the limit.
    assert int(client.zcard(q.keys.dead)) == 100 - 90 + 1 + 300 - 100
    assert sum(client.exists(q.keys.job(i)) for i in old) == 0  # the oldest went first
    q.enqueue("x", None, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs  # a claim trims a step too (100)
    q.fail(job.id, job.token, ("E", "x", ""), retryable=False)  # and the next park
    assert int(client.zcard(q.keys.dead)) == 211 - 100 + 1 - 100


def test_a_hand_written_entry_is_dropped_by_the_next_step(q: Queue, client: redis.Redis) -> None:
    client.zadd(q.keys.flow_ending, {"bogus": 1, "done:": 2})
    q.claim("w", limit=0)
    assert client.exists(q.keys.flow_ending) == 0


def test_a_later_job_under_the_same_id_is_not_reached_by_the_old_end(
    q: Queue, client: redis.Redis
) -> None:
    """The children a parent's end left for later steps move to that end's own set: a job that
    takes the id again (its record expired) and its own children are not released by it."""
    parent = q.enqueue("parent", None, job_id="nightly", result_ttl_ms=1)
    q.enqueue_many([JobSpec("kid", i, after=[parent]) for i in range(TWO_STEPS)])
    q.complete(parent, _lease(q, parent))
    client.delete(q.keys.job(parent), q.keys.spec(parent))  # its record expired
    again = q.enqueue("parent", None, job_id="nightly")
    child = q.enqueue("kid2", None, after=[again])
    assert q.get_job(child).fields.get("waiting_for") == "1"
    q.claim("w", limit=0)  # the old end's last step
    assert client.exists(q.keys.flow_ending) == 0
    assert q.get_job(child).fields.get("waiting_for") == "1"  # still waits for the new one
    leased = {j.id for j in q.claim("w", limit=1_000).jobs}
    assert again in leased and child not in leased


def test_a_parent_requeued_from_dead_keeps_its_new_children(q: Queue, client: redis.Redis) -> None:
    parent, kids = _fan_out(q, TWO_STEPS)
    q.fail(parent, _lease(q, parent), ("E", "boom", ""), retryable=False)
    assert q.requeue_dead([parent]) == 1
    child = q.enqueue("kid2", None, after=[parent])
    q.claim("w", limit=0)  # the dead end's last step parks the rest of the old children
    assert {q.get_job(k).dead_reason for k in kids} == {f"parent dead: {parent}"}
    fresh = q.get_job(child)
    assert fresh.state == "held" and fresh.dead_reason is None  # waits for the requeued parent
    assert fresh.fields.get("waiting_for") == "1"
