"""From a review of result() waiting and partitioned queues: an AsyncQueue.result whose task is
cancelled stops; a partitioned queue refuses an id or schedule name that is not text with
BadArgument; a worker on several partitions goes on claiming and keeps the healthy
partitions' leases while one partition's node hangs (a cluster node that stopped answering
without closing its sockets)."""

from __future__ import annotations

import asyncio
import time
import types
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, BadArgument, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.models import ClaimBatch
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker import claiming as claiming_module
from scheduler.worker import heartbeat as heartbeat_module
from scheduler.worker.registry import Registry
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess

registry = Registry()
runs: dict[str, int] = {}


@registry.task(name="review-noop")
async def noop(payload: object, ctx: Any) -> None:
    return None


@registry.task(name="review-slow")
async def slow(payload: Any, ctx: Any) -> str:
    runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
    await asyncio.sleep(payload["s"])
    return "slept"


# -- (a) AsyncQueue.result and cancellation ---------------------------------------------------
def test_a_cancelled_async_result_stops_waiting(redis_url: str, q: Queue) -> None:
    """A cancel landing while redis-py sends a command (inside its asyncio.wait_for, Python
    3.11) was swallowed: the waiter ran on until timeout_s, and an outer asyncio.timeout
    around it waited that long too. Cancelled right after its first send, every time."""
    job_id = q.enqueue("t", {}, delay_ms=600_000)

    async def go() -> list[str]:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        aq = AsyncQueue(client, q.name)
        await aq.status(job_id)  # a warm pooled connection: the send completes at once
        outcomes = []
        try:
            for _ in range(3):
                task = asyncio.create_task(aq.result(job_id, timeout_s=60))
                await asyncio.sleep(0)  # the task is inside its first send
                task.cancel()
                started = time.monotonic()
                try:
                    await asyncio.wait_for(task, 20)
                    outcomes.append("returned")
                except asyncio.CancelledError:
                    outcomes.append("cancelled")
                except TimeoutError:
                    outcomes.append("ran on")
                assert time.monotonic() - started < 20 + 5
            # the connection it used is fine for the next caller
            assert await aq.status(job_id) == "scheduled"
        finally:
            await client.aclose()
        return outcomes

    assert asyncio.run(go()) == ["cancelled"] * 3


# -- (b) partitioned queues: routing of text that is not valid Unicode ------------------------
@pytest.mark.parametrize("call", ["enqueue_id", "status", "result", "cancel", "schedule"])
def test_an_id_that_is_not_valid_text_is_a_bad_argument(pq: PartitionedQueue, call: str) -> None:
    """A plain Queue refuses a lone surrogate with BadArgument (the id pattern); the
    partitioned one raised UnicodeEncodeError from its crc32 routing first."""
    bad = "job-\ud800"
    with pytest.raises(BadArgument):
        if call == "enqueue_id":
            pq.enqueue("t", None, job_id=bad)
        elif call == "status":
            pq.status(bad)
        elif call == "result":
            pq.result(bad, timeout_s=1)
        elif call == "cancel":
            pq.cancel(bad)
        else:
            pq.schedule(bad, "t", every_ms=60_000)
    assert pq.counts().due == 0 and pq.list_schedules() == []


# -- (b) a worker on several partitions, one of whose nodes hangs ------------------------------
def _names() -> list[str]:
    prefix = "hang-" + uuid.uuid4().hex[:8]
    return [f"{prefix}-p{i}" for i in range(4)]


def _cleanup(admin: redis.Redis, queues: list[Queue]) -> None:
    for q in queues:
        for key in admin.scan_iter(match=q.keys.pattern()):
            admin.delete(key)
    admin.close()


