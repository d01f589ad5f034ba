"""Review of the operator actions (cancel, reschedule, requeue_dead, purge_dead, release) on jobs
in each state, and the job's later life: a key's slot freed by a cancel, a parent's cancel
parking its subtree and waking result() waiters, a requeued child waiting again only for its
parents still pending, a schedule's requeued run beside its pending one, an idempotency key
after cancel and requeue. On the test clock (tests/conftest.py tq) where time matters."""

from __future__ import annotations

import threading

import pytest
import redis

from scheduler import Queue
from scheduler.cli.admin import queue_stats
from scheduler.core.errors import JobCancelled, JobDead
from tests.conftest import Clock

T0 = 1_000_000
HOUR_MS = 3_600_000


def _claim_ids(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs]


def _fail_to_dead(q: Queue) -> str:
    [job] = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert q.fail(job.id, job.token, ValueError("boom")).status == "dead"
    return job.id


def test_cancelling_a_job_a_freed_slot_was_passed_to_passes_it_on(
    tq: tuple[Queue, Clock],
) -> None:
    """A key at its limit: the lease's end lets the next held job into due for the free slot;
    cancelling that one (before any claim) lets the third run, and the counts drop to none."""
    q, clock = tq
    clock.set_ms(T0)
    first, second, third = (
        q.enqueue("c", n, concurrency_key="k", concurrency_limit=1) for n in range(3)
    )
    [lease] = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert lease.id == first and _claim_ids(q) == []
    assert q.counts().held_key_limit == 2
    q.complete(lease.id, lease.token)
    assert q.cancel(second) == "due"  # let out for the freed slot, not yet claimed
    assert q.status(third) == "due"
    assert _claim_ids(q) == [third]
    counts = q.counts()
    assert (counts.due, counts.leased, counts.held_key_limit) == (0, 1, 0)


def test_a_parents_cancel_parks_its_subtree_and_wakes_every_result_waiter(q: Queue) -> None:
    parent = q.enqueue("t", 1, delay_ms=HOUR_MS)
    child = q.enqueue("t", 2, after=[parent])
    grandchild = q.enqueue("t", 3, after=[child])
    got: dict[str, BaseException | None] = {}

    def wait(job_id: str) -> None:
        try:
            q.result(job_id, timeout_s=10)
            got[job_id] = None
        except Exception as exc:
            got[job_id] = exc

    waiters = [threading.Thread(target=wait, args=(j,)) for j in (parent, child, grandchild)]
    for t in waiters:
        t.start()
    assert q.cancel(parent) == "scheduled"
    for t in waiters:
        t.join(15)
    assert isinstance(got[parent], JobCancelled)
    child_err, grandchild_err = got[child], got[grandchild]
    assert isinstance(child_err, JobDead) and isinstance(grandchild_err, JobDead)
    assert child_err.reason == f"parent cancelled: {parent}"
    assert grandchild_err.reason == f"parent dead: {child}"
    counts = q.counts()
    assert (counts.due, counts.scheduled, counts.dead, counts.held_waiting) == (0, 0, 2, 0)
    window = queue_stats(q.client, q.name)["windows"]["1m"]
    assert (window["cancel"], window["dead"]) == (1, 2)


def test_a_requeued_child_waits_again_for_each_parent_still_pending_and_no_more(
    tq: tuple[Queue, Clock],
) -> None:
    """Three parents, the first dead: the parked child, requeued, waits for the other two (not
    for the dead one), runs after the last of them, and not after the first."""
    q, clock = tq
    clock.set_ms(T0)
    dead_parent = q.enqueue("t", 1, max_attempts=1)
    p2 = q.enqueue("t", 2, delay_ms=1_000)
    p3 = q.enqueue("t", 3, delay_ms=2_000)
    child = q.enqueue("t", 4, after=[dead_parent, p2, p3])
    assert _fail_to_dead(q) == dead_parent
    assert q.get_job(child).dead_reason == f"parent dead: {dead_parent}"
    assert q.requeue_dead([child]) == 1
    assert q.status(child) == "held"
    clock.set_ms(T0 + 1_000)
    [lease] = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert lease.id == p2
    q.complete(lease.id, lease.token)
    assert q.status(child) == "held" and q.counts().held_waiting == 1
    clock.set_ms(T0 + 2_000)
    [lease] = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert lease.id == p3
    q.complete(lease.id, lease.token)
    assert _claim_ids(q) == [child]


