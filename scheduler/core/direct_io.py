"""The driver's script calls on a plain redis-py client's pooled connection, without
execute_command's layers.

redis-py 8 wraps every command in observability hooks (timers, per-call metric recorders,
argument filtering, pool-name lookups): a PING costs 63 us of client CPU through
execute_command and 50 us on a pooled connection taken directly (medians of 7 rounds,
`python bench/client_overhead.py`; docs/performance.md section 13). The driver's single
EVALSHA calls go straight to a connection of the client's own pool, under the same retry object
(`conn.retry`: a dropped connection is disconnected and the command sent again, as
execute_command does), so pooling, AUTH/ACL, TLS, timeouts and retries stay redis-py's. Only
EVALSHA: it has no response callback in any redis-py version or protocol, so the raw reply is
what execute_command would return; other commands (HGETALL, ZSCORE, SMEMBERS ...) are parsed by
callbacks that differ between RESP2 and RESP3, and keep execute_command. A pipeline of EVALSHA
calls (and the WAIT after them, whose integer reply has no callback either) goes the same way
(`pipeline_sync` / `pipeline_async`): all packed first (one that cannot be packed sends none, as
redis-py's pipeline), sent, and every reply read, an error reply as a value, as redis-py's
`pipe.execute(raise_on_error=False)` answers (bulk enqueue +16%, docs/performance.md section
17). A pipeline holding WAITs reads under the socket timeout plus the longest WAIT's
(`_wait_read_s`).

Commands are packed with hiredis (a declared dependency), the bytes redis-py's own packer sends
with hiredis installed, without its per-argument type checks in Python (~3 us of a 23-argument
EVALSHA).

The connection is taken from the pool's list and put back by `direct_pool.py`, without
redis-py 8's per-call connection-count recorders.

On asyncio, redis-py sends every command inside `asyncio.wait_for` when the connection has a
socket timeout (redis-py 8's default: 5 s), a new Task per send on Python 3.11. A send that
cannot wait (an empty transport buffer, a command under its high-water mark: `drain` returns at
once) goes without it: `AsyncQueue.enqueue` -13 to -20% wall, -23 to -28% CPU per call
(`python bench/single_call_ab.py`, docs/performance.md section 19). Every other send keeps the
timeout.

Only an exact `redis.Redis` / `redis.asyncio.Redis` without a dedicated single connection is
served here; anything else (a subclass such as fakeredis or an instrumented client, a
single-connection client, a cluster client) goes through its own execute_command. APM tools
that patch execute_command do not see these calls: `SCHEDULER_REDIS_DIRECT=0` turns the path off.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from hiredis import pack_command as _hiredis_pack  # redis[hiredis]: a declared dependency
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from scheduler.core.direct_pool import give, give_async, take, take_async

_ENABLED = os.environ.get("SCHEDULER_REDIS_DIRECT", "1") != "0"
_RAW_REPLIES = frozenset(("EVALSHA", "WAIT"))  # no response callback in any redis-py


def _direct(client: Any, cls: type, cmd: tuple[Any, ...]) -> bool:
    return _client_ok(client, cls) and cmd[0] == "EVALSHA"


def _direct_pipeline(client: Any, cls: type, cmds: Sequence[tuple[Any, ...]]) -> bool:
    return _client_ok(client, cls) and all(c[0] in _RAW_REPLIES for c in cmds)


def _client_ok(client: Any, cls: type) -> bool:
    if not _ENABLED or type(client) is not cls:
        return False
    # The asyncio client sets .connection only once initialised: read the flag itself.
    single = getattr(client, "single_connection_client", None)
    if single is None:
        single = getattr(client, "_single_connection_client", False)
    return not single and getattr(client, "connection", None) is None


def call_sync(client: Any, cmd: tuple[Any, ...]) -> Any:
    """`client.execute_command(*cmd)`; a reply error is raised (a ResponseError subclass)."""
    if not _direct(client, redis.Redis, cmd):
        return client.execute_command(*cmd)
    pool = client.connection_pool
    conn, listed = take(pool)

    def send() -> Any:
        conn.send_packed_command(_pack(cmd))
        return conn.read_response()

    try:
        return conn.retry.call_with_retry(send, lambda _error: conn.disconnect())
    except ResponseError:
        raise  # an error reply, read whole: the connection is in step
    except BaseException:
        # Interrupted between the send and the reply (a signal handler's KeyboardInterrupt or
        # SystemExit): its reply, still to come, must not be read as the next call's (a
        # counts() read an enqueue's). pipeline_sync does the same.
        conn.disconnect()
        raise
    finally:
        give(pool, conn, listed)


def pipeline_sync(client: Any, cmds: Sequence[tuple[Any, ...]]) -> list[Any]:
    """`client.pipeline(transaction=False)` of cmds, `execute(raise_on_error=False)`: each
    reply, an error reply as its exception. A dropped connection sends them all again, as
    redis-py's pipeline does (retry object permitting); any other exception on the way
    disconnects, so no reply left unread reaches the connection's next user."""
    if not _direct_pipeline(client, redis.Redis, cmds):
        with client.pipeline(transaction=False) as pipe:
            for cmd in cmds:
                pipe.execute_command(*cmd)
            return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]
    packed = [chunk for cmd in cmds for chunk in _pack(cmd)]  # one that cannot be: none sent
    pool = client.connection_pool
    conn, listed = take(pool)
    wait_s = _wait_read_s(conn, cmds)

    def send() -> list[Any]:
        out: list[Any] = []
        sock, before = None, None
        try:
            conn.send_packed_command(packed)
            if wait_s is not None and conn._sock is not None:  # connected by the send
                sock, before = conn._sock, conn._sock.gettimeout()
                sock.settimeout(wait_s)
            for _ in cmds:
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:
                    out.append(exc)
        except BaseException:
            # An interrupt between two reads: replies still to come must not reach the
            # connection's next user (the pool's check sees only those already arrived).
            conn.disconnect()
            raise
        finally:
            if sock is not None and conn._sock is sock:
                sock.settimeout(before)
        return out

    try:
        return conn.retry.call_with_retry(send, lambda _error: conn.disconnect())  # type: ignore[no-any-return]
    finally:
        give(pool, conn, listed)