@pytest.mark.parametrize("start", ["first", "second"])
def test_a_hung_claim_on_one_partition_does_not_stop_the_others(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    """A claim that neither answers nor fails (its node hangs; with redis-py's retries that
    is 20 s and more per call at the default 5 s socket timeout) held the whole claim loop:
    no partition was claimed from until it returned."""
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    queues = [Queue(admin, n) for n in _names()]
    bad_i = 1
    jobs = {q.name: [q.enqueue("review-noop", None) for _ in range(3)] for q in queues}
    first = bad_i if start == "first" else bad_i - 1
    monkeypatch.setattr(claiming_module, "random", types.SimpleNamespace(randrange=lambda n: first))

    def all_done(q: Queue) -> bool:
        return all(q.status(j) == "done" for j in jobs[q.name])

    async def main() -> tuple[int, list[str]]:
        client = connect_async(module_server.url)
        names = tuple(q.name for q in queues)
        w = Worker(client, registry, WorkerSettings(queues=names, concurrency=4, grace_s=0))
        assert w._claim_wait_s is None  # one server: all its queues hang together
        w._claim_wait_s = 0.5  # as on a cluster, each queue standing for a node of its own
        aq = w._by_name[queues[bad_i].name].aq
        real = aq.claim
        hanging = True
        nonces: list[str] = []

        async def hung(*args: Any, **kwargs: Any) -> ClaimBatch:
            nonces.append(kwargs["nonce"])
            if hanging:
                await asyncio.Event().wait()
            return await real(*args, **kwargs)

        monkeypatch.setattr(aq, "claim", hung)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            healthy = [q for i, q in enumerate(queues) if i != bad_i]
            await poll(lambda: all(all_done(q) for q in healthy), "the healthy queues' jobs")
            await poll(lambda: len(nonces) >= 2, "the hung queue's claim sent again")
            hanging = False
            await poll(lambda: all_done(queues[bad_i]), "the hung queue's jobs once it answers")
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await client.aclose()
        return code, nonces

    try:
        code, nonces = asyncio.run(main())
    finally:
        _cleanup(admin, queues)
    assert code == EXIT_OK
    # the unanswered claim is replayed under its nonce, never claimed again under a new one
    assert len(set(nonces[:2])) == 1


def test_a_hung_node_does_not_let_the_healthy_partitions_leases_lapse(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster the heartbeat goes to each node on its own, but it waited for every node
    (and presence for all) up to the earliest lease end: one hung node let every lease on the
    healthy nodes lapse, so their jobs were stopped and run again (and counted as lapses,
    the way to being a suspect). Here each queue stands for a node of its own."""
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    queues = [Queue(admin, n) for n in _names()[:2]]
    good, bad = queues
    monkeypatch.setattr(heartbeat_module, "is_cluster", lambda c: True)

    async def main() -> tuple[int, str]:
        client = connect_async(module_server.url)
        # A lease of 900 ms lapsed once in a loaded CI run (2 cores, load ~8): 1,500 ms.
        settings = WorkerSettings(
            queues=(good.name, bad.name), concurrency=4, lease_ms=1500, heartbeat_ms=250,
            grace_s=0,
        )  # fmt: skip
        w = Worker(client, registry, settings)
        monkeypatch.setattr(w, "_node_of", lambda key: key)
        real_run, real_requests = w._pipe.run, w._pipe.requests
        hang = asyncio.Event()

        async def hangs_on_bad(items: Any) -> None:
            if any(keys[0] == bad.keys.prefix for keys, _ in items):
                await hang.wait()

        async def run(items: Any) -> Any:
            await hangs_on_bad(items)
            return await real_run(items)

        async def requests(items: Any) -> Any:
            await hangs_on_bad(items)
            return await real_requests(items)

        monkeypatch.setattr(w._pipe, "run", run)
        monkeypatch.setattr(w._pipe, "requests", requests)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            job_id = good.enqueue("review-slow", {"s": 5.0})  # > three leases
            await poll(lambda: good.status(job_id) == "leased", "the job claimed")
            await poll(lambda: good.status(job_id) != "leased", "the job's end", 20)
            state = good.status(job_id)
        finally:
            hang.set()
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await client.aclose()
        assert runs == {job_id: 1}
        return code, state

    try:
        code, state = asyncio.run(main())
    finally:
        _cleanup(admin, queues)
    assert code == EXIT_OK
    assert state == "done"
