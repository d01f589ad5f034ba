"""A write on an asyncio connection the peer closed (or a concurrent disconnect closed) raises
AttributeError / TypeError from the transport's torn-down internals on some Pythons (redis-py
issues 3546, 4287). direct_io turns it into redis-py's ConnectionError (the call's retry
applies) and the worker classifies it as transient, never as a bug that stops the worker. The
transport's error is simulated by code compiled under asyncio's file name, as the real one's
innermost frame is. A private server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import AsyncQueue
from scheduler.core.direct_io import transport_race
from scheduler.worker.execution import classify
from tests.redis_server import RedisProcess


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