def _wait_read_s(conn: Any, cmds: Sequence[tuple[Any, ...]]) -> float | None:
    """The read timeout of a pipeline holding ("WAIT", replicas, timeout_ms) commands (one per
    queue's writes: a partitioned enqueue_many sends one per partition): the connection's
    socket timeout plus the longest WAIT's, so that a replica that does not answer is WAIT's
    reply (fewer acknowledgements: NotDurable with the ids), not a TimeoutError after which
    redis-py's retry sent the writes and the WAIT again. None: the connection's own timeout
    stands (no WAIT, no timeout, or WAITs without a bound, which no read timeout could cover)."""
    waits = [int(c[2]) for c in cmds if c[0] == "WAIT"]
    base = conn.socket_timeout
    return base + max(waits) / 1000 if waits and base and max(waits) > 0 else None


def _pack(cmd: tuple[Any, ...]) -> list[bytes]:
    # What redis-py's own packer sends when hiredis is installed (HiredisRespSerializer, strings
    # as UTF-8 whatever the client's encoding), without its per-argument checks in Python;
    # an argument it cannot encode is redis-py's DataError, as there. Only str and bytes reach
    # hiredis: it turns a number into text with a call that runs pending signal handlers, and
    # one that raises there (Ctrl-C, a SIGTERM handler's sys.exit) crashed the interpreter
    # (SIGSEGV in hiredis 3.5's pack_command). The scripts' calls (Scripts.evalsha) are all str.
    if cmd[0] != "EVALSHA":
        cmd = tuple(a if type(a) is str or type(a) is bytes else _text(a) for a in cmd)
    try:
        return [_hiredis_pack(cmd)]
    except TypeError as exc:
        raise DataError(str(exc)) from exc


