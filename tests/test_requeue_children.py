"""requeue_dead of a child parked by its parent (docs/flow-control.md, Dependencies): it waits
again for those of its parents still pending, a parent requeued in the same call included in
either order, so a parent and its parked subtree run in their order again; a parent that ended
dead or cancelled is not waited for. Real scripts on a private Redis."""

from __future__ import annotations

import pytest
import redis

from scheduler import CorruptKey, JobSpec, Queue


def _kill(q: Queue, job_id: str) -> None:
    """Claim `job_id` (alone: the test enqueues it first) and fail it for good."""
    (j,) = q.claim("w", limit=1).jobs
    assert j.id == job_id
    assert q.fail(j.id, j.token, ("E", "boom", ""), retryable=False).status == "dead"


def _claimed(q: Queue) -> list[str]:
    return sorted(j.id for j in q.claim("w", limit=100).jobs)


def _finish(q: Queue, ids: list[str]) -> None:
    got = q.claim("w", limit=100).jobs
    assert sorted(j.id for j in got) == sorted(ids)
    for j in got:
        q.complete(j.id, j.token, None)


@pytest.mark.parametrize("order", ["child first", "parent first"])
def test_a_parent_and_its_parked_subtree_requeued_together_run_in_order(
    q: Queue, order: str
) -> None:
    p = q.enqueue("t", job_id="p")
    c = q.enqueue("t", job_id="c", after=[p])
    g = q.enqueue("t", job_id="g", after=[c])
    _kill(q, p)
    assert [q.status(i) for i in (c, g)] == ["dead", "dead"]
    ids = [g, c, p] if order == "child first" else [p, c, g]
    assert q.requeue_dead(ids) == 3
    assert q.client.hget(q.keys.job(c), "waiting_for") == "1"
    assert q.client.zscore(q.keys.prefix + "flow:waiting", g) is not None
    _finish(q, [p])  # before: all three claimed at once
    _finish(q, [c])
    _finish(q, [g])
    assert [q.status(i) for i in (p, c, g)] == ["done"] * 3


def test_a_requeued_child_waits_for_its_parent_still_running(q: Queue) -> None:
    # Two parents: p1 dies (parks the child), p2 is still leased when the child is requeued.
    p1 = q.enqueue("t", job_id="p1")
    p2 = q.enqueue("t", job_id="p2")
    c = q.enqueue("t", job_id="c", after=[p1, p2])
    jobs = {j.id: j for j in q.claim("w", limit=2).jobs}
    assert q.fail(p1, jobs[p1].token, ("E", "x", ""), retryable=False).status == "dead"
    assert q.status(c) == "dead"
    assert q.requeue_dead([c]) == 1
    assert _claimed(q) == []  # before: the child ran beside p2
    assert q.get_job(c).fields.get("flow_reason") == "waiting for 1 jobs"
    q.complete(p2, jobs[p2].token, None)
    assert _claimed(q) == [c]


def test_a_child_parked_at_enqueue_waits_for_its_pending_parent_once_requeued(q: Queue) -> None:
    dead = q.enqueue("t", job_id="p1")
    _kill(q, dead)
    pending = q.enqueue("t", job_id="p2", delay_ms=60_000)
    c = q.enqueue("t", job_id="c", after=[dead, pending])
    assert q.status(c) == "dead"  # parked at once: a parent already dead
    assert q.requeue_dead([c]) == 1
    assert q.client.hget(q.keys.job(c), "parents") == pending
    assert q.client.zscore(q.keys.prefix + "flow:waiting", c) is not None
    q.client.zadd(q.keys.due, {pending: 0})  # p2 due now
    _finish(q, [pending])
    assert _claimed(q) == [c]


def test_a_child_of_a_parent_still_dead_runs_at_once(q: Queue) -> None:
    p = q.enqueue("t", job_id="p")
    c = q.enqueue("t", job_id="c", after=[p])
    _kill(q, p)
    assert q.requeue_dead([c]) == 1
    assert _claimed(q) == [c]
    assert q.client.hget(q.keys.job(c), "parents") is None


def test_a_hand_edited_parents_field_runs_the_child(q: Queue) -> None:
    p = q.enqueue("t", job_id="p")
    other = q.enqueue("t", job_id="o", delay_ms=60_000)
    c = q.enqueue("t", job_id="c", after=[p])
    _kill(q, p)
    q.client.hset(q.keys.job(c), "parents", "o;DROP")  # no list of ids: not waited for
    assert q.requeue_dead([c]) == 1
    assert _claimed(q) == [c]
    assert q.status(other) == "scheduled"


def test_flow_sets_of_another_type_refuse_a_child_and_write_nothing(
    q: Queue, client: redis.Redis
) -> None:
    p = q.enqueue("t", job_id="p")
    c = q.enqueue("t", job_id="c", after=[p])
    plain = q.enqueue("t", job_id="plain")
    _kill(q, p)
    (j,) = q.claim("w", limit=1).jobs
    assert q.fail(j.id, j.token, ("E", "x", ""), retryable=False).status == "dead"
    client.delete(q.keys.prefix + "flow:waiting")
    client.set(q.keys.prefix + "flow:waiting", "edited by hand")
    before = client.hgetall(q.keys.job(c))
    with pytest.raises(CorruptKey):
        q.requeue_dead([plain, c])
    assert client.hgetall(q.keys.job(c)) == before
    assert q.status(plain) == "dead"
    # A job without parents needs no flow set: it is requeued.
    assert q.requeue_dead([plain]) == 1
    assert _claimed(q) == [plain]


def test_requeue_of_a_batch_child_keeps_a_parent_done_meanwhile(q: Queue) -> None:
    # The parent listed is done by the time of the requeue: the child runs at once.
    p1, p2 = q.enqueue_many([JobSpec("t", job_id="p1"), JobSpec("t", job_id="p2")])
    c = q.enqueue("t", job_id="c", after=[p1, p2])
    jobs = {j.id: j for j in q.claim("w", limit=2).jobs}
    assert q.fail(p1, jobs[p1].token, ("E", "x", ""), retryable=False).status == "dead"
    q.complete(p2, jobs[p2].token, None)
    assert q.requeue_dead([c]) == 1
    assert _claimed(q) == [c]
