"""Review of this session's changes (6787f5a..HEAD) from a production user's side: a partitioned
manual claim that gives back what other partitions leased beside a last-attempt suspect
(partitioned_lease.py `alone` / `besides` / `without`), doctor --fix restoring a lost lease
(lua/repair.lua move 'lease'), reschedule of a schedule's claimed runs (lua/reschedule.lua), and a
cancelled asyncio result wait's leave taking no wait slot (result_waiting.py `_send`).

A test marked xfail(strict=True) shows a defect: it asserts the right behaviour, failing today.
The others guard behaviour checked here and found right."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, Backoff, JobNotFound, Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.client.partitioned import PartitionedQueue
from tests.conftest import Clock, delete_queue
from tests.fixtures.partitioned import MakePq
from tests.redis_server import is_cluster_run

T0 = 1_000_000
LEASE_MS = 1000
HOUR_MS = 3_600_000


# -- PartitionedQueue.claim: a last-attempt suspect comes back alone ----------------------------


def _suspect_beside(
    make_pq: MakePq, client: redis.Redis, **others_kw: Any
) -> tuple[PartitionedQueue, str, list[str]]:
    """A 2-partition queue on the test clock holding a last-attempt suspect (one lapse,
    max_attempts=2) in one partition and two jobs (enqueued with `others_kw`) in the other."""
    pq = make_pq(partitions=2, _clock="test")
    for part in pq.parts:
        client.set(part.keys.test_clock, T0)
    suspect = pq.enqueue("t", {}, max_attempts=2)
    (first,) = pq.claim("crashed", limit=1, lease_ms=LEASE_MS).jobs  # its worker killed
    assert first.id == suspect
    for part in pq.parts:
        client.set(part.keys.test_clock, T0 + LEASE_MS + 1)
        part.claim("reaper", limit=0)  # reaped: due again, one lapse
    assert pq.status(suspect) == "due"
    home = next(p for p in pq.parts if client.zscore(p.keys.due, suspect) is not None)
    others: list[str] = []
    while len(others) < 2:
        job_id = pq.enqueue("t", {}, **others_kw)
        if client.zscore(home.keys.due, job_id) is None and pq.status(job_id) == "due":
            others.append(job_id)
        else:
            pq.cancel(job_id)  # landed beside the suspect: not one of the others
    return pq, suspect, others


@pytest.mark.xfail(
    strict=True,
    reason="a documented limit (docs/durability.md, 'Contained failure'): "
    "scheduler/client/partitioned_lease.py:98: the suspect's partition freezes its holder "
    "(isolated '!<id>'), the others do not: the manual API's next claim leases their jobs "
    "(the worker claims nothing while it runs one: worker/alone.py)",
)
def test_a_holder_of_a_partitioned_last_attempt_suspect_is_leased_nothing_more(
    make_pq: MakePq, client: redis.Redis
) -> None:
    """docs/durability.md: a suspect on its last attempt runs truly alone, "a worker holding one
    is leased nothing until it ends" (Queue.claim: tests/test_review_suspect_alone.py
    test_a_client_that_does_not_say_what_it_holds_is_frozen_while_it_holds_one). A manual
    worker of a partitioned queue gets the suspect alone, then claims again while running it
    (its loop's next poll): the other partition leases it both jobs, and the suspect shares
    the process with them; a crash of that worker now parks the batch-mates' attempts too."""
    pq, suspect, others = _suspect_beside(make_pq, client)
    got = pq.claim("manual", limit=10, lease_ms=LEASE_MS)
    assert [j.id for j in got.jobs] == [suspect]
    again = pq.claim("manual", limit=10, lease_ms=LEASE_MS)  # still holding the suspect
    assert again.jobs == []
    assert [pq.status(j) for j in others] == ["due", "due"]


@pytest.mark.xfail(
    strict=True,
    reason="a documented limit (docs/durability.md, 'Contained failure'): "
    "scheduler/client/partitioned_lease.py:105: the give-back is a release, which keeps each "
    "job's rate-limit start: a job never handed out waits for its window's next room",
)
def test_a_rate_limited_job_given_back_beside_a_suspect_is_not_held_for_its_window(
    make_pq: MakePq, client: redis.Redis
) -> None:
    """Two jobs of a `2/1h` rate key (a paid API) wait in one partition; a last-attempt suspect
    in the other. A manual claim leases all three and gives the two back, unrun (no code saw
    them). The next worker should get them: they are held for an hour instead, their window
    used up by a claim nobody ran."""
    pq, suspect, others = _suspect_beside(make_pq, client, rate_limit="2/1h", rate_key="api")
    got = pq.claim("manual", limit=10, lease_ms=LEASE_MS)
    assert [j.id for j in got.jobs] == [suspect]
    nxt = pq.claim("other", limit=10, lease_ms=LEASE_MS)
    assert sorted(j.id for j in nxt.jobs) == sorted(others)


def test_a_keyed_job_given_back_beside_a_suspect_frees_its_key_slot(
    make_pq: MakePq, client: redis.Redis
) -> None:
    """Two jobs of a concurrency key of limit 1: the give-back frees the slot the first took
    (the second stays held behind it), so another worker runs the first at once, once."""
    pq, suspect, others = _suspect_beside(make_pq, client, concurrency_key="k", concurrency_limit=1)
    got = pq.claim("manual", limit=10, lease_ms=LEASE_MS)
    assert [j.id for j in got.jobs] == [suspect]
    (j,) = pq.claim("other", limit=10, lease_ms=LEASE_MS).jobs
    assert j.id in others and j.attempts == 1
    assert sorted(str(pq.status(o)) for o in others) == ["held", "leased"]
    pq.complete(j.id, j.token)
    (k,) = pq.claim("other", limit=10, lease_ms=LEASE_MS).jobs
    assert {j.id, k.id} == set(others)


def test_a_replayed_claim_after_its_give_back_returns_the_suspect_alone(
    make_pq: MakePq, client: redis.Redis
) -> None:
    """The answer was lost after the give-back (no other worker since): the re-sent nonce
    answers the suspect alone, the given-back jobs stay due for others."""
    pq, suspect, others = _suspect_beside(make_pq, client)
    first = pq.claim("manual", limit=10, lease_ms=LEASE_MS, nonce="nreplay9")
    again = pq.claim("manual", limit=10, lease_ms=LEASE_MS, nonce="nreplay9")
    assert [j.id for j in first.jobs] == [j.id for j in again.jobs] == [suspect]
    assert again.jobs[0].token == first.jobs[0].token
    assert [pq.status(j) for j in others] == ["due", "due"]


def test_a_give_back_whose_reply_was_lost_hands_out_no_job_due_again(
    make_pq: MakePq, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The give-back's release ran on the server, then the connection dropped before its reply
    (a timeout under load). The claim returns the two jobs as still the caller's, beside the
    suspect: they are due again, another worker runs them too, and the caller's results are
    refused. Every job a claim hands out should be leased to the caller under its token."""
    pq, suspect, _ = _suspect_beside(make_pq, client)
    real = PartitionedQueue.release

    def lost_reply(self: PartitionedQueue, leases: Any) -> list[str]:
        real(self, leases)
        raise redis.ConnectionError("connection lost before the reply")

    monkeypatch.setattr(PartitionedQueue, "release", lost_reply)
    got = pq.claim("manual", limit=10, lease_ms=LEASE_MS)
    monkeypatch.undo()
    _, held = pq.heartbeat([(j.id, j.token) for j in got.jobs], lease_ms=LEASE_MS)
    assert held == {j.id: "held" for j in got.jobs}
    assert [j.id for j in got.jobs] == [suspect]


# -- doctor --fix: a leased job in no place gets its lease back ---------------------------------


def test_doctor_fix_of_a_lost_lease_keeps_its_concurrency_slot(
    q: Queue, client: redis.Redis
) -> None:
    """A job of a concurrency key of limit 1 runs; a second waits, held. Its leased entry is
    deleted by hand. doctor --fix restores the lease (its worker goes on), but also reports
    the key's slot as "no lease of key k" and frees it: the held job is let out and a second
    worker runs it beside the first, two at once on a key of limit 1."""
    a = q.enqueue("t", {}, concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", {}, concurrency_key="k", concurrency_limit=1)
    (ja,) = q.claim("w1", limit=10).jobs
    assert ja.id == a and q.status(b) == "held"
    client.zrem(q.keys.leased, a)
    repair_queue(client, q.name)
    assert q.heartbeat([(a, ja.token)])[1] == {a: "held"}  # its lease is back
    assert q.claim("w2", limit=10).jobs == [], "a second job of the key runs beside it"
    assert q.status(b) == "held"


@pytest.mark.xfail(
    strict=True,
    reason="a documented limit (docs/durability.md, doctor): "
    "scheduler/admin/doctor_model.py:240: the restored lease is 30 s whatever lease the worker "
    "took; a holder heartbeating less often loses the job to a second run (at least once)",
)
def test_doctor_fix_restores_a_lease_its_holder_can_keep(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """docs/durability.md: the job "gets its lease back for 30 s ...: a holder still running it
    renews it with its heartbeats". A worker of `lease_ms=600_000` heartbeats every 200 s (a
    third of it, as WorkerSettings allows): two minutes after the fix, before its next
    heartbeat, another worker's claim reaps the restored lease and runs the job a second time;
    the holder's heartbeat is then refused ('stale')."""
    q, clock = tq
    now = server_now_ms(client)
    clock.set_ms(now)  # the scripts' clock at the server's, which doctor reads
    a = q.enqueue("t", {})
    (ja,) = q.claim("w1", limit=10, lease_ms=600_000).jobs
    client.zrem(q.keys.leased, a)
    assert [i.code for i in repair_queue(client, q.name).fixed] == ["orphan-hash"]
    clock.set_ms(now + 120_000)
    assert q.claim("w2", limit=10, lease_ms=600_000).jobs == [], "run a second time"
    assert q.heartbeat([(a, ja.token)], lease_ms=600_000)[1] == {a: "held"}


def test_doctor_fix_restores_no_lease_of_a_job_cancelled_since_the_check(
    q: Queue, client: redis.Redis
) -> None:
    """The check finds the lost lease; the operator then cancels the job (its worker's result
    is refused). The plan's lease move sees the state changed and does nothing."""
    a = q.enqueue("t", {})
    (ja,) = q.claim("w1", limit=10).jobs
    client.zrem(q.keys.leased, a)
    (issue,) = check_queue(client, q.name)
    assert issue.code == "orphan-hash" and issue.repair
    assert q.cancel(a) == "leased"  # the state before: now cancelled
    assert [client.execute_command(*cmd) for cmd in issue.repair] == [0]  # type: ignore[no-untyped-call]
    assert client.zscore(q.keys.leased, a) is None
    assert q.heartbeat([(a, ja.token)])[1] == {a: "cancelled"}


# -- reschedule of a schedule's runs ------------------------------------------------------------


def test_a_partitioned_schedules_retry_moves_its_pending_run_does_not(
    make_pq: MakePq, client: redis.Redis
) -> None:
    """On a partitioned queue (the runs live in the schedule's partition): the pending run
    answers 'schedule', the failed run waiting out its backoff moves, and stays movable (and
    runs) after the schedule is removed, which deletes the pending one only."""
    pq = make_pq(partitions=3, _clock="test")

    def at(ms: int) -> None:
        for part in pq.parts:
            client.set(part.keys.test_clock, ms)

    at(1000 * HOUR_MS + 10)
    hour = Backoff(base_ms=HOUR_MS, factor=1.0, cap_ms=HOUR_MS, jitter=0.0)
    pq.schedule("rep", "t", every_ms=HOUR_MS, backoff=hour)
    pending = pq.get_schedule("rep").pending
    assert pending and pq.reschedule(pending, delay_ms=0) == "schedule"
    at(1001 * HOUR_MS + 10)
    (job,) = pq.claim("w", limit=5).jobs
    assert job.id == pending
    assert pq.fail(job.id, job.token, ("Bug", "fixed since", "")).status == "retry"
    nxt = pq.get_schedule("rep").pending
    assert nxt and nxt != job.id and pq.reschedule(nxt, delay_ms=0) == "schedule"
    assert pq.reschedule(job.id, delay_ms=0) == "rescheduled"
    assert pq.remove_schedule("rep") == "removed"
    with pytest.raises(JobNotFound):
        pq.status(nxt)  # the pending run went with its schedule
    assert pq.reschedule(job.id, delay_ms=5) == "rescheduled"
    at(1001 * HOUR_MS + 20)
    assert [j.id for j in pq.claim("w", limit=5).jobs] == [job.id]


def test_a_moved_retry_leaves_the_schedules_slots_as_they_were(tq: tuple[Queue, Clock]) -> None:
    """A schedule run's retry moved 3 hours later: the schedule's pending slot, pause and
    resume go on as without it, each slot runs once, and the moved retry runs once, at its
    new time."""
    q, clock = tq
    clock.set_ms(1000 * HOUR_MS + 10)
    hour = Backoff(base_ms=HOUR_MS, factor=1.0, cap_ms=HOUR_MS, jitter=0.0)
    q.schedule("rep", "t", every_ms=HOUR_MS, backoff=hour)
    clock.set_ms(1001 * HOUR_MS + 10)
    (job,) = q.claim("w", limit=5).jobs
    assert q.fail(job.id, job.token, ("Bug", "x", "")).status == "retry"
    assert q.reschedule(job.id, delay_ms=3 * HOUR_MS) == "rescheduled"
    assert q.get_schedule("rep").pending == f"schedule:rep:{1002 * HOUR_MS}"
    assert q.pause_schedule("rep") == "paused" and q.status(job.id) == "scheduled"
    assert q.resume_schedule("rep") == "resumed"
    ran: dict[int, list[str]] = {}
    for h in (1002, 1003, 1004, 1005):
        clock.set_ms(h * HOUR_MS + 10)
        for j in q.claim("w", limit=5).jobs:
            ran.setdefault(h, []).append(j.id)
            q.complete(j.id, j.token)
    slot = {h: f"schedule:rep:{h * HOUR_MS}" for h in (1002, 1003, 1004, 1005)}
    expected = {h: [slot[h]] for h in slot}
    expected[1004] = sorted([slot[1004], job.id])
    assert {h: sorted(ids) for h, ids in ran.items()} == expected


# -- AsyncQueue.result: a cancelled wait's leave ------------------------------------------------


@pytest.mark.skipif(is_cluster_run(), reason="a single server's pool")
def test_result_waits_cancelled_together_all_leave(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """A web app's handlers await 20 jobs' results on a pool of 4 connections (2 wait slots);
    its clients go away together (a deploy, a load balancer timeout) and the 20 tasks are
    cancelled at once. docs: a cancelled `aq.result` task takes the waiter out at once. Each
    leave now takes a connection of its own outside the slots: all but a few are refused by
    the pool and stay announced in result_wait:<id> for the timeout_s they asked + 5 s."""
    assert waiters_left(redis_url, client, queue_name, pool=4) == 0, "still announced"


def waiters_left(
    redis_url: str,
    client: redis.Redis,
    queue_name: str,
    pool: int,
    before_cancel: Callable[[], None] = lambda: None,
) -> int:
    """20 jobs' result waits on a client of `pool` connections, all announced, then cancelled
    together (`before_cancel` first): how many waiters are still in result_wait:<id>."""
    q = Queue(client, queue_name)
    ids = [f"rw{i}" for i in range(20)]

    async def main() -> int:
        c = aredis.Redis.from_url(redis_url, max_connections=pool, decode_responses=True)
        aq = AsyncQueue(c, queue_name)
        try:
            for job_id in ids:
                await aq.enqueue("t", job_id=job_id)
            waits = [asyncio.ensure_future(aq.result(j, timeout_s=60)) for j in ids]
            for _ in range(1000):
                if all(client.scard(q.keys.result_wait(j)) == 1 for j in ids):
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("set-up: not every waiter announced")
            before_cancel()
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            return sum(int(client.scard(q.keys.result_wait(j))) for j in ids)
        finally:
            await c.aclose()

    try:
        return asyncio.run(main())
    finally:
        delete_queue(client, q)