def _text(value: Any) -> Any:
    """A number as redis-py's encoder writes it (int: str, float: repr); anything else as it
    is, for hiredis to refuse (a DataError below)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return repr(value) if isinstance(value, float) else str(value)


# Where a write on an asyncio connection the peer closed (or a concurrent disconnect closed)
# raises AttributeError / TypeError from the transport's torn-down internals instead of an
# OSError, on some Pythons (redis-py issues 3546, 4287), or uvloop's RuntimeError "the handler
# is closed" (asyncio's own loop drops such a write; uvloop raises): the frames it ends in.
_TRANSPORT_FILES = ("asyncio/streams.py", "asyncio/selector_events.py", "asyncio/sslproto.py",
                    "redis/asyncio/connection.py", "uvloop/handles/handle.pyx",
                    "uvloop/handles/stream.pyx")  # fmt: skip
_RACE_TYPES = (AttributeError, TypeError, RuntimeError)


def transport_race(exc: BaseException) -> bool:
    """An AttributeError / TypeError / RuntimeError raised inside asyncio's, uvloop's or
    redis-py's connection code: a dropped connection, not a bug of the caller's."""
    if not isinstance(exc, _RACE_TYPES) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(_TRANSPORT_FILES)


async def _send_async(conn: Any, packed: list[bytes]) -> None:
    try:
        await _send_async_raw(conn, packed)
    except _RACE_TYPES as exc:
        if not transport_race(exc):
            raise
        # As redis-py's own OSError path: the connection is dropped, the error is its
        # ConnectionError, so the call's retry (and the worker's backoff) applies.
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(f"Connection lost while writing: {exc!r}") from exc


async def _send_async_raw(conn: Any, packed: list[bytes]) -> None:
    """`conn.send_packed_command(packed)`, without its `asyncio.wait_for` (on Python 3.11 a new
    Task per send, ~10 us) when the write cannot wait: the transport's buffer is empty and the
    command fits under its high-water mark, so the bytes go to the socket or the buffer at once
    and `drain` returns without pausing. The socket timeout stays for every other send."""
    writer = getattr(conn, "_writer", None)
    if conn.socket_timeout and writer is not None:
        transport = writer.transport
        if (
            transport.get_write_buffer_size() == 0
            and sum(map(len, packed)) <= transport.get_write_buffer_limits()[1]
        ):
            await conn.check_health()  # its PING (health_check_interval) under the timeout
            timeout, conn.socket_timeout = conn.socket_timeout, None
            try:
                await conn.send_packed_command(packed, check_health=False)
            finally:
                conn.socket_timeout = timeout
            return
    await conn.send_packed_command(packed)


async def call_async(client: Any, cmd: tuple[Any, ...]) -> Any:
    """`await client.execute_command(*cmd)`, the asyncio twin of call_sync."""
    if not _direct(client, aredis.Redis, cmd):
        return await client.execute_command(*cmd)
    pool = client.connection_pool
    conn, listed = await take_async(pool)

    async def send() -> Any:
        await _send_async(conn, _pack(cmd))
        return await conn.read_response()

    async def fail(_error: BaseException) -> None:
        await conn.disconnect()

    try:
        return await conn.retry.call_with_retry(send, fail)
    finally:
        await give_async(pool, conn, listed)


async def pipeline_async(client: Any, cmds: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The asyncio twin of pipeline_sync. redis.asyncio's own pipeline, when used, is always
    reset (async with), also when the connection drops mid-call: one left holding a
    connection warns at GC."""
    if not _direct_pipeline(client, aredis.Redis, cmds):
        async with client.pipeline(transaction=False) as pipe:
            for cmd in cmds:
                pipe.execute_command(*cmd)
            return await pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]
    packed = [chunk for cmd in cmds for chunk in _pack(cmd)]
    pool = client.connection_pool
    conn, listed = await take_async(pool)
    wait_s = _wait_read_s(conn, cmds)

    async def send() -> list[Any]:
        out: list[Any] = []
        before = conn.socket_timeout
        try:
            await _send_async(conn, packed)
            # As pipeline_sync (not read_response(timeout=): a read past it answers None).
            if wait_s is not None:
                conn.socket_timeout = wait_s
            for _ in cmds:
                try:
                    out.append(await conn.read_response())
                except ResponseError as exc:
                    out.append(exc)
        except BaseException:  # as pipeline_sync
            await conn.disconnect(nowait=True)
            raise
        finally:
            if wait_s is not None:
                conn.socket_timeout = before
        return out

    async def fail(_error: BaseException) -> None:
        await conn.disconnect()

    try:
        return await conn.retry.call_with_retry(send, fail)  # type: ignore[no-any-return]
    finally:
        await give_async(pool, conn, listed)
