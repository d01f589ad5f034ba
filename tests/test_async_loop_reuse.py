"""An async queue kept across `asyncio.run()` calls (a script that runs several, pytest-asyncio's
loop per test, Django's `async_to_sync`): the first call of every run after the first failed
with "Event loop is closed", because the pooled connection still belonged to the closed loop
(the failure dropped it, so the next call worked, and the next run failed again). The loop
guard drops such connections before the first call on the new loop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis

from scheduler import AsyncPartitionedQueue, AsyncQueue, Queue
from scheduler._spawn import RedisProcess
from scheduler.core.connection import connect, connect_async
from tests.redis_server import is_cluster_run


@pytest.fixture
def url(module_server: RedisProcess) -> Iterator[str]:
    if is_cluster_run():
        pytest.skip("a private single server (the cluster case has its own test)")
    yield module_server.url


def _runs(
    first_call: Callable[[int], Awaitable[Any]],
    close: Callable[[], Coroutine[Any, Any, None]],
    runs: int = 4,
) -> list[str]:
    """Each run's first call, in a fresh asyncio.run(): what each raised, '' if nothing. The
    queue is closed in one more run (closing a closed loop's connections failed the same way)."""
    out = []
    for i in range(runs):

        async def go(i: int = i) -> str:
            try:
                await first_call(i)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return ""

        out.append(asyncio.run(go()))
    asyncio.run(close())
    gc.collect()  # a transport left unclosed would warn here: an error (filterwarnings)
    return out


def test_every_runs_first_call_works_on_a_queue_kept_across_runs(url: str, queue_name: str) -> None:
    aq = AsyncQueue(connect_async(url), queue_name)
    assert _runs(lambda i: aq.enqueue("t", {"run": i}, job_id=f"r{i}"), aq.aclose) == [""] * 4
    assert _due_count(url, queue_name) == 4


def test_concurrent_first_calls_of_each_run_work(url: str, queue_name: str) -> None:
    """Many enqueues at once (the enqueue batcher, several pooled connections) in each run."""
    aq = AsyncQueue(connect_async(url), queue_name)

    async def burst(i: int) -> None:
        await asyncio.gather(*(aq.enqueue("t", job_id=f"r{i}-{k}") for k in range(30)))
        await asyncio.gather(*(aq.status(f"r{i}-{k}") for k in range(30)))

    assert _runs(burst, aq.aclose) == [""] * 4
    assert _due_count(url, queue_name) == 120


def test_the_closed_loops_connections_are_closed_on_the_server(url: str, queue_name: str) -> None:
    """Closed, not leaked: the server does not keep one connection per finished run."""
    client = connect_async(url)
    aq = AsyncQueue(client, queue_name)
    admin = redis.Redis.from_url(url)
    try:
        before = len(admin.client_list())
        assert _runs(lambda i: aq.enqueue("t", job_id=f"c{i}"), aq.aclose, runs=6) == [""] * 6
        # Each run held one connection, and the last run closed the queue.
        assert len(admin.client_list()) == before
    finally:
        admin.close()


def test_a_partitioned_queue_kept_across_runs(url: str, queue_name: str) -> None:
    client = connect_async(url)
    pq = asyncio.run(AsyncPartitionedQueue.create(client, queue_name, partitions=3))

    async def first(i: int) -> None:
        await pq.enqueue("t", {"run": i}, key=f"k{i}")

    assert _runs(first, pq.aclose) == [""] * 4


def test_a_cluster_queue_kept_across_runs(cluster_url: str, queue_name: str) -> None:
    aq = AsyncQueue(connect_async(cluster_url), queue_name)
    assert _runs(lambda i: aq.enqueue("t", job_id=f"x{i}"), aq.aclose) == [""] * 4
    rc = connect(cluster_url)
    try:
        assert rc.zcard(aq.keys.due) == 4
    finally:
        rc.close()


def _due_count(url: str, name: str) -> int:
    q = Queue.from_url(url, name)
    try:
        return int(q.client.zcard(q.keys.due))
    finally:
        q.client.close()
