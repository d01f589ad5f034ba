"""dead_ids pages like list_jobs: `offset` / `limit` (None: every match), newest first, checked
before anything is read, alike on Queue, AsyncQueue and both partitioned clients. Without
them a dead list of millions came back whole."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, BadArgument, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.models import JobSpec
from scheduler.operations.requests import Commands
from tests.conftest import Clock, delete_queue, dump_queue

T0 = 1_700_000_000_000


def _park(q: Queue, task: str = "t") -> str:
    jid = q.enqueue(task, None, max_attempts=1)
    [job] = q.claim("w", limit=1, lease_ms=30_000).jobs
    assert q.fail(jid, job.token, ("E", "boom", ""), retryable=False).status == "dead"
    return jid


@pytest.fixture
def died(tq: tuple[Queue, Clock]) -> tuple[Queue, list[str]]:
    """Five dead jobs, one ms apart, tasks alternating a / b; returned newest first."""
    q, clock = tq
    ids = []
    for i in range(5):
        clock.set_ms(T0 + i)
        ids.append(_park(q, "a" if i % 2 == 0 else "b"))
    return q, ids[::-1]


def test_dead_ids_takes_a_limit_and_an_offset(died: tuple[Queue, list[str]]) -> None:
    q, newest = died
    assert q.dead_ids() == newest
    assert q.dead_ids(limit=2) == newest[:2]
    assert q.dead_ids(offset=2, limit=2) == newest[2:4]
    assert q.dead_ids(offset=4, limit=10) == newest[4:]
    assert q.dead_ids(offset=3) == newest[3:]
    assert q.dead_ids(offset=9) == [] and q.dead_ids(limit=0) == []
    # filters apply before the page: the page is of the matches
    a_newest = [i for n, i in enumerate(newest) if n % 2 == 0]  # tasks of ms 4, 2, 0
    assert q.dead_ids(task="a", limit=2) == a_newest[:2]
    assert q.dead_ids(task="a", offset=1, limit=5) == a_newest[1:]


@pytest.mark.parametrize(
    "kw",
    [
        {"limit": -1},
        {"limit": 1.5},
        {"limit": True},
        {"limit": "2"},
        {"offset": -1},
        {"offset": None},
        {"offset": False},
        {"offset": 2**60},
    ],
)
def test_a_bad_page_is_refused_before_anything_is_read(
    died: tuple[Queue, list[str]], client: redis.Redis, kw: dict[str, Any]
) -> None:
    q, _ = died
    name = next(iter(kw))
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=name):
        q.dead_ids(**kw)
    assert dump_queue(client, q) == before


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(client, queue_name + "-p", partitions=3)
    yield p
    for part in p.parts:
        delete_queue(client, part)
    client.delete(f"sched:{{{p.name}}}:partitions")


def test_every_client_pages_the_dead_list_alike(
    died: tuple[Queue, list[str]], pq: PartitionedQueue, redis_url: str
) -> None:
    q, newest = died
    ids = pq.enqueue_many([JobSpec("t", {}, max_attempts=1) for _ in range(7)])
    for part in pq.parts:
        for job in part.claim("w", limit=10).jobs:
            part.fail(job.id, job.token, ValueError("x"))
    merged = pq.dead_ids()
    assert sorted(merged) == sorted(ids)
    assert pq.dead_ids(limit=3) == merged[:3]
    assert pq.dead_ids(offset=2, limit=3) == merged[2:5]
    assert pq.dead_ids(offset=5) == merged[5:]
    for bad in ({"limit": -1}, {"offset": -1}, {"offset": 1.0}):
        with pytest.raises(BadArgument):
            pq.dead_ids(**bad)

    async def main() -> None:
        ac = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            aq = AsyncQueue(ac, q.name, _clock="test")
            assert await aq.dead_ids(offset=1, limit=2) == newest[1:3]
            assert await aq.dead_ids(limit=1, task="b") == [newest[1]]
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            assert await apq.dead_ids(offset=2, limit=3) == merged[2:5]
            assert await apq.dead_ids(limit=0) == []
            bads: list[dict[str, Any]] = [{"limit": -1}, {"offset": -1}]
            for bad in bads:
                with pytest.raises(BadArgument):
                    await aq.dead_ids(**bad)
                with pytest.raises(BadArgument):
                    await apq.dead_ids(**bad)
        finally:
            await ac.aclose()

    asyncio.run(main())


def test_a_page_reads_only_offset_plus_limit_of_a_long_dead_list(
    q: Queue, client: redis.Redis
) -> None:
    """The point of the limit: 5,000 dead ids (their records need not exist: an unfiltered
    listing reads the dead ZSET alone), a page of 3 after 2 asks Redis for 5 entries."""
    client.zadd(q.keys.dead, {f"d{i:05d}": 1_000 + i for i in range(5_000)})
    asked: list[tuple[Any, ...]] = []
    real = q._execute

    def spy(req: Any) -> Any:
        if isinstance(req, Commands):
            asked.extend(c for c in req.cmds if c[0] == "ZRANGE")
        return real(req)

    q._execute = spy  # type: ignore[method-assign]
    assert q.dead_ids(offset=2, limit=3) == ["d04997", "d04996", "d04995"]
    assert [c[-2] for c in asked] == [5]  # one ZRANGE ... LIMIT 0 5
    asked.clear()
    assert len(q.dead_ids()) == 5_000  # no limit: the whole list, as before
    assert sum(c[-2] for c in asked) >= 5_000
