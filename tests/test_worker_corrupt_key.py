"""A worker serving a queue one of whose keys was edited by hand into another type: the claim
is refused whole (CorruptKey, nothing written), the worker logs it, backs off and goes on with
its other queues, and drains the spoiled queue once the key is fixed (before: WRONGTYPE was
'refused', so the worker stopped with EXIT_REDIS_REFUSED and every queue it served stopped)."""

from __future__ import annotations

import asyncio
import uuid

import redis
import redis.asyncio as aredis

from scheduler import CorruptKey, Queue
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.execution import classify
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess
from tests.test_worker_hardening import capture
from tests.workers import hardening


def test_corrupt_key_is_transient() -> None:
    assert classify(CorruptKey("dead is not a zset (nothing written)")) == "transient"


def test_a_spoiled_queue_waits_for_its_fix_and_the_others_go_on(
    module_server: RedisProcess,
) -> None:
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    spoiled = Queue(admin, "ck-" + uuid.uuid4().hex[:8])
    healthy = Queue(admin, "ck-" + uuid.uuid4().hex[:8])
    # A lease that lapsed on its last attempt: the reaper must park it (into dead).
    lapsed = spoiled.enqueue("noop", max_attempts=1)
    assert [j.id for j in spoiled.claim("gone", limit=1, lease_ms=1).jobs] == [lapsed]
    admin.set(spoiled.keys.dead, "hand-edited")
    waiting = spoiled.enqueue("noop")
    log, records = capture()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(spoiled.name, healthy.name), lease_ms=3000, heartbeat_ms=100, grace_s=1),
            logger=log)  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        refused = w.metrics.redis_backoffs.labels("claim", "CorruptKey")
        await poll(lambda: refused._value.get() >= 2, what="claims of the spoiled queue refused")
        job = healthy.enqueue("noop")
        await poll(lambda: healthy.status(job) == "done", what="the healthy queue served")
        assert not task.done()
        assert admin.hget(spoiled.keys.job(waiting), "state") is None  # still untouched
        admin.delete(spoiled.keys.dead)
        await poll(lambda: spoiled.status(waiting) == "done", what="the spoiled queue, fixed")
        w.request_stop()
        code = await task
        await client.aclose()
        return code

    assert asyncio.run(main()) == EXIT_OK
    assert spoiled.status(lapsed) == "dead"
    assert any("CorruptKey: dead is not a zset" in m and "scheduler doctor" in m for m in records)
    admin.close()


def test_a_spoiled_workers_listing_does_not_stop_a_worker(module_server: RedisProcess) -> None:
    """Before: worker_beat's ZADD into a `workers` key of another type raised WRONGTYPE, which
    the presence loop took as a refusal: the worker stopped (its jobs fine, its listing not)."""
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, "ck-" + uuid.uuid4().hex[:8])
    admin.set(q.keys.workers, "hand-edited")
    log, _records = capture()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(q.name,), lease_ms=3000, heartbeat_ms=100, grace_s=1), logger=log)  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        job = q.enqueue("noop")
        await poll(lambda: q.status(job) == "done", what="a job served")
        assert not task.done()
        w.request_stop()
        code = await task
        await client.aclose()
        return code

    assert asyncio.run(main()) == EXIT_OK
    assert admin.get(q.keys.workers) == "hand-edited"  # left for an operator
    admin.close()
