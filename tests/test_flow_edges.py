"""Flow-control edge cases found in review: a child parked before its first claim can be
requeued and run; an aged job taken first does not make its priority level look empty."""

from __future__ import annotations

import datetime

import redis

from scheduler import Queue


def test_a_child_parked_by_a_cancelled_parent_runs_once_requeued(
    client: redis.Redis, q: Queue
) -> None:
    parent = q.enqueue("t", 1)
    q.cancel(parent)
    child = q.enqueue("t", 2, after=[parent])
    assert q.status(child) == "dead"
    assert q.requeue_dead([child]) == 1
    batch = q.claim("w", limit=10)
    assert [j.id for j in batch.jobs] == [child]  # before: parked again as 'invalid job: task'
    assert [j.task for j in batch.jobs] == ["t"]
    assert q.status(child) == "leased"


def test_aged_jobs_taken_first_leave_their_level_in_priority_order(q: Queue) -> None:
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=120)  # > 60 s aging
    for i in range(2):
        q.enqueue("hi_old", i, priority=5, run_at=old)
    for i in range(4):
        q.enqueue("hi", i, priority=5)
    for i in range(4):
        q.enqueue("lo", i, priority=1)
    tasks = [j.task for j in q.claim("w", limit=4).jobs]
    assert tasks == ["hi_old", "hi_old", "hi", "hi"]  # before: the level's rest skipped for 'lo'


def test_a_child_of_a_parent_parked_in_the_same_batch_is_parked_too(q: Queue) -> None:
    from scheduler import JobSpec

    p0 = q.enqueue("t", 0)
    q.cancel(p0)
    q.enqueue_many(
        [JobSpec("t", 1, job_id="a1", after=[p0]), JobSpec("t", 2, job_id="b1", after=["a1"])]
    )
    assert q.status("a1") == "dead"
    assert q.status("b1") == "dead"  # before: waiting for a1 forever
    assert "a1" in (q.get_job("b1").dead_reason or "")
