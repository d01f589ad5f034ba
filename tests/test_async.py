"""AsyncQueue shares keys, scripts and reply parsing with Queue: both see the same queue."""

from __future__ import annotations

import asyncio

import pytest
import redis

from scheduler import AsyncQueue, JobSpec, Queue, StaleToken
from scheduler.core.connection import connect, connect_async
from tests.redis_server import is_cluster_run


def test_async_and_sync_clients_share_one_queue(redis_url: str, q: Queue) -> None:
    async def main() -> None:
        aq = AsyncQueue(connect_async(redis_url), q.name)
        try:
            ids = await aq.enqueue_many([JobSpec("t", {"n": i}) for i in range(3)])
            assert q.counts().due == 3
            batch = await aq.claim("w", limit=2)
            assert [j.id for j in batch.jobs] == ids[:2]
            first = batch.jobs[0]
            await aq.complete(first.id, first.token, {"ok": True})
            assert q.status(first.id) == "done"
            with pytest.raises(StaleToken):
                await aq.complete(first.id, "9-bad")
            second = batch.jobs[1]
            out = await aq.fail(second.id, second.token, ValueError("x"), retryable=False)
            assert out.status == "dead" and q.counts().dead == 1
            assert await aq.requeue_dead([second.id]) == 1
            assert (await aq.counts()).due == 2
        finally:
            await aq.aclose()

    asyncio.run(main())


def test_resp2_and_resp3_give_the_same_answers(redis_url: str, queue_name: str) -> None:
    results = []
    for protocol in (2, 3):
        client = connect(redis_url, protocol=protocol)
        q = Queue(client, f"{queue_name}-{protocol}")
        jid = q.enqueue("t", {"n": 1}, job_id="same")
        batch = q.claim("w", limit=5)
        _, statuses = q.heartbeat([(jid, batch.jobs[0].token)], lease_ms=5_000)
        q.complete(jid, batch.jobs[0].token, [1, 2])
        job = q.get_job(jid)
        results.append((len(batch.jobs), statuses, job.state, job.result_json, q.counts().dead))
        for key in client.scan_iter(match=q.keys.pattern()):
            client.delete(key)
        client.close()
    assert results[0] == results[1]


def test_wait_replicas_raises_when_no_replica_acknowledges(
    client: redis.Redis, queue_name: str
) -> None:
    from scheduler.core.errors import NotDurable

    # A local cluster's primaries have one replica each: ask for one more than there are.
    replicas = 1 if is_cluster_run() else 0
    q = Queue(client, queue_name, wait_replicas=replicas + 1, wait_timeout_ms=50)
    with pytest.raises(NotDurable) as info:
        q.enqueue("t", None, job_id="j-durable")
    assert info.value.job_ids == ["j-durable"] and info.value.acked == replicas
    # The primary did accept it: re-sending the same id is safe and creates nothing new.
    assert Queue(client, queue_name).enqueue("t", None, job_id="j-durable") == "j-durable"
    assert Queue(client, queue_name).counts().due == 1
    for key in client.scan_iter(match=q.keys.pattern()):
        client.delete(key)


def test_batches_go_in_one_pipeline_on_both_clients(redis_url: str, q: Queue) -> None:
    """Several batches (and the WAIT path) through the pipelined request, sync and async."""
    from scheduler.core.errors import NotDurable

    specs = [JobSpec("t", {"n": i}, job_id=f"p{i}") for i in range(5)]
    assert q.enqueue_many(specs[:3], batch_size=2) == ["p0", "p1", "p2"]

    async def main() -> None:
        client = connect_async(redis_url)
        aq = AsyncQueue(client, q.name)
        try:
            # p2 is there already: its id comes back, nothing is written twice.
            assert await aq.enqueue_many(specs[2:], batch_size=2) == ["p2", "p3", "p4"]
            keyed = [JobSpec("t", None, key="once"), JobSpec("t", None, key="once")]
            first, second = await aq.enqueue_many(keyed, batch_size=1)
            assert first == second
            need = 2 if is_cluster_run() else 1  # one more replica than there are
            durable = AsyncQueue(client, q.name, wait_replicas=need, wait_timeout_ms=20)
            with pytest.raises(NotDurable) as info:
                await durable.enqueue_many([JobSpec("t", None, job_id="d1")], batch_size=1)
            assert info.value.job_ids == ["d1"]
        finally:
            await aq.aclose()

    asyncio.run(main())
    assert q.counts().due == 7
