"""The direct path takes its connection from the pool's list itself (direct_pool.take /
take_async), skipping redis-py 8's per-call recorders but none of the pool's checks: one
connection is reused and always given back; one left with a reply unread, or closed by the
server, is reconnected before use (with retries off too); a forked child never writes on its
parent's socket; pools it cannot serve that way (blocking, credential provider) go through
their own get_connection / release."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.credentials import UsernamePasswordCredentialProvider
from redis.retry import Retry

from scheduler.core import direct_io
from tests.redis_server import is_cluster_run
from tests.test_direct_io import _kill_others

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="plain clients only (cluster: cluster_io)")

ECHO = "return ARGV[1]"


def _count(pool: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"get": 0, "release": 0}
    get, release = pool.get_connection, pool.release

    def counted_get(*a: Any, **k: Any) -> Any:
        calls["get"] += 1
        return get(*a, **k)

    def counted_release(conn: Any) -> Any:
        calls["release"] += 1
        return release(conn)

    monkeypatch.setattr(pool, "get_connection", counted_get)
    monkeypatch.setattr(pool, "release", counted_release)
    return calls


def test_one_connection_is_reused_and_given_back(
    plain: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = plain.connection_pool
    calls = _count(pool, monkeypatch)
    echo = plain.script_load(ECHO)  # through execute_command: the pool makes the connection
    made = dict(calls)
    for i in range(50):
        assert direct_io.call_sync(plain, ("EVALSHA", echo, 0, i)) == str(i).encode()
    assert direct_io.pipeline_sync(plain, [("EVALSHA", echo, 0, "p")]) == [b"p"]
    assert calls == made  # taken from the list: not the pool's get_connection / release
    assert len(pool._available_connections) == 1 and not pool._in_use_connections


def test_a_new_connection_is_made_and_released_by_the_pool(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = redis.Redis.from_url(redis_url)
    sha = c.script_load(ECHO)
    c.connection_pool.disconnect()
    c.connection_pool.reset()  # an empty list: the next call needs a new connection
    calls = _count(c.connection_pool, monkeypatch)
    assert direct_io.call_sync(c, ("EVALSHA", sha, 0, "y")) == b"y"
    assert calls == {"get": 1, "release": 1}  # its counts stay the pool's own
    assert direct_io.call_sync(c, ("EVALSHA", sha, 0, "z")) == b"z"
    assert calls == {"get": 1, "release": 1}  # then it is in the list
    c.close()


def test_a_connection_left_with_a_reply_unread_is_reconnected(plain: redis.Redis) -> None:
    echo = plain.script_load(ECHO)
    conn = plain.connection_pool.get_connection()
    conn.send_command("PING")  # type: ignore[no-untyped-call]  # its PONG is never read
    # Wait for it to arrive (the check sees data waiting, not a reply still to come).
    assert conn.can_read(timeout=10)
    plain.connection_pool.release(conn)
    assert direct_io.call_sync(plain, ("EVALSHA", echo, 0, "mine")) == b"mine"
    assert direct_io.pipeline_sync(plain, [("EVALSHA", echo, 0, "next")]) == [b"next"]


def test_a_connection_closed_by_the_server_is_reconnected_with_retries_off(
    redis_url: str,
) -> None:
    c = redis.Redis.from_url(redis_url, client_name="direct-pool-kill", retry=Retry(NoBackoff(), 0))
    echo = c.script_load(ECHO)
    assert direct_io.call_sync(c, ("EVALSHA", echo, 0, "a")) == b"a"
    assert _kill_others(redis_url, "direct-pool-kill") == 1
    assert direct_io.call_sync(c, ("EVALSHA", echo, 0, "b")) == b"b"
    c.close()


def _child(sha: str, out: Any) -> None:
    c = _CLIENT[0]
    try:
        got = direct_io.call_sync(c, ("EVALSHA", sha, 0, "child"))
        owners = [conn.pid for conn in c.connection_pool._available_connections]
        out.put((got, owners == [os.getpid()]))
    except Exception as exc:  # pragma: no cover - reported to the parent
        out.put((repr(exc), False))


_CLIENT: list[redis.Redis] = []


def test_a_forked_child_takes_a_connection_of_its_own(plain: redis.Redis) -> None:
    echo = plain.script_load(ECHO)
    assert direct_io.call_sync(plain, ("EVALSHA", echo, 0, "parent")) == b"parent"
    (conn,) = plain.connection_pool._available_connections
    _CLIENT[:] = [plain]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(echo, out))
    p.start()
    p.join(20)
    # The child's pool was reset: it made and kept a connection of its own.
    assert p.exitcode == 0 and out.get(timeout=5) == (b"child", True)
    # The parent's connection was not used by the child: its next reply is its own.
    assert direct_io.call_sync(plain, ("EVALSHA", echo, 0, "again")) == b"again"
    assert plain.connection_pool._available_connections == [conn]


@pytest.mark.parametrize("kind", ["blocking", "credentials"])
def test_other_pools_go_through_their_own_calls(
    redis_url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "blocking":
        pool: Any = redis.BlockingConnectionPool.from_url(redis_url)
    else:
        # The URL's own user, else the default user (`nopass` on a private server: any
        # password is taken; redis-py 7 sends one even when none is given).
        kw = redis.ConnectionPool.from_url(redis_url).connection_kwargs
        provider = UsernamePasswordCredentialProvider(
            kw.get("username") or "default", kw.get("password") or "any"
        )
        pool = redis.ConnectionPool.from_url(redis_url, credential_provider=provider)
    c = redis.Redis(connection_pool=pool)
    echo = c.script_load(ECHO)
    calls = _count(pool, monkeypatch)
    for i in range(3):
        assert direct_io.call_sync(c, ("EVALSHA", echo, 0, i)) == str(i).encode()
    assert calls == {"get": 3, "release": 3}
    c.close()


async def _arrived(conn: Any, timeout_s: float = 10.0) -> None:
    """Until the reply sent to conn is in its buffer (read in, not consumed: what the pool's
    check sees as data waiting)."""
    deadline = time.monotonic() + timeout_s
    # redis-py 8: can_read (can_read_destructive deprecated); 7.3 has only the latter.
    check = getattr(conn, "can_read", None) or conn.can_read_destructive
    while not await check():
        assert time.monotonic() < deadline, "the PONG never arrived"
        await asyncio.sleep(0.005)


def test_asyncio_reuses_its_connection_and_reconnects_one_left_unread(redis_url: str) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(redis_url)
        pool = c.connection_pool
        echo = await c.script_load(ECHO)
        for i in range(20):
            assert await direct_io.call_async(c, ("EVALSHA", echo, 0, i)) == str(i).encode()
        (conn,) = pool._available_connections
        await conn.send_command("PING")  # its PONG is never read
        await _arrived(conn)
        got = await direct_io.pipeline_async(c, [("EVALSHA", echo, 0, "mine")])
        assert got == [b"mine"]
        assert len(pool._available_connections) == 1 and not pool._in_use_connections
        await c.aclose()

    asyncio.run(main())
