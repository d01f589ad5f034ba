"""Round trips of a partitioned queue's operator reads and writes (client/partitioned*.py,
`scheduler stats`) and of doctor's repairs: one driver call for all partitions, counted with
a client that records what it sends (tests/test_dead_paths.py) on a private server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from scheduler import JobSpec
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.admin import queue_stats
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core import direct_io
from tests.conftest import delete_queue
from tests.redis_server import RedisProcess
from tests.test_dead_paths import Counter, counting_client

N = 4


@pytest.fixture
def counted(
    module_server: RedisProcess, queue_name: str
) -> Iterator[tuple[PartitionedQueue, Counter]]:
    client, counter = counting_client(module_server.url)
    pq = PartitionedQueue.create(client, queue_name, partitions=N, _clock="test")
    for p in pq.parts:
        client.set(p.keys.test_clock, 1_000_000)
        p.preload()  # SCRIPT LOAD now: a NOSCRIPT re-send would count as a round trip
    yield pq, counter
    for p in pq.parts:
        delete_queue(client, p)
    client.delete(f"sched:{{{queue_name}}}:partitions")
    client.close()


def kill_per_partition(pq: PartitionedQueue, per: int, base_ms: int = 1_000_000) -> list[str]:
    """`per` dead jobs in each partition, the partitions' clocks 1 ms apart (test clocks):
    newest first, the merge is by that time."""
    pq.enqueue_many([JobSpec("t", None, max_attempts=1) for _ in range(per * N)])
    died: list[tuple[int, str]] = []
    for k, part in enumerate(pq.parts):
        pq.client.set(part.keys.test_clock, base_ms + k)
        for job in part.claim("w", limit=per).jobs:
            assert part.fail(job.id, job.token, ValueError("x")).status == "dead"
            died.append((base_ms + k, job.id))
    return [i for _, i in sorted(died, reverse=True)]


def test_dead_ids_requeue_and_purge_are_one_driver_call_for_every_partition(
    counted: tuple[PartitionedQueue, Counter],
) -> None:
    pq, c = counted
    died = kill_per_partition(pq, 3)
    c.reset()
    assert pq.dead_ids() == died
    assert c.trips == 2  # every partition's conversion check, then every partition's page
    assert c.named("ZMSCORE") == []
    c.reset()
    assert pq.requeue_dead(died[:6]) == 6 and c.trips == 1
    c.reset()
    assert pq.purge_dead(died[6:]) == 6 and c.trips == 1
    assert pq.counts().dead == 0 and pq.counts().due == 6


def test_a_limit_is_the_merged_lists_length(counted: tuple[PartitionedQueue, Counter]) -> None:
    """Review: `limit` went through to every partition's scan, so up to N x limit came back."""
    pq, _ = counted
    died = kill_per_partition(pq, 3)
    assert pq.dead_ids(limit=5) == died[:5]


