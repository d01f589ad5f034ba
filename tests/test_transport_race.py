"""A write on an asyncio connection the peer closed (or a concurrent disconnect closed) raises
AttributeError / TypeError from the transport's torn-down internals on some Pythons (redis-py
issues 3546, 4287); on uvloop (the worker's loop) it raises RuntimeError "the handler is
closed" (met in CI: a killed cluster primary stopped a worker). direct_io and the cluster
driver turn it into redis-py's ConnectionError (the call's retry applies) and the worker
classifies it as transient, never as a bug that stops the worker. asyncio's error is simulated
by code compiled under asyncio's file name, as the real one's innermost frame is; uvloop's is
real. Private servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import AsyncQueue
from scheduler.core.direct_io import transport_race
from scheduler.worker.execution import classify
from tests.redis_server import RedisProcess, require_server

CHILD = Path(__file__).parent / "workers" / "uvloop_closed_transport.py"


def raiser(filename: str, error: str) -> Callable[..., Any]:
    """A function whose frame is in `filename` and that raises `error` (a Python expression)."""
    space: dict[str, Any] = {}
    exec(compile(f"def boom(*a, **k):\n    raise {error}\n", filename, "exec"), space)
    return space["boom"]  # type: ignore[no-any-return]


def caught(fn: Callable[..., Any]) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # the test inspects it
        return exc
    raise AssertionError("did not raise")


STREAMS = "/usr/lib/python3.12/asyncio/streams.py"
NOT_CALLABLE = "TypeError(\"'NoneType' object is not callable\")"


def test_only_errors_raised_in_transport_code_are_a_dropped_connection() -> None:
    race = caught(raiser(STREAMS, NOT_CALLABLE))
    assert transport_race(race) and classify(race) == "transient"
    attr = caught(raiser("/x/redis/asyncio/connection.py", "AttributeError('writelines')"))
    assert transport_race(attr) and classify(attr) == "transient"
    # The same errors from anywhere else are bugs: the worker stops on them.
    mine = caught(raiser("/app/handlers.py", NOT_CALLABLE))
    assert not transport_race(mine) and classify(mine) == "fatal"
    other = caught(raiser(STREAMS, "ValueError('x')"))
    assert not transport_race(other)


def break_next_write(conn: Any) -> list[int]:
    """The connection's next write raises the transport's TypeError (once); the count of
    writes that did."""
    broken: list[int] = []
    real = conn._writer.writelines
    boom = raiser(STREAMS, NOT_CALLABLE)

    def writelines(data: Any) -> None:
        if not broken:
            broken.append(1)
            boom()
        real(data)

    conn._writer.writelines = writelines
    return broken


@pytest.mark.parametrize("retries", [3, 0])
def test_an_asyncio_send_on_a_dropped_transport_is_a_connection_error(
    module_server: RedisProcess, queue_name: str, retries: int
) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(module_server.url, retry=Retry(NoBackoff(), retries))
        q = AsyncQueue(c, queue_name)
        await q.enqueue("t", 0)
        (conn,) = c.connection_pool._available_connections
        broken = break_next_write(conn)
        if retries:
            job = await q.enqueue("t", {"n": 1})  # sent again on a new connection
            assert (await q.get_job(job)).payload() == {"n": 1}
        else:
            with pytest.raises(RedisConnectionError, match="lost while writing"):
                await q.enqueue("t", {"n": 1})
        assert broken == [1] and await c.zcard(q.keys.due) == (2 if retries else 1)
        await c.aclose()

    asyncio.run(main())


def uvloop_closed_write() -> BaseException:
    """The real error uvloop raises for a write on a transport already closed (asyncio's own
    loop drops such a write): what redis-py's send met when a cluster node was killed."""
    import uvloop

    accepted: list[asyncio.StreamWriter] = []

    async def main() -> BaseException:
        server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.close()
        await asyncio.sleep(0.01)  # the close completes: the handle is closed
        try:
            writer.writelines([b"PING\r\n"])
        except BaseException as exc:  # the test inspects it
            return exc
        finally:
            for w in accepted:
                w.close()
            server.close()
            await server.wait_closed()
        raise AssertionError("uvloop accepted a write on a closed transport")

    return uvloop.run(main())


def test_uvloops_write_on_a_closed_transport_is_a_dropped_connection() -> None:
    exc = uvloop_closed_write()
    assert isinstance(exc, RuntimeError) and "closed" in str(exc)
    assert transport_race(exc) and classify(exc) == "transient"
    mine = caught(raiser("/app/handlers.py", "RuntimeError('the handler is closed')"))
    assert not transport_race(mine) and classify(mine) == "fatal"


@pytest.fixture(scope="module")
def tcp_server() -> Iterator[RedisProcess]:
    """TCP, as on the cluster where it was met: uvloop's unix transport took the write."""
    with RedisProcess(require_server("a TCP server"), tcp=True) as server:
        yield server


@pytest.mark.parametrize("retries", [3, 0])
def test_a_send_on_a_transport_uvloop_closed_is_a_connection_error(
    tcp_server: RedisProcess, queue_name: str, retries: int
) -> None:
    # In a child process (tests/workers/uvloop_closed_transport.py): once in CI uvloop's
    # loop.close() never returned after this scenario had passed, and hung the suite.
    child = subprocess.Popen(
        [sys.executable, str(CHILD), tcp_server.tcp_url, queue_name, str(retries)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
    lines = out.splitlines()
    assert lines, f"the scenario did not finish: {err[-2000:]}"
    got = json.loads(lines[0])
    if retries:
        assert got.get("payload") == {"n": 1}, got  # sent again on a new connection
    else:  # ours (uvloop's RuntimeError converted), or redis-py's check when it saw the EOF
        error = got.get("error", "")
        assert "lost while writing" in error or "closed by the server before write" in error, got
    assert got["due"] == (2 if retries else 1)
    if lines[-1] != "closed":  # the scenario held; uvloop's own close hung: said, not hidden
        warnings.warn(
            f"uvloop's loop.close() did not return within 60 s: {err[-500:]}", stacklevel=1
        )


def test_a_cluster_nodes_send_on_a_closed_transport_is_a_connection_error() -> None:
    from scheduler.core import cluster_io

    exc = uvloop_closed_write()

    class Node:  # a cluster node whose pipeline write meets the closed transport
        async def execute_pipeline(self, cmds: Any) -> None:
            raise exc

    with pytest.raises(RedisConnectionError, match="lost while writing") as got:
        asyncio.run(cluster_io._node_async(Node(), [(0, False, ("PING",))], []))
    assert got.value.__cause__ is exc
