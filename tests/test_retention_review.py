"""Review of what happens to finished jobs: retention (job / task / worker / queue), keep_payload,
what a done, dead or cancelled record keeps and for how long, the finished index, the dead-letter
retention and the result API (sync, asyncio, partitioned).

Held (pass): every path below leaves its keys expiring with the documented retention, lists its
done and cancelled jobs once, and answers result() as documented.
Two findings were the docs' (see each docstring): a task's keep_payload=True applies to the jobs
its handle makes only, not to its jobs enqueued by name or run by a schedule (README said it
did); the finished index exceeds the README's "1.3 MB at most per queue" with long caller-made
ids. README and docs/limits.md now say what holds; the tests pin it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, JobCancelled, JobDead, JobSpec, Queue
from scheduler.admin.doctor import check_queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.models import ClaimedJob
from scheduler.worker import WorkerSettings
from scheduler.worker.registry import Registry
from tests.conftest import Clock
from tests.embedded_worker import worker_thread
from tests.workers.procs import wait_for

HOUR = 3_600_000
T0 = 1_800_000_000_000
T = TypeVar("T")

registry = Registry()


@registry.task("rr.kept", keep_payload=True)
def kept(payload: Any, ctx: Any) -> str:
    return "ok"


# Far from the worker's option below (300 s), so which one decided is plain.
@registry.task("rr.brief", result_ttl_ms=45_000)
def brief(payload: Any, ctx: Any) -> str:
    return "ok"


def _ttls(client: redis.Redis, q: Queue, job_id: str) -> tuple[int, int]:
    """PTTL of the job's hash and of its spec record."""
    return int(client.pttl(q.keys.job(job_id))), int(client.pttl(q.keys.spec(job_id)))


def _claim_one(q: Queue, job_id: str) -> ClaimedJob:
    jobs = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert [j.id for j in jobs] == [job_id]
    return jobs[0]


def _run(q: Queue, job_id: str, ok: bool = True, retry: bool = False) -> None:
    """Claim `job_id` (the only due job) and complete it, or fail it (retried at once, or for
    good)."""
    j = _claim_one(q, job_id)
    if ok:
        q.complete(job_id, j.token, {"r": job_id})
    else:
        q.fail(job_id, j.token, ("E", "m", ""), retryable=retry, delay_ms=0 if retry else None)


def _without_expiry(client: redis.Redis, q: Queue) -> list[str]:
    """The queue's keys without an expiry, but those a queue keeps by design."""
    out = []
    for k in client.scan_iter(match=q.keys.pattern(), count=1000):
        rest = k.removeprefix(q.keys.prefix)
        if client.pttl(k) == -1 and rest not in ("wake", "dead", "config", "test:now_ms"):
            out.append(rest)
    return sorted(out)


