"""Several script calls in one round trip on a plain client (direct_io.pipeline_sync/_async):
the same replies as redis-py's `pipeline(transaction=False).execute(raise_on_error=False)`,
without redis-py's pipeline object, and the same bytes on the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.connection import HiredisRespSerializer
from redis.exceptions import NoScriptError, ResponseError

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler.core import direct_io
from tests.redis_server import is_cluster_run
from tests.test_direct_io import _kill_others, _refuse

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="plain clients only (cluster: cluster_io)")

BULK = 2_500  # three script calls of enqueue_many (1,000 jobs each)


def _shape(replies: list[Any]) -> list[Any]:
    return [(type(r).__name__, str(r)) if isinstance(r, Exception) else r for r in replies]


def test_bulk_enqueue_goes_direct_and_every_job_is_stored(
    plain: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue(plain, queue_name)
    q.enqueue("t", 0)  # scripts loaded
    monkeypatch.setattr(plain, "pipeline", _refuse)
    monkeypatch.setattr(plain, "execute_command", _refuse)
    ids = q.enqueue_many([JobSpec("t", {"i": i, "text": "é" * (i % 3)}) for i in range(BULK)])
    monkeypatch.undo()
    assert len(set(ids)) == BULK
    assert plain.zcard(q.keys.due) == BULK + 1
    assert q.get_job(ids[-1]).payload() == {"i": BULK - 1, "text": "é" * ((BULK - 1) % 3)}
    pool = plain.connection_pool
    assert (len(pool._in_use_connections), len(pool._available_connections)) == (0, 1)


def test_replies_and_error_replies_match_redis_py_pipeline(plain: redis.Redis) -> None:
    ok = plain.script_load("return {KEYS[1], ARGV[1], 7}")
    bad = plain.script_load("return redis.error_reply('BAD_ARGUMENT x=1')")
    cmds: list[tuple[Any, ...]] = [
        ("EVALSHA", ok, 1, "k{p}", "a"),
        ("EVALSHA", bad, 0),
        ("EVALSHA", "0" * 40, 0),  # unknown: NOSCRIPT, which Scripts.drive loads and resends
        ("EVALSHA", ok, 1, "k{p}", "é"),
        ("WAIT", 0, 0),
    ]
    with plain.pipeline(transaction=False) as pipe:
        for cmd in cmds:
            pipe.execute_command(*cmd)  # type: ignore[no-untyped-call]
        expected = pipe.execute(raise_on_error=False)
    got = direct_io.pipeline_sync(plain, cmds)
    assert _shape(got) == _shape(expected)
    assert isinstance(got[1], ResponseError) and isinstance(got[2], NoScriptError)
    assert got[3] == [b"k{p}", "é".encode(), 7] and got[4] == 0


def test_other_commands_keep_redis_py_parsing(plain: redis.Redis, queue_name: str) -> None:
    key = f"{queue_name}:h"
    plain.hset(key, "f", "v")
    replies = direct_io.pipeline_sync(plain, [("HGETALL", key), ("EXISTS", key)])
    assert replies == [{b"f": b"v"}, 1]  # HGETALL's callback made the dict
    plain.delete(key)


def test_packed_bytes_are_redis_py_own() -> None:
    # What redis-py sends with hiredis installed (redis[hiredis] is a declared dependency):
    # its HiredisRespSerializer, strings as UTF-8 whatever the client's encoding. Compared
    # with that serializer itself, not with a pool's connection: in one CI run a connection
    # of a latin-1 client packed with the pure-Python serializer instead (cause not found).
    cmd: list[Any] = [
        "EVALSHA",
        "a" * 40,
        2,
        "sched:{q}:",
        "sched:{q}:due",
        "1",
        0,
        -5,
        "é \x00 x",
        1.5,
    ]
    serializer: Any = HiredisRespSerializer  # untyped in some redis-py releases (8.2)
    theirs: list[bytes] = serializer().pack(*cmd)
    assert b"".join(direct_io._pack(tuple(cmd))) == b"".join(theirs)


def test_a_dropped_connection_is_replaced_before_a_bulk_enqueue(
    redis_url: str, queue_name: str
) -> None:
    c = redis.Redis.from_url(redis_url, client_name="direct-pipe-drop")
    q = Queue(c, queue_name)
    q.enqueue("t", 0)
    assert _kill_others(redis_url, "direct-pipe-drop") == 1
    ids = q.enqueue_many([JobSpec("t", i) for i in range(BULK)])
    assert c.zcard(q.keys.due) == BULK + 1 and len(ids) == BULK
    c.close()


def test_asyncio_bulk_enqueue_goes_direct(redis_url: str, queue_name: str) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(redis_url)
        q = AsyncQueue(c, queue_name)
        await q.enqueue("t", 0)
        c.pipeline = _refuse  # type: ignore[method-assign]
        c.execute_command = _refuse  # type: ignore[method-assign]
        ids = await q.enqueue_many([JobSpec("t", {"i": i}) for i in range(BULK)])
        del c.pipeline, c.execute_command
        assert len(set(ids)) == BULK
        assert await c.zcard(q.keys.due) == BULK + 1
        assert (await q.get_job(ids[0])).payload() == {"i": 0}
        bad = await c.script_load("return redis.error_reply('BAD_ARGUMENT y=2')")
        got = await direct_io.pipeline_async(c, [("EVALSHA", bad, 0), ("WAIT", 0, 0)])
        assert isinstance(got[0], ResponseError) and "y=2" in str(got[0]) and got[1] == 0
        assert len(c.connection_pool._in_use_connections) == 0
        await c.aclose()

    asyncio.run(main())


SLOW_SCRIPT = (  # busy ~300 ms: its reply cannot have arrived when the connection is next used
    "local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2]; "
    "while true do local n = redis.call('TIME'); "
    "if n[1] * 1000000 + n[2] - s > 300000 then break end end; return 'slow-reply'"
)


def test_an_interrupt_before_the_replies_leaves_none_to_come(
    plain: redis.Redis, queue_name: str
) -> None:
    """redis-py's pool reconnects a connection handed out with data waiting, but not one whose
    reply is still to come: the pipeline disconnects on any exception itself."""
    echo, slow = plain.script_load("return ARGV[1]"), plain.script_load(SLOW_SCRIPT)
    plain.set(queue_name, "before")
    assert direct_io.pipeline_sync(plain, [("EVALSHA", echo, 0, "warm")]) == [b"warm"]
    (conn,) = plain.connection_pool._available_connections

    def interrupted(*a: Any, **k: Any) -> Any:
        raise KeyboardInterrupt  # before the first reply: the slow script is still running

    conn.read_response = interrupted
    with pytest.raises(KeyboardInterrupt):
        direct_io.pipeline_sync(plain, [("EVALSHA", slow, 0), ("EVALSHA", echo, 0, "a")])
    del conn.read_response
    assert plain.get(queue_name) == b"before"
    assert direct_io.call_sync(plain, ("EVALSHA", echo, 0, "e")) == b"e"
    plain.delete(queue_name)


def test_an_empty_pipeline_answers_nothing_and_gives_its_connection_back(
    plain: redis.Redis, redis_url: str
) -> None:
    """A read of no ids (a dead filter matching nothing) is a pipeline of no command: it
    answers [] (the WAIT check once read past the end of it: an IndexError in every CLI bulk
    command whose filter matched nothing)."""
    assert direct_io.pipeline_sync(plain, []) == []
    assert direct_io.pipeline_sync(plain, [("ECHO", "x")]) == [b"x"]

    async def main() -> None:
        c = aredis.Redis.from_url(redis_url)
        try:
            assert await direct_io.pipeline_async(c, []) == []
            assert len(c.connection_pool._in_use_connections) == 0
        finally:
            await c.aclose()

    asyncio.run(main())
