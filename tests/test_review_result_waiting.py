"""From a review of waiting for a job's outcome (`Queue.result`, `AsyncQueue.result` and their
partitioned twins; operations/inspecting.py `result`, operations/result_wait.py,
lua/lib/result.lua, client/result_waiting.py). Each test was a defect found (a strict xfail until
fixed): it asserts the behaviour a producer expects.

Checked and found right (no test here, or covered by test_results.py / test_result_wait_keys.py /
test_result_wake_parks.py / test_review_result_partitions.py): timeout_s edge values (0, -0.0,
negative, nan, inf, 10**400, bool, str, Decimal, None) refused with BadArgument on Queue and
PartitionedQueue alike, before any I/O; a bad id typed; the result JSON-decoded as stored (None,
unicode with U+2028 and NUL, 2**70, -0.0, 500 kB); 50 cancelled asyncio waiters release their
pooled connections and their `result_wait` members; a wait on a Redis Cluster is woken by
complete."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import AsyncQueue, Queue, ResultTimeout
from scheduler.core.connection import connect
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess, require_server
from tests.workers.procs import wait_for


def _name() -> str:
    return "rw-" + uuid.uuid4().hex[:10]


def _said(value: Any) -> str:
    """A value, or an exception with its class's module (redis-py 8's repr drops the class)."""
    if isinstance(value, BaseException):
        return f"{type(value).__module__}.{type(value).__qualname__}: {value}"
    return repr(value)


def _blocked(client: redis.Redis) -> int:
    """How many connections of the server are blocked in a BLMOVE (a waiter's slice); `cmd`
    alone is the last command, an idle connection's too."""
    clients = client.client_list()
    return sum(1 for c in clients if c.get("cmd") == "blmove" and "b" in c.get("flags", ""))


@pytest.fixture
def server(module_server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of this module's private server (never the shared one): the tests count its
    connections, commands and blocked clients."""
    c = connect(module_server.url)
    yield c
    c.close()


# -- 1. a URL socket_timeout shorter than the 1 s slice ----------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_short_url_socket_timeout_does_not_end_the_wait(
    module_server: RedisProcess, server: redis.Redis, kind: str
) -> None:
    # docs/cluster.md lists socket_timeout as any "seconds > 0"; the worker's idle pop blocks
    # for half of one under 2 s. result() always blocks 1 s, so the read times out first and
    # the caller gets redis.exceptions.TimeoutError (not a builtin TimeoutError, so not caught
    # by `except TimeoutError` as ResultTimeout is) within 0.3 s of a 1.5 s wait.
    url, name = module_server.url + "?socket_timeout=0.3", _name()
    job_id = Queue(server, name).enqueue("t", {}, delay_ms=600_000)

    def wait_sync() -> BaseException | None:
        try:
            Queue.from_url(url, name).result(job_id, timeout_s=1.5)
        except Exception as exc:
            return exc
        return None

    async def wait_async() -> BaseException | None:
        aq = AsyncQueue.from_url(url, name)
        try:
            await aq.result(job_id, timeout_s=1.5)
        except Exception as exc:
            return exc
        finally:
            await aq.aclose()
        return None

    got = wait_sync() if kind == "sync" else asyncio.run(wait_async())
    assert isinstance(got, ResultTimeout), _said(got)


# -- 2. a sync waiter interrupted (Ctrl-C) ----------------------------------------------------
def test_an_interrupted_sync_waiter_takes_itself_out(server: redis.Redis) -> None:
    # README's key table: result_wait holds each waiter "while it waits (however its wait ends,
    # a cancelled AsyncQueue.result too)". Ctrl-C in a script, or a SIGTERM handler's
    # sys.exit in a threaded web server's main thread, is the sync waiter's cancel.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run on the main thread only")
    q = Queue(server, _name())
    job_id = q.enqueue("t", {})

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    def fire() -> None:
        wait_for(lambda: _blocked(server) >= 1, 20, "the waiter blocked in BLMOVE")
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    before = signal.signal(signal.SIGUSR1, interrupt)
    firing = threading.Thread(target=fire, daemon=True)
    try:
        firing.start()
        with pytest.raises(KeyboardInterrupt):
            q.result(job_id, timeout_s=600)
    finally:
        firing.join(30)
        signal.signal(signal.SIGUSR1, before)
    try:
        assert server.exists(q.keys.result_wait(job_id)) == 0, server.pttl(
            q.keys.result_wait(job_id)
        )
    finally:
        server.delete(q.keys.result_wait(job_id))


# -- 3. an asyncio waiter cancelled while its announcement is in flight -----------------------
class ReplyHolder:
    """A unix-socket proxy in front of a Redis server, on the test's event loop: each connection
    forwards both ways until it sends a SADD (a waiter's announcement); from then on that
    connection's replies are held back, as a slow network would, so the SADD has run on the
    server while its caller still waits for the answer."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.path = os.path.join(tempfile.mkdtemp(prefix="rw"), "p.sock")
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_unix_connection(self.upstream)
        self.writers += [cw, uw]
        hold = asyncio.Event()

        async def up() -> None:
            while data := await cr.read(65536):
                if b"SADD" in data:
                    hold.set()
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down() -> None:
            while data := await ur.read(65536):
                if not hold.is_set():
                    cw.write(data)
                    await cw.drain()
            cw.close()

        for coro in (up(), down()):
            task = asyncio.create_task(coro)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        self.server.close()
        for w in self.writers:
            w.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def test_an_async_waiter_cancelled_during_its_announcement_leaves_no_key(
    module_server: RedisProcess, server: redis.Redis
) -> None:
    name = _name()
    job_id = Queue(server, name).enqueue("t", {})
    wait_key = Queue(server, name).keys.result_wait(job_id)

    async def go() -> None:
        proxy = ReplyHolder(module_server.socket)
        await proxy.start()
        aq = AsyncQueue.from_url("unix://" + proxy.path, name)
        try:
            task = asyncio.create_task(aq.result(job_id, timeout_s=600))
            # The SADD ran on the server; its reply is held: the waiter is in that round trip.
            await poll(lambda: server.exists(wait_key) == 1, "the waiter's SADD")
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=20)
            assert task in done and task.cancelled()
        finally:
            await aq.aclose()
            await proxy.close()

    asyncio.run(go())
    try:
        assert server.exists(wait_key) == 0, server.pttl(wait_key)
    finally:
        server.delete(wait_key)


# -- 4. many asyncio waiters on one AsyncQueue (expectation) ----------------------------------
def test_many_async_waiters_neither_fail_nor_starve_enqueue(
    module_server: RedisProcess, server: redis.Redis
) -> None:
    # A web app awaiting its jobs' results (the FastAPI example's comment suggests it): 150
    # requests waiting on one AsyncQueue. The manual shows 128 concurrent enqueues sharing two
    # connections; 150 concurrent waits take a connection each, the 101st and later fail at
    # once, and so does every other call of the queue while 100 wait.
    name = _name()
    producer = Queue(server, name)
    job_id = producer.enqueue("t", {})

    async def go() -> tuple[list[Any], Any]:
        aq = AsyncQueue.from_url(module_server.url, name)
        try:
            waiters = [asyncio.create_task(aq.result(job_id, timeout_s=30)) for _ in range(150)]
            await poll(lambda: _blocked(server) >= 1, "a waiter blocked in BLMOVE")
            try:
                enqueued: Any = await aq.enqueue("t", {}, delay_ms=600_000)
            except Exception as exc:
                enqueued = exc
            (lease,) = producer.claim("w", limit=1).jobs
            assert lease.id == job_id
            producer.complete(job_id, lease.token, {"ok": 1})
            got = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 30)
            return list(got), enqueued
        finally:
            await aq.aclose()

    got, enqueued = asyncio.run(go())
    assert isinstance(enqueued, str), _said(enqueued)
    failed = [_said(g) for g in got if g != {"ok": 1}]
    assert not failed, (len(failed), failed[:2])


# -- 5. a wait across a Redis restart (expectation) -------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_wait_survives_a_redis_restart(kind: str) -> None:
    durable = ("--appendonly", "yes", "--appendfsync", "always")
    srv = RedisProcess(require_server("a restarted server"), extra=durable).start()
    try:
        client = connect(srv.url)
        q = Queue(client, _name())
        job_id = q.enqueue("t", {})
        got: list[Any] = []

        async def wait_async() -> Any:
            async with AsyncQueue.from_url(srv.url, q.name) as aq:
                return await aq.result(job_id, timeout_s=30)

        def wait() -> None:
            try:
                if kind == "sync":
                    got.append(q.result(job_id, timeout_s=30))
                else:
                    got.append(asyncio.run(wait_async()))
            except Exception as exc:
                got.append(exc)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        wait_for(lambda: _blocked(client) >= 1, 20, "the waiter blocked in BLMOVE")
        srv.restart(hard=True)  # AOF, fsync always: the job and the announcement survive
        after = Queue(connect(srv.url), q.name)
        (lease,) = after.claim("w", limit=1).jobs
        assert lease.id == job_id
        after.complete(job_id, lease.token, {"x": 1})
        waiter.join(30)
        assert not waiter.is_alive()
        assert got == [{"x": 1}], [_said(g) for g in got]
        assert not isinstance(got[0], RedisConnectionError)
    finally:
        srv.cleanup()


# -- 6. "not by polling" ----------------------------------------------------------------------
def test_a_wait_without_an_outcome_does_not_poll_the_job(private: redis.Redis) -> None:
    q = Queue(private, _name())
    job_id = q.enqueue("t", {})  # due, never claimed: no outcome during the wait
    private.config_resetstat()
    with pytest.raises(ResultTimeout):
        q.result(job_id, timeout_s=3.2)
    stats = private.info("commandstats")
    reads = stats.get("cmdstat_hgetall", {}).get("calls", 0)
    scripts = stats.get("cmdstat_evalsha", {}).get("calls", 0)
    # Without polling: a read before announcing, one after (the outcome may have landed in
    # between), and at most one at the end; the counts script is never needed to tell
    # done / dead / cancelled from not finished.
    assert reads <= 3 and scripts == 0, {"hgetall": reads, "evalsha": scripts}


# -- 4b. how many asyncio waits hold connections --------------------------------------------
def test_the_waiters_of_one_job_share_one_blocking_read(
    module_server: RedisProcess, server: redis.Redis
) -> None:
    """Ten waiters of one job block on one BLMOVE; an eleventh, shorter one joins it and still
    ends at its own timeout_s, the others waiting on."""
    name = _name()
    producer = Queue(server, name)
    job_id = producer.enqueue("t", {})
    wait_key = producer.keys.result_wait(job_id)

    async def go() -> tuple[int, Any, list[Any]]:
        aq = AsyncQueue.from_url(module_server.url, name)
        try:
            waiters = [asyncio.create_task(aq.result(job_id, timeout_s=30)) for _ in range(10)]
            await poll(lambda: server.scard(wait_key) == 10 and _blocked(server) >= 1, "blocked")
            blocked = max(_blocked(server) for _ in range(20))  # one in flight, never more
            short: Any
            (short,) = await asyncio.gather(
                aq.result(job_id, timeout_s=0.3), return_exceptions=True
            )
            assert not any(w.done() for w in waiters)
            (lease,) = producer.claim("w", limit=1).jobs
            producer.complete(job_id, lease.token, {"ok": 1})
            got = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 30)
            return blocked, short, list(got)
        finally:
            await aq.aclose()

    blocked, short, got = asyncio.run(go())
    assert blocked <= 1
    assert isinstance(short, ResultTimeout), _said(short)
    assert got == [{"ok": 1}] * 10, [_said(g) for g in got]
    assert server.exists(wait_key) == 0