def test_a_schedules_requeued_dead_run_is_a_job_of_its_own_beside_the_pending_one(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=60_000, max_attempts=1, start_within_ms=5_000)
    clock.set_ms(1_020_000)
    run = _fail_to_dead(q)
    pending = q.get_schedule("s").pending
    assert pending != run and q.reschedule(pending, delay_ms=0) == "schedule"
    assert q.requeue_dead([run]) == 1
    assert q.get_job(run).start_by_ms is None  # a requeue drops the deadline
    assert q.reschedule(run, delay_ms=1_000) == "rescheduled"
    clock.set_ms(1_030_000)
    assert _claim_ids(q) == [run]
    assert q.get_schedule("s").pending == pending  # nothing armed twice, nothing withdrawn
    assert client.zrange(q.keys.due, 0, -1) == [pending]
    # Cancelling the pending run arms the next slot in its place.
    assert q.cancel(pending) == "scheduled"
    assert q.get_schedule("s").pending == "schedule:s:1140000"


def test_an_idempotency_key_after_cancel_and_requeue(tq: tuple[Queue, Clock]) -> None:
    """The key outlives a cancel (a plain call is answered with the cancelled job, nothing
    enqueued: the key is held "even once the job has run"); a debounced call after a cancel
    makes a new job; a requeued job keeps its key."""
    q, clock = tq
    clock.set_ms(T0)
    plain = q.enqueue("t", 1, key="plain")
    assert q.cancel(plain) == "due"
    assert q.enqueue("t", 2, key="plain") == plain
    assert q.status(plain) == "cancelled" and q.counts().due == 0
    debounced = q.enqueue("t", 1, key="deb", debounce=True, delay_ms=1_000)
    assert q.cancel(debounced) == "scheduled"
    again = q.enqueue("t", 2, key="deb", debounce=True, delay_ms=1_000)
    assert again != debounced
    assert (q.status(debounced), q.status(again)) == ("cancelled", "scheduled")
    parked = q.enqueue("t", 3, key="parked", max_attempts=1)
    clock.set_ms(T0 + 1_000)
    # The claim takes the due ones: `parked`, and `again` (due at T0 + 1,000).
    leases = {j.id: j for j in q.claim("w", limit=10, lease_ms=60_000).jobs}
    assert set(leases) == {parked, again}
    q.fail(parked, leases[parked].token, ValueError("boom"))
    assert q.requeue_dead([parked]) == 1
    assert q.enqueue("t", 4, key="parked") == parked
    assert q.counts().due == 1


def test_a_retry_waiting_out_its_backoff_is_scheduled_to_cancel_and_moves(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", 1)
    [lease] = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert q.fail(lease.id, lease.token, ValueError("boom")).status == "retry"
    assert q.counts().scheduled == 1
    assert q.reschedule(job_id, delay_ms=0) == "rescheduled"
    assert (q.counts().due, q.counts().scheduled) == (1, 0)
    assert q.cancel(job_id) == "due"
    assert q.get_job(job_id).attempts == 1
    assert q.release([(lease.id, lease.token)]) == ["stale"]
    counts = q.counts()
    assert (counts.due, counts.scheduled, counts.leased) == (0, 0, 0)


def test_the_dead_error_of_a_child_parked_by_its_parents_cancel_reads_cleanly(q: Queue) -> None:
    """`q.result(child)` after the parent was cancelled raises JobDead; its message, what a
    log line shows, said "job 'X' is dead (parent cancelled: P): None: None" (a strict xfail
    once; now the reason alone)."""
    parent = q.enqueue("t", 1, delay_ms=HOUR_MS)
    child = q.enqueue("t", 2, after=[parent])
    q.cancel(parent)
    with pytest.raises(JobDead) as caught:
        q.result(child, timeout_s=5)
    assert caught.value.reason == f"parent cancelled: {parent}"
    assert "None" not in str(caught.value)
