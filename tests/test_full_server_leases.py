"""Leases through a full server (maxmemory, noeviction): heartbeat.lua starts with a ZREM, which
Redis runs at the limit, so running jobs keep their leases (docs/durability.md, A full server);
the worker's presence beat is still refused, so it drops out of `scheduler workers` meanwhile.
A private server: the tests reconfigure it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import Queue
from scheduler.admin.workers import live_workers
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess, require_server
from tests.test_worker_hardening import capture

registry = Registry()
_gate = asyncio.Event()


@registry.task(name="fs-gate")
async def gate(payload: Any, ctx: JobContext) -> str:
    await _gate.wait()
    return "ok"


def _server_ms(admin: redis.Redis) -> float:
    s, us = admin.time()
    return s * 1000 + us / 1000


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProcess]:
    binary = require_server("a private server the tests fill")
    with RedisProcess(binary) as s:
        yield s


@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    c = server.client()
    c.config_set("maxmemory-policy", "noeviction")
    yield c
    c.config_set("maxmemory", 0)


def test_a_heartbeat_at_maxmemory_extends_every_held_lease(admin: redis.Redis) -> None:
    """The first job of the call has lapsed (no write for it): the first held one still gets
    the ZREM first, and the one after it the ZADD XX that the written script may run."""
    q = Queue(admin, "fs-" + uuid.uuid4().hex[:8])
    ids = [q.enqueue("t", i) for i in range(3)]
    lapsed = q.claim("w", limit=1, lease_ms=1).jobs[0]
    held = q.claim("w", limit=2, lease_ms=60_000, reap_limit=0).jobs
    while (admin.zscore(q.keys.leased, lapsed.id) or 0) >= _server_ms(admin):
        time.sleep(0.001)
    admin.config_set("maxmemory", 1)
    with pytest.raises(redis.OutOfMemoryError):
        q.enqueue("t", "no room")
    leases = [(lapsed.id, lapsed.token)] + [(j.id, j.token) for j in held]
    until, statuses = q.heartbeat(leases, lease_ms=120_000)
    assert statuses == {lapsed.id: "expired", held[0].id: "held", held[1].id: "held"}
    assert [admin.zscore(q.keys.leased, j.id) for j in held] == [until, until]
    assert sorted(ids) == sorted(i for i, _ in leases)
    assert admin.zcard(q.keys.leased) == 3  # the lapsed one left for a claim to reap


def test_a_worker_keeps_its_leases_but_drops_out_of_the_listing_while_the_server_is_full(
    server: RedisProcess, admin: redis.Redis
) -> None:
    q = Queue(admin, "fw-" + uuid.uuid4().hex[:8])
    job = q.enqueue("fs-gate", None)
    log, records = capture()
    _gate.clear()

    def listed() -> list[str]:
        return [w.id for w in live_workers(admin, q.keys)[0]]

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
        w = Worker(client, registry, WorkerSettings(queues=(q.name,), lease_ms=1500,
                   heartbeat_ms=100, grace_s=2), logger=log)  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: q.status(job) == "leased" and listed() == [w.id], "running")
            admin.config_set("maxmemory", 1)
            try:
                first = float(admin.zscore(q.keys.leased, job) or 0)
                # The presence hash expires (3 heartbeats) unrefreshed; the lease moves on.
                await poll(lambda: listed() == [], "the worker out of the listing")
                await poll(lambda: (admin.zscore(q.keys.leased, job) or 0) > first + 1500,
                           "the lease extended past its first end")  # fmt: skip
            finally:
                admin.config_set("maxmemory", 0)
            await poll(lambda: listed() == [w.id], "the worker listed again")
            _gate.set()
            await poll(lambda: q.status(job) == "done", "the job done")
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await client.aclose()
        return code

    assert asyncio.run(main()) == 0
    assert any("presence" in m and "OutOfMemoryError" in m for m in records), records
    assert q.get_job(job).attempts == 1