def test_waits_on_many_jobs_keep_half_the_pool_free(
    module_server: RedisProcess, server: redis.Redis
) -> None:
    """A pool of 4: six waiters of six jobs take turns on 2 connections, an enqueue meanwhile
    finds one, and every waiter gets its own job's result."""
    name = _name()
    producer = Queue(server, name)
    ids = [producer.enqueue("t", {}) for _ in range(6)]

    async def go() -> tuple[int, Any, list[Any]]:
        aq = AsyncQueue.from_url(module_server.url + "?max_connections=4", name)
        try:
            waiters = [asyncio.create_task(aq.result(i, timeout_s=60)) for i in ids]
            keys = [producer.keys.result_wait(i) for i in ids]
            await poll(lambda: server.exists(*keys) == 6, "every waiter announced")
            blocked = max(_blocked(server) for _ in range(20))
            try:
                enqueued: Any = await aq.enqueue("t", {}, delay_ms=600_000)
            except Exception as exc:
                enqueued = exc
            leases = producer.claim("w", limit=6).jobs
            for lease in leases:
                producer.complete(lease.id, lease.token, {"id": lease.id})
            got = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 60)
            return blocked, enqueued, list(got)
        finally:
            await aq.aclose()

    blocked, enqueued, got = asyncio.run(go())
    assert blocked <= 2
    assert isinstance(enqueued, str), _said(enqueued)
    assert got == [{"id": i} for i in ids], [_said(g) for g in got]
