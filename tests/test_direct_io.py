"""The driver's single calls on a plain client's pooled connection (scheduler.core.direct_io):
redis-py's execute_command is not on that path, and its pool, retry and errors still are."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler import AsyncQueue, JobNotFound, Queue
from scheduler.core import direct_io
from tests.redis_server import RedisProcess, is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="plain clients only (cluster: cluster_io)")


@pytest.fixture
def name() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def _refuse(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("execute_command was called")


def _kill_others(redis_url: str, client_name: str) -> int:
    with redis.Redis.from_url(redis_url) as admin:
        killed = 0
        for c in admin.client_list():
            if c.get("name") == client_name:
                admin.client_kill_filter(_id=c["id"])
                killed += 1
        return killed


def test_a_plain_client_does_not_go_through_execute_command(
    plain: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue(plain, name)
    job_id = q.enqueue("t", {"a": 1})  # the scripts are loaded (SCRIPT LOAD) before the patch
    with pytest.raises(JobNotFound):
        q.cancel("nope")
    with monkeypatch.context() as m:
        m.setattr(plain, "execute_command", _refuse)
        other = q.enqueue("t", {"a": 2})
        with pytest.raises(JobNotFound):  # a reply error still comes back typed
            q.cancel("nope")
    assert q.get_job(other).payload() == {"a": 2}
    assert q.get_job(job_id).payload() == {"a": 1}


def test_a_subclass_and_a_single_connection_client_keep_execute_command(redis_url: str) -> None:
    class Traced(redis.Redis):
        calls = 0

        def execute_command(self, *args: Any, **options: Any) -> Any:
            Traced.calls += 1
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    traced = Traced.from_url(redis_url)
    assert direct_io.call_sync(traced, ("PING",)) is True
    assert Traced.calls == 1
    traced.close()
    single = redis.Redis.from_url(redis_url, single_connection_client=True)
    seen: list[tuple[Any, ...]] = []
    orig: Any = single.execute_command

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(a)
        return orig(*a, **k)

    single.execute_command = spy  # type: ignore[method-assign]
    assert direct_io.call_sync(single, ("PING",)) is True
    assert seen == [("PING",)]
    single.close()


def test_a_dropped_connection_is_replaced(redis_url: str, name: str) -> None:
    c = redis.Redis.from_url(redis_url, client_name="direct-io-retry")
    q = Queue(c, name)
    q.enqueue("t", 1)
    assert _kill_others(redis_url, "direct-io-retry") >= 1  # the pooled connection is dead now
    job_id = q.enqueue("t", 2)  # a new connection (the pool's check on checkout), no error
    assert q.get_job(job_id).payload() == 2
    c.close()


def test_the_call_runs_under_the_connections_own_retry(redis_url: str, name: str) -> None:
    class Counting(Retry):
        calls = 0

        def call_with_retry(self, do: Any, fail: Any, *a: Any, **k: Any) -> Any:
            Counting.calls += 1
            return super().call_with_retry(do, fail, *a, **k)

    c = redis.Redis.from_url(redis_url, retry=Counting(NoBackoff(), 2))
    q = Queue(c, name)
    q.enqueue("t", 1)
    before = Counting.calls
    q.enqueue("t", 2)
    assert Counting.calls > before
    c.close()


def test_connections_go_back_to_the_pool(plain: redis.Redis, name: str) -> None:
    q = Queue(plain, name)
    for i in range(50):
        q.enqueue("t", i)
    pool = plain.connection_pool
    assert len(pool._in_use_connections) == 0
    assert len(pool._available_connections) == 1


def test_asyncio_twin(redis_url: str, name: str) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(redis_url, client_name="direct-io-async")
        q = AsyncQueue(c, name)
        first = await q.enqueue("t", {"n": 1})
        with pytest.raises(JobNotFound):
            await q.cancel("nope")  # loads its script before the patch
        real = c.execute_command
        c.execute_command = _refuse  # type: ignore[method-assign]
        second = await q.enqueue("t", {"n": 2})
        with pytest.raises(JobNotFound):
            await q.cancel("nope")
        c.execute_command = real  # type: ignore[method-assign]
        assert (await q.get_job(second)).payload() == {"n": 2}
        assert (await q.get_job(first)).payload() == {"n": 1}
        assert len(c.connection_pool._in_use_connections) == 0
        await c.aclose()

    asyncio.run(main())


def test_asyncio_a_dropped_connection_fails_as_execute_command_does(redis_url: str) -> None:
    """redis.asyncio does not notice a connection the server closed until it writes to it;
    the direct path must answer exactly as execute_command (a subclass takes that path)."""

    class ViaExecute(aredis.Redis):
        pass

    async def outcomes(cls: type[aredis.Redis], tag: str) -> list[str]:
        c = cls.from_url(redis_url, client_name=tag)
        q = AsyncQueue(c, "t-" + uuid.uuid4().hex[:12])
        await q.enqueue("t", 1)
        _kill_others(redis_url, tag)
        seen = []
        for i in range(2):
            try:
                await q.enqueue("t", i)
                seen.append("ok")
            except redis.ConnectionError:
                seen.append("ConnectionError")
        await c.aclose()
        return seen

    direct = asyncio.run(outcomes(aredis.Redis, "direct-io-a1"))
    via = asyncio.run(outcomes(ViaExecute, "direct-io-a2"))
    assert direct == via
    assert direct[-1] == "ok"  # the call after the failed one has a new connection


# redis-py 7.x cannot open a RESP3 connection over a unix socket (maintenance notifications
# want a host): the lowest-redis CI stage runs this file with RESP2 only, the main run (8.x)
# with both.
_RESP3_OK = int(redis.__version__.split(".")[0]) >= 8


@pytest.mark.parametrize(
    "protocol", [2, pytest.param(3, marks=pytest.mark.skipif(not _RESP3_OK, reason="redis-py 7"))]
)
def test_only_evalsha_goes_direct_other_replies_keep_their_parsing(
    redis_url: str, protocol: int
) -> None:
    """Review: HGETALL / ZSCORE / SMEMBERS replies are shaped by redis-py's callbacks (RESP2
    gives HGETALL as a flat list); only EVALSHA, which has no callback, skips execute_command."""
    c = redis.Redis.from_url(redis_url, protocol=protocol, decode_responses=True)
    key = "t-" + uuid.uuid4().hex[:12]
    c.hset(key, mapping={"a": "1"})
    c.zadd(key + "z", {"m": 2})
    c.sadd(key + "s", "x")
    try:
        assert direct_io.call_sync(c, ("HGETALL", key)) == {"a": "1"}
        assert direct_io.call_sync(c, ("ZSCORE", key + "z", "m")) == 2.0
        assert direct_io.call_sync(c, ("SMEMBERS", key + "s")) == {"x"}
    finally:
        c.delete(key, key + "z", key + "s")
        c.close()


def test_asyncio_single_connection_client_keeps_its_one_connection(redis_url: str) -> None:
    """Review: an asyncio single-connection client has no .connection until initialised."""

    async def main() -> int:
        c = aredis.Redis.from_url(redis_url, single_connection_client=True)
        sha = await c.script_load("return 1")
        await asyncio.gather(*(direct_io.call_async(c, ("EVALSHA", sha, 0)) for _ in range(5)))
        made = len(c.connection_pool._available_connections) + len(
            c.connection_pool._in_use_connections
        )
        await c.aclose()
        return made

    assert asyncio.run(main()) <= 1


def test_the_direct_path_can_be_turned_off(
    plain: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = plain.script_load("return 7")
    seen: list[tuple[Any, ...]] = []
    orig: Any = plain.execute_command

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(a)
        return orig(*a, **k)

    monkeypatch.setattr(direct_io, "_ENABLED", False)
    monkeypatch.setattr(plain, "execute_command", spy)
    assert direct_io.call_sync(plain, ("EVALSHA", sha, 0)) == 7
    assert seen == [("EVALSHA", sha, 0)]


# -- a failure between send and read: the server closes the connection while the call waits -----
# Both on the file's private server (module_server): they reconfigure or pause it.

_BIG_ONCE = """local n = redis.call('INCR', KEYS[1])
if n == 1 then return string.rep('x', tonumber(ARGV[1])) end
return n"""
_MB = 1024 * 1024


@pytest.fixture
def admin(module_server: RedisProcess) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(module_server.url)
    limit = c.config_get("client-output-buffer-limit")["client-output-buffer-limit"]
    assert isinstance(limit, str)
    # A normal client whose pending reply passes 1 MB is closed by the server, at once: the
    # script has run, its reply is never sent (a real reply lost after the fact).
    c.config_set("client-output-buffer-limit", f"normal {_MB} 0 0")
    yield c
    c.config_set("client-output-buffer-limit", limit)
    c.close()


def _lost_reply(url: str, retries: int) -> tuple[redis.Redis, str, str]:
    c = redis.Redis.from_url(url, retry=Retry(NoBackoff(), retries))
    sha = c.script_load(_BIG_ONCE)
    c.execute_command = _refuse  # type: ignore[method-assign]  # the direct path only
    return c, sha, "t-" + uuid.uuid4().hex[:12]


def test_a_reply_lost_after_the_script_ran_is_resent_and_the_script_runs_twice(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    """The retry resends the EVALSHA on a new connection, so a script whose reply was lost runs
    again (at least once, as redis-py's execute_command does): the driver's scripts make that
    safe (enqueue finds the ids it made, claim replays by nonce), a script of a user's would not."""
    c, sha, key = _lost_reply(module_server.url, retries=1)
    assert direct_io.call_sync(c, ("EVALSHA", sha, 1, key, 2 * _MB)) == 2  # the second run's
    assert admin.get(key) == b"2"  # the first run did happen: its reply was the one lost
    pool = c.connection_pool
    assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 1
    assert direct_io.call_sync(c, ("EVALSHA", sha, 1, key, 0)) == 3  # the pooled one works
    del c.execute_command
    # execute_command, on the same server, answers the same way
    other = "t-" + uuid.uuid4().hex[:12]
    assert c.execute_command("EVALSHA", sha, 1, other, 2 * _MB) == 2  # type: ignore[no-untyped-call]
    assert admin.get(other) == b"2"
    c.close()


def test_a_reply_lost_without_retries_is_a_connection_error_and_the_pool_recovers(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    c, sha, key = _lost_reply(module_server.url, retries=0)
    with pytest.raises(redis.ConnectionError):
        direct_io.call_sync(c, ("EVALSHA", sha, 1, key, 2 * _MB))
    assert admin.get(key) == b"1"  # it ran, once: the caller cannot tell from the error
    pool = c.connection_pool
    assert len(pool._in_use_connections) == 0
    assert all(conn._sock is None for conn in pool._available_connections)  # not kept open
    assert direct_io.call_sync(c, ("EVALSHA", sha, 1, key, 0)) == 2  # a new connection
    c.close()


def test_a_connection_killed_before_its_script_ran_runs_it_once(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    """CLIENT PAUSE WRITE holds the EVALSHA the server has read; CLIENT KILL (not a write, so
    not paused) then closes that connection with the command unrun. The resend runs it once."""
    c = redis.Redis.from_url(module_server.url, retry=Retry(NoBackoff(), 1))
    sha = c.script_load("return redis.call('INCR', KEYS[1])")
    key = "t-" + uuid.uuid4().hex[:12]
    first = c.client_id()
    killed: list[int] = []

    def kill_when_held() -> None:
        try:
            for _ in range(300):  # bounded: ~3 s for the EVALSHA to wait on the pause
                held = [
                    x for x in admin.client_list() if x["id"] == str(first) and "b" in x["flags"]
                ]
                if held:
                    killed.append(admin.client_kill_filter(_id=str(first)))
                    return
                time.sleep(0.01)
        finally:
            admin.client_unpause()

    admin.client_pause(10_000, all=False)  # WRITE: until the killer unpauses
    killer = threading.Thread(target=kill_when_held)
    killer.start()
    try:
        c.execute_command = _refuse  # type: ignore[method-assign]
        reply = direct_io.call_sync(c, ("EVALSHA", sha, 1, key))
    finally:
        killer.join()
        del c.execute_command
    assert killed == [1]  # the held connection was the one killed
    assert reply == 1 and admin.get(key) == b"1"  # run once, on the new connection
    assert c.client_id() != first
    c.close()


@pytest.mark.parametrize("retries", [0, 1])
def test_asyncio_a_lost_reply_is_resent_or_a_connection_error(
    module_server: RedisProcess, admin: redis.Redis, retries: int
) -> None:
    """call_async, the same two outcomes: the second run's reply, or ConnectionError."""

    async def main() -> tuple[object, int]:
        c = aredis.Redis.from_url(module_server.url, retry=AsyncRetry(NoBackoff(), retries))
        sha = await c.script_load(_BIG_ONCE)
        key = "t-" + uuid.uuid4().hex[:12]
        c.execute_command = _refuse  # type: ignore[method-assign]
        try:
            got: object = await direct_io.call_async(c, ("EVALSHA", sha, 1, key, 2 * _MB))
        except redis.ConnectionError:
            got = "ConnectionError"
        assert len(c.connection_pool._in_use_connections) == 0
        after = await direct_io.call_async(c, ("EVALSHA", sha, 1, key, 0))
        assert admin.get(key) == str(after).encode()
        await c.aclose()
        return got, after

    expected = (2, 3) if retries else ("ConnectionError", 2)  # the script ran before each reply
    assert asyncio.run(main()) == expected