def _on_async(redis_url: str, name: str, body: Callable[[AsyncQueue, Any], Awaitable[T]],
              **kwargs: Any) -> T:  # fmt: skip
    async def go() -> T:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return await body(AsyncQueue(client, name, **kwargs), client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _keeps(client: redis.Redis, q: Queue, job_id: str, lo_ms: int, hi_ms: int) -> None:
    """Hash and spec both expire within (lo, hi]: the job kept its payload for its retention."""
    hash_ms, spec_ms = _ttls(client, q, job_id)
    assert lo_ms < hash_ms <= hi_ms and lo_ms < spec_ms <= hi_ms, (hash_ms, spec_ms)


# -- held: keep_payload and the job's own retention survive every way to done ----------------


def test_a_kept_job_retried_then_done_expires_with_its_own_retention(
    q: Queue, client: redis.Redis
) -> None:
    jid = q.enqueue("t", {"a": 1}, keep_payload=True, result_ttl_ms=7 * HOUR)
    _run(q, jid, ok=False, retry=True)
    _run(q, jid)
    _keeps(client, q, jid, 6 * HOUR, 7 * HOUR)
    assert q.get_job(jid).payload() == {"a": 1}
    assert [x.id for x in q.list_jobs("finished")] == [jid]


def test_a_kept_job_dead_then_requeued_then_done_expires(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", {"a": 1}, keep_payload=True, result_ttl_ms=7 * HOUR, max_attempts=1)
    _run(q, jid, ok=False)
    assert q.status(jid) == "dead"
    assert _ttls(client, q, jid) == (-1, -1)  # a dead record is kept until trimmed or purged
    assert q.requeue_dead([jid]) == 1
    _run(q, jid)
    _keeps(client, q, jid, 6 * HOUR, 7 * HOUR)
    assert q.get_job(jid).payload() == {"a": 1}
    assert q.result(jid, timeout_s=1) == {"r": jid}


def test_a_job_parked_before_its_first_claim_keeps_its_own_retention_once_requeued(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    # Parked by claim (start deadline passed): its hash is born by the park, not the claim.
    q, clock = tq
    clock.set_ms(T0)
    jid = q.enqueue("t", {"a": 1}, keep_payload=True, result_ttl_ms=7 * HOUR, start_within_ms=10)
    clock.set_ms(T0 + 100_000)
    assert q.claim("w", limit=1, lease_ms=60_000).jobs == []
    assert q.status(jid) == "dead"
    assert q.requeue_dead([jid]) == 1
    _run(q, jid)
    _keeps(client, q, jid, 6 * HOUR, 7 * HOUR)
    assert q.get_job(jid).payload() == {"a": 1}


def test_a_child_parked_by_its_parent_keeps_its_own_retention_once_requeued(
    q: Queue, client: redis.Redis
) -> None:
    p = q.enqueue("t", {}, max_attempts=1)
    c = q.enqueue("t", {"c": 1}, after=[p], keep_payload=True, result_ttl_ms=7 * HOUR)
    _run(q, p, ok=False)
    assert q.status(c) == "dead"
    assert q.requeue_dead([c]) == 1
    _run(q, c)
    _keeps(client, q, c, 6 * HOUR, 7 * HOUR)
    assert q.get_job(c).payload() == {"c": 1}


def test_a_requeued_dead_job_cancelled_expires_and_is_listed(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", {"a": 1}, max_attempts=1)
    _run(q, jid, ok=False)
    assert q.requeue_dead([jid]) == 1
    assert q.cancel(jid) == "due"
    _keeps(client, q, jid, HOUR - 60_000, HOUR)
    assert [x.id for x in q.list_jobs("finished")] == [jid]
    with pytest.raises(JobCancelled):
        q.result(jid, timeout_s=1)


def test_a_leased_kept_job_cancelled_expires_hash_and_spec(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", {"a": 1}, keep_payload=True)
    _claim_one(q, jid)
    assert q.cancel(jid) == "leased"
    _keeps(client, q, jid, HOUR - 60_000, HOUR)


def test_a_debounced_jobs_retention_is_its_latest_calls(q: Queue, client: redis.Redis) -> None:
    # The latest call wins "its payload, run time and options": the 7 h of the first is gone.
    a = q.enqueue("t", {"v": 1}, key="k", debounce=True, result_ttl_ms=7 * HOUR)
    assert q.enqueue("t", {"v": 2}, key="k", debounce=True) == a
    _run(q, a)
    assert 0 < client.pttl(q.keys.job(a)) <= HOUR


def test_a_schedules_run_expires_and_is_listed(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=1000)
    clock.set_ms(T0 + 2_000)
    j = q.claim("w", limit=1, lease_ms=60_000).jobs[0]
    q.complete(j.id, j.token, 3)
    assert 0 < client.pttl(q.keys.job(j.id)) <= HOUR
    assert q.result(j.id, timeout_s=1) == 3
    assert j.id in [x.id for x in q.list_jobs("finished")]


@pytest.mark.parametrize("end", ["done", "dead", "cancelled"])
def test_a_child_enqueued_after_a_finished_parent_leaves_no_key_for_ever(
    q: Queue, client: redis.Redis, end: str
) -> None:
    p = q.enqueue("t", {}, max_attempts=1)
    if end == "cancelled":
        q.cancel(p)
    else:
        _run(q, p, ok=end == "done")
    c = q.enqueue("t", {}, after=[p])
    if end == "done":
        _run(q, c)
    else:
        assert q.status(c) == "dead"  # parked at once: its parent ended dead or cancelled
        assert q.purge_dead(q.dead_ids()) >= 1
    assert _without_expiry(client, q) == []


# -- held: the queue's own retention for what it cancels, on every client -----------------------


@pytest.mark.pq(partitions=2, result_ttl_ms=5 * HOUR)
def test_a_partitioned_queues_cancel_keeps_its_retention(
    pq: PartitionedQueue, client: redis.Redis
) -> None:
    jid = pq.enqueue("t", {})
    assert pq.cancel(jid) == "due"
    part = pq.parts[pq.layout.partition_of_id(jid)]
    assert 4 * HOUR < client.pttl(part.keys.job(jid)) <= 5 * HOUR
    assert [j.id for j in pq.list_jobs("finished")] == [jid]


def test_an_async_queues_cancel_keeps_its_retention(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    jid = q.enqueue("t", {})

    async def body(aq: AsyncQueue, _: Any) -> str:
        return await aq.cancel(jid)

    assert _on_async(redis_url, q.name, body, result_ttl_ms=5 * HOUR) == "due"
    assert 4 * HOUR < client.pttl(q.keys.job(jid)) <= 5 * HOUR


# -- held: the dead-letter retention and result() ------------------------------------------------


def test_a_count_retention_is_applied_by_a_claim_with_nothing_due(q: Queue) -> None:
    for _ in range(5):
        jid = q.enqueue("t", {}, max_attempts=1)
        _run(q, jid, ok=False)
    q.set_dead_retention(max_count=2)
    assert q.counts().dead == 5  # setting it deletes nothing by itself
    assert q.claim("w", limit=1, lease_ms=1000).jobs == []
    assert len(q.dead_ids()) == 2 and q.counts().dead == 2


def test_async_result_answers_done_and_cancelled(redis_url: str, q: Queue) -> None:
    jid = q.enqueue("t", {})
    _run(q, jid)
    c = q.enqueue("t", {})
    q.cancel(c)

    async def body(aq: AsyncQueue, _: Any) -> tuple[Any, str]:
        got = await aq.result(jid, timeout_s=1)
        try:
            await aq.result(c, timeout_s=1)
        except JobCancelled:
            return got, "cancelled"
        return got, "returned"

    assert _on_async(redis_url, q.name, body) == ({"r": jid}, "cancelled")


def test_an_async_waiter_of_a_park_the_retention_deletes_at_once_gets_job_dead(
    redis_url: str, q: Queue
) -> None:
    q.set_dead_retention(max_count=0)
    jid = q.enqueue("t", {}, max_attempts=1)

    async def body(aq: AsyncQueue, client: Any) -> str:
        waiter = asyncio.create_task(aq.result(jid, timeout_s=20))
        for _ in range(2000):  # a liveness bound: until the waiter announced itself
            if await client.exists(q.keys.result_wait(jid)):
                break
            await asyncio.sleep(0.01)
        batch = await aq.claim("w", limit=1, lease_ms=60_000)
        await aq.fail(jid, batch.jobs[0].token, ("E", "m", ""))
        try:
            await waiter
        except JobDead as exc:
            return str(exc.reason)
        return "returned"

    assert "retention" in _on_async(redis_url, q.name, body)


# -- held: one queue through every way to finish ----------------------------------------------


def test_every_way_to_finish_is_listed_once_expires_and_doctor_finds_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {"a": 1}, job_id="lean")
    _run(q, "lean")
    q.enqueue("t", {"a": 1}, job_id="kept", keep_payload=True, key="kk")
    _run(q, "kept")
    q.enqueue("t", {}, job_id="retried", priority=3)
    _run(q, "retried", ok=False, retry=True)
    _run(q, "retried")
    q.enqueue("t", {}, job_id="requeued", max_attempts=1, keep_payload=True,
              result_ttl_ms=HOUR // 2)  # fmt: skip
    _run(q, "requeued", ok=False)
    assert q.requeue_dead(["requeued"]) == 1
    _run(q, "requeued")
    q.enqueue("t", {}, job_id="c_plain")
    q.enqueue("t", {}, job_id="c_prio", priority=5)
    q.enqueue("t", {}, job_id="c_later", delay_ms=HOUR)
    q.enqueue("t", {}, job_id="parent", delay_ms=HOUR)
    q.enqueue("t", {}, job_id="c_child", after=["parent"])
    deb = q.enqueue("t", {}, key="deb", debounce=True, delay_ms=HOUR)
    for c in ("c_plain", "c_prio", "c_later", "c_child", deb):
        assert q.cancel(c) in ("due", "scheduled", "held"), c
    q.enqueue("t", {}, job_id="ck1", concurrency_key="K", concurrency_limit=1)
    ck1 = _claim_one(q, "ck1")
    q.enqueue("t", {}, job_id="c_ck2", concurrency_key="K", concurrency_limit=1)
    assert q.claim("w", limit=1, lease_ms=60_000).jobs == []
    assert q.cancel("c_ck2") == "held"
    q.complete("ck1", ck1.token, 1)
    q.enqueue("t", {}, job_id="c_leased", keep_payload=True)
    _claim_one(q, "c_leased")
    assert q.cancel("c_leased") == "leased"
    q.enqueue("t", {}, job_id="deadp", max_attempts=1)
    q.enqueue("t", {}, job_id="deadc", after=["deadp"])
    _run(q, "deadp", ok=False)
    assert q.status("deadc") == "dead"

    done = {"lean", "kept", "retried", "requeued", "ck1"}
    cancelled = {"c_plain", "c_prio", "c_later", "c_child", deb, "c_ck2", "c_leased"}
    listed = [(j.id, j.state) for j in q.list_jobs("finished", limit=100)]
    assert sorted(listed) == sorted(
        [(i, "done") for i in done] + [(i, "cancelled") for i in cancelled]
    )
    assert [(i.code, i.job_id) for i in check_queue(client, q.name)] == []
    assert 0 < client.pttl(q.keys.job("requeued")) <= HOUR // 2
    # Kept without an expiry: the two dead jobs, and the waiting parent with its children's set
    # (c_child's id in it until the parent ends: docs/flow-control.md).
    assert _without_expiry(client, q) == sorted(
        ["due", "flow:children:parent", "job:deadc", "job:deadp", "job:parent",
         "spec:deadc", "spec:deadp", "spec:parent"]
    )  # fmt: skip


# -- task defaults applied to jobs enqueued by name --------------------------------------------


def test_a_tasks_result_ttl_applies_to_its_jobs_enqueued_by_name(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    """Held: the worker applies the task's retention to any job of the task (README, Workers,
    "Retention of finished jobs"). Note README "Using it" says of jobs enqueued by name that
    "only the task's timeout_s still applies": the task's result_ttl_ms does too."""
    b = q.enqueue("rr.brief", {"a": 2})
    settings = WorkerSettings(queues=(q.name,), result_ttl_ms=300_000)
    with worker_thread(redis_url, registry, settings):
        wait_for(lambda: q.status(b) == "done", what="done")
    assert 0 < client.pttl(q.keys.job(b)) <= 45_000


@pytest.mark.parametrize("how", ["handle", "enqueue by name", "schedule run"])
def test_a_tasks_keep_payload_is_the_default_of_its_handles_jobs_only(
    redis_url: str, q: Queue, how: str
) -> None:
    """README (Workers, "Retention of finished jobs") said a finished job keeps its payload
    when "the job or its task asked keep_payload=True", but only TaskHandle.enqueue applies the
    task's (task_handle.py job_spec): a job of the task enqueued by name or run by a schedule
    lost it. A job's own keep_payload=False cannot be told from the default once stored, so the
    worker cannot apply the task's without overriding it: README and limits.md now say what
    holds, the task's is the default of the jobs its handle makes. Pinned both ways."""
    if how == "handle":
        jid = kept.enqueue(q, {"a": 1})
    elif how == "enqueue by name":
        jid = q.enqueue("rr.kept", {"a": 1})
    else:
        q.schedule("s", "rr.kept", {"a": 1}, every_ms=HOUR)
        jid = q.run_schedule_now("s")
    settings = WorkerSettings(queues=(q.name,))
    with worker_thread(redis_url, registry, settings):
        wait_for(lambda: q.status(jid) == "done", what="done")
    job = q.get_job(jid)
    assert job.payload_dropped is (how != "handle")
    if how == "handle":
        assert job.payload() == {"a": 1}


# -- the finished index's documented bound -------------------------------------------------------


def test_the_finished_index_stays_within_its_documented_size(q: Queue, client: redis.Redis) -> None:
    """README, Key schema: finished jobs are listed "the 10,000 kept longest, an index of 1.3 MB
    at most per queue". That holds for the 16-character ids the client makes (1.29 MB); a
    caller's job_id may be 128 characters (docs/limits.md), and 10,000 such ids make an index
    of about 2.6 MB (MEMORY USAGE): the README now names both bounds."""
    n = 10_000
    q.enqueue_many([JobSpec("t", None, job_id=f"{i:06d}" + "x" * 122) for i in range(n)])
    while batch := q.claim("w", limit=1000, lease_ms=60_000).jobs:
        q.complete_many([(j.id, j.token, None) for j in batch])
    assert client.zcard(q.keys.finished) == n
    size = client.memory_usage(q.keys.finished, samples=0)
    assert size is not None and 1_300_000 < size <= 2_600_000, size
