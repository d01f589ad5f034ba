"""`Queue.result` and the client's pool: a BlockingConnectionPool that has no connection free
within its `timeout` (operations/result_wait.py `pool_exhausted`), and a wait interrupted while
it takes or holds a wait slot (client/result_slots.py `_Slots.held`). On this module's private
server."""

from __future__ import annotations

import asyncio
import time
import types
from collections import deque
from collections.abc import Iterator
from queue import Empty
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from scheduler import JobCancelled, Queue
from scheduler._spawn import RedisProcess
from scheduler.client import result_waiting
from scheduler.core.connection import connect
from scheduler.operations.requests import Commands
from scheduler.operations.result_wait import Pause, outage, pool_exhausted
from tests.redis_server import free_port, is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")


@pytest.fixture
def url(module_server: RedisProcess) -> str:
    return module_server.url


@pytest.fixture
def admin(url: str) -> Iterator[redis.Redis]:
    c = connect(url)
    yield c
    c.close()


def _raised(call: Any) -> BaseException:
    try:
        call()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def _no_connection_free(url: str) -> BaseException:
    """What redis-py raises for a BlockingConnectionPool whose one connection another thread
    holds past the pool's timeout."""
    pool: Any = redis.BlockingConnectionPool.from_url(url, max_connections=1, timeout=0.01)
    held = pool.get_connection()
    try:
        return _raised(pool.get_connection)
    finally:
        pool.release(held)
        pool.disconnect()


def _no_connection_free_aio(url: str) -> BaseException:
    async def main() -> BaseException:
        pool: Any = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=1, timeout=0.01
        )
        held = await pool.get_connection()
        try:
            try:
                await pool.get_connection()
            except BaseException as exc:
                return exc
            raise AssertionError("nothing raised")
        finally:
            await pool.release(held)
            await pool.disconnect()

    return asyncio.run(main())


_ONCE = Retry(NoBackoff(), 0)  # the error itself, without redis-py's retries


def _refused() -> BaseException:
    """A server that is down: nothing listens on the port."""
    c = redis.Redis(port=free_port(), socket_connect_timeout=5, retry=_ONCE)
    try:
        return _raised(c.ping)
    finally:
        c.close()


def _refused_through_a_blocking_pool() -> BaseException:
    """The same, through a BlockingConnectionPool (its get_connection connects)."""
    pool: Any = redis.BlockingConnectionPool.from_url(
        f"redis://127.0.0.1:{free_port()}", max_connections=1, timeout=0.01, retry=_ONCE
    )
    try:
        return _raised(redis.Redis(connection_pool=pool, retry=_ONCE).ping)
    finally:
        pool.disconnect()


def test_redis_pys_no_connection_available_is_a_full_pool_and_a_refused_socket_an_outage(
    url: str,
) -> None:
    """Read from the installed redis-py itself, both pools' flavours: a plain ConnectionError
    (not MaxConnectionsError) in both."""
    full = [_no_connection_free(url), _no_connection_free_aio(url)]
    down = [_refused(), _refused_through_a_blocking_pool()]
    assert [type(e) for e in full] == [RedisConnectionError] * 2, full
    assert all(isinstance(e, RedisConnectionError) for e in down), down
    assert [(pool_exhausted(e), outage(e)) for e in full] == [(True, False)] * 2
    assert [(pool_exhausted(e), outage(e)) for e in down] == [(False, True)] * 2, down
    # redis-py 7.3's and 8.2's text; a reworded one still tells by the queue.Empty it is raised
    # from (the blocking pool's).
    assert pool_exhausted(RedisConnectionError("No connection available"))
    assert not pool_exhausted(RedisConnectionError("Connection closed by server."))
    assert pool_exhausted(_raised(_reworded))


def _reworded() -> None:
    try:
        raise Empty
    except Empty:
        raise RedisConnectionError("no free connection in the pool")  # noqa: B904 (as redis-py)


def test_the_wait_op_raises_a_full_blocking_pool_and_retries_a_server_down(
    url: str, queue_name: str
) -> None:
    """The op both drivers share (the async driver throws the same exceptions into it)."""
    q = Queue(redis.Redis(), queue_name)  # never sent: the op is driven by hand
    for exc in (_no_connection_free(url), _no_connection_free_aio(url)):
        op = q.ops.result("j1", 60)
        assert isinstance(next(op), Commands)
        assert _raised(lambda: op.throw(exc)) is exc  # noqa: B023 (called at once)
    for exc in (_refused(), _refused_through_a_blocking_pool()):
        op = q.ops.result("j1", 60)
        assert isinstance(next(op), Commands)
        assert isinstance(op.throw(exc), Pause)


