"""The queue index `sched:queues` (scheduler/core/queue_index.py): producers and workers add
their queue's name once per process and client, listings read it instead of scanning the
keyspace, and the first listing scans once for queues older writers left unindexed. On a
private server: the tests count its SCAN and SADD calls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler._spawn import RedisProcess
from scheduler.admin.inspection import discover_queues
from scheduler.core import queue_index
from scheduler.core.connection import connect, connect_async
from scheduler.core.keys import QUEUE_INDEX, QueueKeys
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry
from tests.conftest import delete_queue


@pytest.fixture
def r(module_server: RedisProcess) -> Iterator[redis.Redis]:
    c = connect(module_server.url)
    c.flushall()
    c.config_resetstat()
    yield c
    c.close()


def _calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def _older_writer(r: redis.Redis, name: str) -> None:
    """A queue as a version before the index left it: keys, no index entry."""
    r.zadd(QueueKeys(name).due, {"j1": 1})


def test_a_producer_adds_its_queue_once_per_client(r: redis.Redis) -> None:
    q = Queue(r, "mail")
    q.enqueue("send", {"to": "a"})
    q.enqueue_many([JobSpec("send", {"to": "b"})])
    assert r.smembers(QUEUE_INDEX) == {"mail"}
    assert _calls(r, "sadd") == 1
    again = Queue(r, "mail")  # one Queue per web request, one client: no second SADD
    again.enqueue("send", None)
    assert _calls(r, "sadd") == 1
    Queue(r, "reports").schedule("nightly", "build", cron="0 3 * * *")
    assert r.smembers(QUEUE_INDEX) == {"mail", "reports"}


def test_an_async_producer_and_a_worker_add_theirs(
    r: redis.Redis, module_server: RedisProcess
) -> None:
    async def main() -> None:
        ac = connect_async(module_server.url)
        try:
            await AsyncQueue(ac, "async-q").enqueue("send", None)
            settings = WorkerSettings(queues=("served", "also-served"), heartbeat_ms=100)
            w = Worker(ac, Registry(), settings)
            task = asyncio.create_task(w.run(install_signals=False))
            for _ in range(500):
                if {"served", "also-served"} <= r.smembers(QUEUE_INDEX):
                    break
                await asyncio.sleep(0.01)
            w.request_stop()
            await task
        finally:
            await ac.aclose()

    asyncio.run(main())
    assert r.smembers(QUEUE_INDEX) == {"async-q", "served", "also-served"}


def test_a_burst_of_first_async_calls_shares_one_addition(
    r: redis.Redis, module_server: RedisProcess
) -> None:
    # Each of 150 first calls made its own SADD, one pooled connection per call in flight:
    # past redis.asyncio's 100 they raised MaxConnectionsError before their job was sent.
    async def main() -> list[object]:
        ac = connect_async(module_server.url)
        try:
            aq = AsyncQueue(ac, "burst")
            calls = [aq.enqueue("send", {"n": i}) for i in range(150)]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await ac.aclose()

    got = asyncio.run(main())
    assert [g for g in got if not isinstance(g, str)] == []
    assert _calls(r, "sadd") == 1 and r.smembers(QUEUE_INDEX) == {"burst"}
    assert r.zcard(QueueKeys("burst").due) == 150


def test_the_first_listing_scans_once_and_later_ones_read_the_index(r: redis.Redis) -> None:
    _older_writer(r, "legacy")
    Queue(r, "fresh").enqueue("t", None)
    assert discover_queues(r) == ["fresh", "legacy"]
    scans = _calls(r, "scan")
    assert scans > 0 and r.sismember(QUEUE_INDEX, queue_index.SCANNED)
    Queue(r, "newer").enqueue("t", None)
    assert discover_queues(r) == ["fresh", "legacy", "newer"]
    assert _calls(r, "scan") == scans  # no second SCAN
    # A queue an older writer starts now is not seen until the index is deleted (a rescan).
    _older_writer(r, "legacy2")
    assert "legacy2" not in discover_queues(r)
    r.delete(QUEUE_INDEX)
    assert discover_queues(r) == ["fresh", "legacy", "legacy2", "newer"]
    assert _calls(r, "scan") > scans


def test_an_emptied_queue_leaves_the_listing_not_the_index(r: redis.Redis) -> None:
    q = Queue(r, "gone")
    q.enqueue("t", None)
    Queue(r, "kept").enqueue("t", None)
    assert discover_queues(r) == ["gone", "kept"]
    delete_queue(r, q)
    assert discover_queues(r) == ["kept"]
    assert r.sismember(QUEUE_INDEX, "gone")


def test_a_paused_emptied_queue_stays_listed(r: redis.Redis) -> None:
    """Its config hash (the pause) is all that is left: an operator who paused it must still
    see it in `stats` and the dashboard, to resume it."""
    q = Queue(r, "held-back")
    job = q.enqueue("t", None)
    assert q.pause() == "paused"
    assert discover_queues(r) == ["held-back"]  # scanned: it still has a due job
    assert q.cancel(job) == "due"  # cancelled while due
    config = QueueKeys("held-back").config
    for key in r.keys("sched:{held-back}:*"):  # its record, stats and wake-ups expired
        if key != config:
            r.delete(key)
    assert r.exists(config)
    assert discover_queues(r) == ["held-back"]
    assert q.resume() == "resumed"
    r.delete(*r.keys("sched:{held-back}:*"))  # its wake-up for idle workers, its config
    assert discover_queues(r) == []


def test_a_hand_edited_index_is_scanned_around_and_refuses_no_enqueue(r: redis.Redis) -> None:
    r.set(QUEUE_INDEX, "not a set")
    q = Queue(r, "q1")
    job = q.enqueue("t", None)  # the SADD is refused (WRONGTYPE): the job is accepted
    assert q.status(job) == "due"
    assert discover_queues(r) == ["q1"]  # by SCAN, the index left as it is
    assert r.get(QUEUE_INDEX) == "not a set"
    r.delete(QUEUE_INDEX)
    r.sadd(QUEUE_INDEX, queue_index.SCANNED, "../x", "q1")  # a name no queue may have
    assert discover_queues(r) == ["q1"]
