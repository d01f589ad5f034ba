"""SCRIPT FLUSH and server restarts (graceful and kill -9) under load: the script cache is empty
afterwards, so every client has to reload its scripts by itself; no error may reach the user."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff

from scheduler import AsyncQueue, Queue
from tests.faults.conftest import Server, retrying_client
from tests.workers.procs import wait_for

QUEUE = "flush"


def test_script_flush_and_restarts_under_load(durable_server: Server) -> None:
    server = durable_server
    errors: list[BaseException] = []
    ids: list[str] = []
    done: list[str] = []
    stop = threading.Event()  # producers stop first, then the workers drain
    drained = threading.Event()
    lock = threading.Lock()

    def guarded(body: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                errors.append(exc)

        return threading.Thread(target=run)

    def produce() -> None:
        q = Queue(retrying_client(server), QUEUE)
        while not stop.is_set():
            jid = q.enqueue("flush.t", {"x": 1})
            with lock:
                ids.append(jid)
            time.sleep(0.002)

    def work() -> None:
        q = Queue(retrying_client(server), QUEUE)
        while not drained.is_set() or q.counts().due:
            batch = q.claim("w", limit=20, lease_ms=30_000)
            statuses = q.complete_many([(j.id, j.token, None) for j in batch.jobs])
            assert set(statuses) <= {"done"}, statuses
            with lock:
                done.extend(j.id for j in batch.jobs)
            if not batch.jobs:
                time.sleep(0.005)

    def async_work() -> None:
        async def main() -> None:
            retry = AsyncRetry(ExponentialBackoff(cap=0.2, base=0.01), 60)  # the asyncio Retry
            client = aredis.Redis.from_url(server.url, decode_responses=True, retry=retry,
                                           socket_timeout=5)  # fmt: skip
            q = AsyncQueue(client, QUEUE)
            while not drained.is_set() or (await q.counts()).due:
                batch = await q.claim("aw", limit=20, lease_ms=30_000)
                for j in batch.jobs:
                    await q.complete(j.id, j.token, None)
                with lock:
                    done.extend(j.id for j in batch.jobs)
                if not batch.jobs:
                    await asyncio.sleep(0.005)
            await client.aclose()

        asyncio.run(main())

    threads = [guarded(produce), guarded(produce), guarded(work), guarded(async_work)]
    for t in threads:
        t.start()
    rng = random.Random(3)
    admin_url = server.url
    flushes = 0
    try:
        for step in range(6):
            deadline = time.monotonic() + rng.uniform(0.3, 0.6)
            while time.monotonic() < deadline:
                retrying_client(admin_url).script_flush()
                flushes += 1
                time.sleep(0.02)
            server.restart(hard=step % 2 == 1)
    finally:
        stop.set()
        for t in threads[:2]:
            t.join(timeout=60)
        drained.set()
        for t in threads[2:]:
            t.join(timeout=60)
    assert errors == [], f"errors reached the user: {errors[:3]!r}"
    wait_for(lambda: len(done) >= len(ids), timeout_s=10, what="all done")
    assert sorted(done) == sorted(ids), "a job was lost or completed twice"
    print(f"\nflush run: flushes={flushes} restarts={server.restarts} jobs={len(ids)}")


class FlushAfterLoad(redis.Redis):
    """Runs SCRIPT FLUSH right after redis-py's own SCRIPT LOAD: the EVALSHA that follows it
    gets NOSCRIPT, the race a restart or an operator's flush can hit."""

    flushes_left = 0

    def script_load(self, script: Any) -> Any:
        sha = super().script_load(script)
        if self.flushes_left > 0:
            self.flushes_left -= 1
            self.script_flush()
        return sha


class AsyncFlushAfterLoad(aredis.Redis):
    flushes_left = 0

    async def script_load(self, script: Any) -> Any:
        sha = await super().script_load(script)
        if self.flushes_left > 0:
            self.flushes_left -= 1
            await self.script_flush()
        return sha


def test_flush_between_load_and_evalsha_is_retried(start_server: Callable[..., Server]) -> None:
    server = start_server()
    client = FlushAfterLoad(unix_socket_path=server.socket, decode_responses=True)
    q = Queue(client, QUEUE)
    # Every load flushed: one load, then the driver sends the text (EVAL), which no flush can
    # make answer NOSCRIPT (retrying loads alone lost to a busy flusher).
    client.flushes_left = 100
    jid = q.enqueue("flush.t", None)
    assert client.flushes_left == 99 and q.status(jid) == "due"

    async def main() -> None:
        aclient = AsyncFlushAfterLoad(unix_socket_path=server.socket, decode_responses=True)
        aq = AsyncQueue(aclient, QUEUE)
        aclient.flushes_left = 100
        (job,) = (await aq.claim("w", limit=1)).jobs
        assert aclient.flushes_left == 99 and job.id == jid
        await aclient.aclose()

    asyncio.run(main())
    assert q.status(jid) == "leased"