def test_a_wait_on_a_blocking_pool_with_no_connection_free_raises_at_once(
    url: str, admin: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool the docs advise for threads, another thread's call holding its connection past
    its timeout: the wait used to retry the pool's ConnectionError as an outage, sleeping, for
    its whole timeout_s (a sleep here fails the test instead)."""
    pool: Any = redis.BlockingConnectionPool.from_url(
        url, max_connections=1, timeout=0.01, decode_responses=True
    )
    q = Queue(redis.Redis(connection_pool=pool), queue_name)
    job = Queue(admin, queue_name).enqueue("t", {}, delay_ms=600_000)

    def sleep(seconds: float) -> None:
        raise AssertionError(f"retried as an outage (a pause of {seconds} s)")

    monkeypatch.setattr(result_waiting, "time", types.SimpleNamespace(
        monotonic=time.monotonic, sleep=sleep))  # fmt: skip
    held = pool.get_connection()  # another thread's call, say
    try:
        got = _raised(lambda: q.result(job, timeout_s=600))
    finally:
        pool.release(held)
    assert type(got) is RedisConnectionError and "No connection available" in str(got), got
    Queue(admin, queue_name).cancel(job)
    with pytest.raises(JobCancelled):  # the connection free again: the wait reads
        q.result(job, timeout_s=5)
    pool.disconnect()


# -- a wait interrupted while it takes a slot -------------------------------------------------
@pytest.mark.parametrize("nth", [1, 2, 3, 4], ids=["read", "announce", "re-read", "blmove"])
def test_ctrl_c_right_after_a_wait_slot_is_taken_gives_it_back(
    url: str, admin: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    """KeyboardInterrupt raised by the call right after the nth take of the wait's slot (the
    turn's notify, the client's only slot just taken): the slot used to stay taken for good,
    and every later wait on the pool ended in ResultTimeout without a read."""
    q = Queue.from_url(f"{url}?max_connections=2", queue_name)  # one wait slot
    side = Queue(admin, queue_name)
    job = side.enqueue("t", {}, delay_ms=600_000)
    slots = result_waiting._sync_slots(q.client)
    notify_all = slots.cond.notify_all
    takes: list[int] = []

    def interrupted() -> None:
        notify_all()
        if slots.free == 0:  # in the take that just took the only slot
            takes.append(len(takes) + 1)
            if takes[-1] == nth:
                raise KeyboardInterrupt

    monkeypatch.setattr(slots.cond, "notify_all", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            q.result(job, timeout_s=60)
        monkeypatch.undo()
        assert takes[nth - 1 :][:1] == [nth]
        assert (slots.free, list(slots.turns)) == (1, [])
        assert admin.scard(q.keys.result_wait(job)) == 0  # it left: the SREM had its slot
        side.cancel(job)
        with pytest.raises(JobCancelled):
            q.result(job, timeout_s=5)
    finally:
        q.close()


class _Turns(deque[object]):
    """A KeyboardInterrupt right after a waiter joins the queue of turns, once."""

    armed = True

    def append(self, x: object) -> None:
        super().append(x)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_ctrl_c_as_a_wait_joins_the_turns_leaves_no_turn_behind(
    url: str, admin: redis.Redis, queue_name: str
) -> None:
    """Its turn used to stay at the head of the queue: every later take waited behind a thread
    that was gone, and the pool's waits all ended in ResultTimeout without a read."""
    q = Queue.from_url(f"{url}?max_connections=2", queue_name)
    side = Queue(admin, queue_name)
    job = side.enqueue("t", {}, delay_ms=600_000)
    slots = result_waiting._sync_slots(q.client)
    slots.turns = _Turns()
    try:
        with pytest.raises(KeyboardInterrupt):
            q.result(job, timeout_s=60)
        assert (slots.free, list(slots.turns)) == (1, [])
        side.cancel(job)
        with pytest.raises(JobCancelled):
            q.result(job, timeout_s=5)
    finally:
        q.close()


def test_a_slot_held_is_given_back_however_the_block_ends() -> None:
    slots = result_waiting._Slots(1)
    with pytest.raises(KeyboardInterrupt), slots.held(0) as got:
        assert got
        raise KeyboardInterrupt
    with slots.held(0) as got:
        assert got and slots.free == 0
        with slots.held(0) as none:
            assert not none
    assert (slots.free, list(slots.turns)) == (1, [])
