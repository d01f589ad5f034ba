"""The queue index `sched:queues` (scheduler/core/queue_index.py) takes a producer's queue name
once the call wrote: an enqueue, enqueue_many or schedule refused before anything was written
(bad input, a parent the server does not find) adds nothing, so a typo'd queue name in a refused
call does not stay in the index for good. On a private server: the tests flush it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, BadArgument, JobSpec, PartitionedQueue, Queue
from scheduler._spawn import RedisProcess
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.errors import NotDurable
from scheduler.core.keys import QUEUE_INDEX

MISSING_PARENT = "0000000000000000"


def _sadds(private: redis.Redis) -> int:
    stats = private.info("commandstats").get("cmdstat_sadd", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


REFUSED: list[tuple[str, Callable[[Any], Any]]] = [
    ("negative delay", lambda q: q.enqueue("t", None, delay_ms=-1)),
    ("bad payload", lambda q: q.enqueue("t", object())),
    ("bad task name", lambda q: q.enqueue("no spaces", None)),
    ("parent the server lacks", lambda q: q.enqueue("t", None, after=[MISSING_PARENT])),
    ("bad spec in a batch", lambda q: q.enqueue_many([JobSpec("t", None, delay_ms=-5)])),
    ("batch parent missing", lambda q: q.enqueue_many([JobSpec("t", after=[MISSING_PARENT])])),
    ("bad cron", lambda q: q.schedule("s", "t", cron="not a cron")),
]


@pytest.mark.parametrize("call", [c for _, c in REFUSED], ids=[n for n, _ in REFUSED])
def test_a_refused_call_adds_no_name(private: redis.Redis, call: Callable[[Queue], Any]) -> None:
    q = Queue(private, "typo-queue")
    with pytest.raises(BadArgument):
        call(q)
    assert not private.sismember(QUEUE_INDEX, "typo-queue")
    assert private.keys("sched:{typo-queue}:*") == []  # the call wrote nothing indeed
    q.enqueue("t", None)  # the first call that writes adds the name, once
    q.enqueue("t", None)
    assert private.smembers(QUEUE_INDEX) == {"typo-queue"} and _sadds(private) == 1


@pytest.mark.parametrize("call", [c for _, c in REFUSED], ids=[n for n, _ in REFUSED])
def test_a_refused_async_call_adds_no_name(
    private: redis.Redis, module_server: RedisProcess, call: Callable[[AsyncQueue], Any]
) -> None:
    async def main() -> None:
        ac = connect_async(module_server.url)
        try:
            aq = AsyncQueue(ac, "typo-queue")
            with pytest.raises(BadArgument):
                await call(aq)
            assert not private.sismember(QUEUE_INDEX, "typo-queue")
            await aq.enqueue("t", None)
            assert private.smembers(QUEUE_INDEX) == {"typo-queue"}
        finally:
            await ac.aclose()

    asyncio.run(main())


def test_a_refused_partitioned_call_adds_no_name(
    private: redis.Redis, module_server: RedisProcess
) -> None:
    pq = PartitionedQueue.create(private, "parts", partitions=2)
    before = private.smembers(QUEUE_INDEX)
    with pytest.raises(BadArgument):
        pq.enqueue_many([JobSpec("t", None, delay_ms=-1)])
    with pytest.raises(BadArgument):
        pq.enqueue("t", None, key="k", after=[MISSING_PARENT])

    async def main() -> None:
        ac = connect_async(module_server.url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, "parts")
            with pytest.raises(BadArgument):
                await apq.enqueue("t", object())
            with pytest.raises(BadArgument):
                await apq.enqueue_many([JobSpec("t", None, key="k", after=[MISSING_PARENT])])
        finally:
            await ac.aclose()

    asyncio.run(main())
    assert private.smembers(QUEUE_INDEX) == before
    pq.enqueue("t", None)
    assert set(pq.layout.names) <= private.smembers(QUEUE_INDEX)


def test_a_call_that_wrote_before_raising_adds_its_name(private: redis.Redis) -> None:
    # Not acknowledged by replicas: the job is written on the primary.
    q = Queue(private, "unacked", wait_replicas=1, wait_timeout_ms=10)
    with pytest.raises(NotDurable):
        q.enqueue("t", None)
    assert private.sismember(QUEUE_INDEX, "unacked")
    # Two batches in one call: the first written, the second refused by the server.
    q2 = Queue(private, "half-written")
    with pytest.raises(BadArgument):
        q2.enqueue_many([JobSpec("t"), JobSpec("t", after=[MISSING_PARENT])], batch_size=1)
    assert private.zcard("sched:{half-written}:due") == 1
    assert private.sismember(QUEUE_INDEX, "half-written")
