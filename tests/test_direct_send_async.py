"""direct_io._send_async: an asyncio send that cannot wait goes without redis-py's
`asyncio.wait_for` (a Task per send on Python 3.11); a large one, or one behind a buffer that is
not empty, keeps the socket timeout; the connection's timeout is the same afterwards. On a
private server (another test of this file stops it with SIGSTOP)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler import AsyncQueue, JobSpec
from tests.redis_server import RedisProcess


def count_wait_for(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The timeout of every asyncio.wait_for redis-py's connection module makes from now on."""
    calls: list[float | None] = []
    real = asyncio.wait_for

    async def wait_for(aw: Any, timeout: float | None) -> Any:
        calls.append(timeout)
        return await real(aw, timeout)

    monkeypatch.setattr(asyncio, "wait_for", wait_for)  # the module redis-py's connection calls
    return calls


def test_a_small_send_skips_wait_for_and_keeps_the_timeout(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(module_server.url, socket_timeout=7)
        q = AsyncQueue(c, queue_name)
        await q.enqueue("t", 0)  # connected, scripts loaded
        waits = count_wait_for(monkeypatch)
        ids = [await q.enqueue("t", {"n": i}) for i in range(20)]
        assert waits == []
        assert await c.zcard(q.keys.due) == 21 and (await q.get_job(ids[-1])).payload() == {"n": 19}
        # A pipeline over the transport's high-water mark (64 KiB by default) keeps wait_for.
        big = "x" * 2_000
        await q.enqueue_many([JobSpec("t", {"pad": big, "n": i}) for i in range(1_500)])
        assert waits and set(waits) == {7}, waits
        (conn,) = c.connection_pool._available_connections
        assert conn.socket_timeout == 7
        await c.aclose()

    asyncio.run(main())


def test_a_send_behind_a_full_buffer_keeps_the_timeout(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command larger than the high-water mark, to a server that reads nothing (SIGSTOP):
    the send times out as redis-py's does, TimeoutError, not a hang."""

    async def main() -> asyncio.StreamWriter:
        c = aredis.Redis.from_url(module_server.url, socket_timeout=0.5)
        q = AsyncQueue(c, queue_name)
        await q.enqueue("t", 0)
        (conn,) = c.connection_pool._available_connections
        writer = conn._writer
        assert writer is not None
        writer.transport.set_write_buffer_limits(high=1_000)
        waits = count_wait_for(monkeypatch)
        assert module_server.proc is not None
        os.kill(module_server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError):
                await q.enqueue_many([JobSpec("t", {"pad": "y" * 50_000, "n": i})
                                      for i in range(100)])  # fmt: skip
            assert waits and waits[0] == 0.5
            await c.aclose()
            # The timeout's disconnect(nowait=True) closed the transport with its buffer full:
            # it closes its socket once the server has read that buffer, which a sleep here
            # (0.1 s) did not always outlast (a loaded CI machine). Drop the buffer, wait for it.
            writer.transport.abort()
            await writer.wait_closed()
        finally:
            os.kill(module_server.proc.pid, signal.SIGCONT)
        return writer

    writer = asyncio.run(main())
    # Its socket closed before the loop was: a transport left closing with bytes unsent is an
    # "unclosed transport" ResourceWarning at GC, raised in whichever later test collects it.
    assert writer.transport.get_extra_info("socket").fileno() == -1


def test_the_health_check_ping_keeps_the_timeout(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With health_check_interval, the PING before a send is made with the timeout in place."""
    seen: list[float | None] = []

    async def main() -> None:
        c = aredis.Redis.from_url(module_server.url, socket_timeout=3, health_check_interval=1)
        q = AsyncQueue(c, queue_name)
        await q.enqueue("t", 0)
        (conn,) = c.connection_pool._available_connections
        real: Callable[[], Awaitable[None]] = conn.check_health

        async def check_health() -> None:
            seen.append(conn.socket_timeout)
            await real()

        monkeypatch.setattr(conn, "check_health", check_health)
        await q.enqueue("t", 1)
        assert seen == [3] and conn.socket_timeout == 3
        await c.aclose()

    asyncio.run(main())
