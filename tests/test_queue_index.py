"""The queue index `sched:queues` (scheduler/core/queue_index.py): producers and workers add
their queue's name once per process and client, listings read it instead of scanning the
keyspace, and the first listing scans once for queues older writers left unindexed. On a
private server: the tests count its SCAN and SADD calls."""

from __future__ import annotations

import asyncio

import redis

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler._spawn import RedisProcess
from scheduler.admin.inspection import discover_queues
from scheduler.core import queue_index
from scheduler.core.connection import connect_async
from scheduler.core.keys import QUEUE_INDEX, QueueKeys
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry
from tests.conftest import delete_queue


def _calls(private: redis.Redis, command: str) -> int:
    stats = private.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def _older_writer(private: redis.Redis, name: str) -> None:
    """A queue as a version before the index left it: keys, no index entry."""
    private.zadd(QueueKeys(name).due, {"j1": 1})


def test_a_producer_adds_its_queue_once_per_client(private: redis.Redis) -> None:
    q = Queue(private, "mail")
    q.enqueue("send", {"to": "a"})
    q.enqueue_many([JobSpec("send", {"to": "b"})])
    assert private.smembers(QUEUE_INDEX) == {"mail"}
    assert _calls(private, "sadd") == 1
    again = Queue(private, "mail")  # one Queue per web request, one client: no second SADD
    again.enqueue("send", None)
    assert _calls(private, "sadd") == 1
    Queue(private, "reports").schedule("nightly", "build", cron="0 3 * * *")
    assert private.smembers(QUEUE_INDEX) == {"mail", "reports"}


def test_an_async_producer_and_a_worker_add_theirs(
    private: redis.Redis, module_server: RedisProcess
) -> None:
    async def main() -> None:
        ac = connect_async(module_server.url)
        try:
            await AsyncQueue(ac, "async-q").enqueue("send", None)
            settings = WorkerSettings(queues=("served", "also-served"), heartbeat_ms=100)
            w = Worker(ac, Registry(), settings)
            task = asyncio.create_task(w.run(install_signals=False))
            for _ in range(500):
                if {"served", "also-served"} <= private.smembers(QUEUE_INDEX):
                    break
                await asyncio.sleep(0.01)
            w.request_stop()
            await task
        finally:
            await ac.aclose()

    asyncio.run(main())
    assert private.smembers(QUEUE_INDEX) == {"async-q", "served", "also-served"}


def test_a_burst_of_first_async_calls_shares_one_addition(
    private: redis.Redis, module_server: RedisProcess
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
    assert _calls(private, "sadd") == 1 and private.smembers(QUEUE_INDEX) == {"burst"}
    assert private.zcard(QueueKeys("burst").due) == 150


def test_the_first_listing_scans_once_and_later_ones_read_the_index(private: redis.Redis) -> None:
    _older_writer(private, "legacy")
    Queue(private, "fresh").enqueue("t", None)
    assert discover_queues(private) == ["fresh", "legacy"]
    scans = _calls(private, "scan")
    assert scans > 0 and private.sismember(QUEUE_INDEX, queue_index.SCANNED)
    Queue(private, "newer").enqueue("t", None)
    assert discover_queues(private) == ["fresh", "legacy", "newer"]
    assert _calls(private, "scan") == scans  # no second SCAN
    # A queue an older writer starts now is not seen until the index is deleted (a rescan).
    _older_writer(private, "legacy2")
    assert "legacy2" not in discover_queues(private)
    private.delete(QUEUE_INDEX)
    assert discover_queues(private) == ["fresh", "legacy", "legacy2", "newer"]
    assert _calls(private, "scan") > scans


def test_an_emptied_queue_leaves_the_listing_not_the_index(private: redis.Redis) -> None:
    q = Queue(private, "gone")
    q.enqueue("t", None)
    Queue(private, "kept").enqueue("t", None)
    assert discover_queues(private) == ["gone", "kept"]
    delete_queue(private, q)
    assert discover_queues(private) == ["kept"]
    assert private.sismember(QUEUE_INDEX, "gone")


def test_a_paused_emptied_queue_stays_listed(private: redis.Redis) -> None:
    """Its config hash (the pause) is all that is left: an operator who paused it must still
    see it in `stats` and the dashboard, to resume it."""
    q = Queue(private, "held-back")
    job = q.enqueue("t", None)
    assert q.pause() == "paused"
    assert discover_queues(private) == ["held-back"]  # scanned: it still has a due job
    assert q.cancel(job) == "due"  # cancelled while due
    config = QueueKeys("held-back").config
    for key in private.keys("sched:{held-back}:*"):  # its record, stats and wake-ups expired
        if key != config:
            private.delete(key)
    assert private.exists(config)
    assert discover_queues(private) == ["held-back"]
    assert q.resume() == "resumed"
    private.delete(*private.keys("sched:{held-back}:*"))  # its wake-up for idle workers, its config
    assert discover_queues(private) == []


def test_a_hand_edited_index_is_scanned_around_and_refuses_no_enqueue(private: redis.Redis) -> None:
    private.set(QUEUE_INDEX, "not a set")
    q = Queue(private, "q1")
    job = q.enqueue("t", None)  # the SADD is refused (WRONGTYPE): the job is accepted
    assert q.status(job) == "due"
    assert discover_queues(private) == ["q1"]  # by SCAN, the index left as it is
    assert private.get(QUEUE_INDEX) == "not a set"
    private.delete(QUEUE_INDEX)
    private.sadd(QUEUE_INDEX, queue_index.SCANNED, "../x", "q1")  # a name no queue may have
    assert discover_queues(private) == ["q1"]