def test_the_async_client_batches_them_too(
    module_server: RedisProcess,
    counted: tuple[PartitionedQueue, Counter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pq, _ = counted
    died = kill_per_partition(pq, 2)
    # Every call through the client's execute_command / pipeline, counted there (the direct
    # path, direct_io, would bypass both).
    monkeypatch.setattr(direct_io, "_ENABLED", False)

    async def go() -> tuple[list[str], int, int]:  # driver calls: one each, or a pipeline
        client = redis.asyncio.Redis.from_url(module_server.url, decode_responses=True)
        try:
            aq = AsyncPartitionedQueue(client, pq.layout, _clock="test")
            sent: list[Any] = []
            execute: Any = client.execute_command
            pipeline = client.pipeline

            async def one(*args: Any, **kw: Any) -> Any:
                sent.append(args[0])
                return await execute(*args, **kw)

            def pipe(*args: Any, **kw: Any) -> Any:
                sent.append("pipeline")
                return pipeline(*args, **kw)

            client.execute_command = one  # type: ignore[method-assign]
            client.pipeline = pipe  # type: ignore[method-assign]
            ids = await aq.dead_ids()
            n_read = len(sent)
            sent.clear()
            assert await aq.requeue_dead(died) == len(died)
            return ids, n_read, len(sent)
        finally:
            await client.aclose()

    ids, reads, writes = asyncio.run(go())
    assert ids == died and reads == 2 and writes == 1


def test_stats_is_two_driver_calls_a_row_for_any_number_of_partitions(
    counted: tuple[PartitionedQueue, Counter],
) -> None:
    pq, c = counted
    kill_per_partition(pq, 1, server_now_ms(pq.client) - 10_000)  # minutes stats reads
    pq.enqueue_many([JobSpec("t", None) for _ in range(8)])
    PartitionedQueue.open(pq.client, pq.name).parts[0].preload()  # stats: the server clock
    c.reset()
    row = queue_stats(pq.client, pq.name)
    # The layout GET, every partition's counts, every partition's due head and stats minutes.
    assert c.trips == 3, c.cmds[:5]
    assert (row["due"], row["dead"], row["partitions"]) == (8, N, N)
    assert row["windows"]["60m"]["dead"] == N
    assert row["oldest_overdue_id"] in {j.id for j in pq.list_jobs("due")}
    assert row["held"] == {"key_limit": 0, "rate_window": 0, "waiting": 0}


# -- doctor ----------------------------------------------------------------------------------
def test_doctor_loads_its_scripts_only_when_the_server_lacks_them(
    module_server: RedisProcess, queue_name: str
) -> None:
    """Every job of a queue needs a repair (lua/repair.lua, by EVALSHA: the operator role has
    no EVAL): SCRIPT LOAD when the server lacks a script, never once per job or per check
    (INFO commandstats)."""
    from scheduler import Queue
    from scheduler.admin.doctor import repair_queue

    client = redis.Redis.from_url(module_server.url, decode_responses=True)
    q = Queue(client, queue_name)

    def broken(n: int) -> list[str]:
        ids = q.enqueue_many([JobSpec("t", i) for i in range(n)])
        jobs = q.claim("w0", limit=n).jobs
        assert q.release([(j.id, j.token) for j in jobs]) == ["released"] * n  # hashes
        for jid in ids:  # in due, the state field says done: a fixable issue each
            client.hset(q.keys.job(jid), "state", "done")
        return ids

    def loads_for_a_repair_of(ids: list[str]) -> int:
        client.config_resetstat()
        report = repair_queue(client, queue_name)
        assert {i.job_id for i in report.fixed} >= set(ids) and not report.remaining
        return int(client.info("commandstats").get("cmdstat_script|load", {}).get("calls", 0))

    try:
        client.script_flush()
        assert loads_for_a_repair_of(broken(6)) <= 2  # dead_migrate and repair, once each
        assert loads_for_a_repair_of(broken(6)) == 0
    finally:
        delete_queue(client, q)
        client.close()


# -- dashboard -------------------------------------------------------------------------------
def test_the_job_and_workers_pages_read_the_clock_with_time(
    module_server: RedisProcess, queue_name: str
) -> None:
    """They need the server's time, not the counts: TIME, not the counts script."""
    from starlette.testclient import TestClient

    from scheduler import Queue
    from scheduler.dashboard import Auth, create_app

    client, c = counting_client(module_server.url)
    q = Queue(client, queue_name)
    q.preload()
    jid = q.enqueue("t", None, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    assert q.fail(job.id, job.token, ValueError("x")).status == "dead"
    try:
        web = TestClient(create_app(client=client, queues=[q.name], auth=Auth()))
        for path in (f"/queues/{q.name}/jobs/{jid}", "/workers"):
            c.reset()
            assert web.get(path).status_code == 200
            assert c.scripts("counts") == 0 and len(c.named("TIME")) == 1, path
    finally:
        delete_queue(client, q)
        client.close()


def test_the_dashboard_keeps_a_bounded_number_of_queue_clients(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.dashboard import store

    monkeypatch.setattr(store, "MAX_CACHED", 10, raising=False)
    s = store.Store(redis.Redis.from_url(module_server.url, decode_responses=True))
    for n in range(25):  # names from URLs: any number of them
        s.queue(f"url-{n}")
    assert len(s._queues) <= 10
