"""direct_io's connections: taken from a redis-py pool's list and put back under the pool's
own lock, with the
checks `get_connection` makes (the pid after a fork, connect, data left on the socket or a
closed socket: reconnect) but without redis-py 8's per-call connection-count recorders and
release event: a PING costs 41 us of client CPU that way against 49 through `get_connection` /
`release` (medians of 7 rounds, `python bench/client_overhead.py --rounds 7`; 35 on a
connection held throughout). Only for an exact `ConnectionPool` with no client-side cache, no
maintenance notifications and no credential provider (whose re-authentication rides on the
release event); a connection the pool has to create is taken and given back by the pool's own
calls, so its accounting stays balanced.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def _plain_pool(pool: Any, cls: type[Any]) -> bool:
    """A pool whose connections may be taken from its list directly (see the docstring)."""
    if type(pool) is not cls or getattr(pool, "cache", None) is not None:
        return False
    if pool.connection_kwargs.get("credential_provider") is not None:
        return False
    enabled = getattr(pool, "maint_notifications_enabled", None)
    return not (enabled and enabled())


def take(pool: Any) -> tuple[Any, bool]:
    """A ready connection of the pool, and whether it came from the list (give it back with
    `give`). As `ConnectionPool.get_connection`, without its recorders."""
    if not _plain_pool(pool, redis.ConnectionPool):
        return pool.get_connection(), False
    pool._checkpid()
    with pool._lock:
        if not pool._available_connections:
            conn = None
        else:
            conn = pool._available_connections.pop()
            pool._in_use_connections.add(conn)
    if conn is None:  # the pool makes one, counted by its own recorders
        return pool.get_connection(), False
    try:
        conn.connect()
        try:
            if conn.can_read():  # a reply left unread, or closed by the server
                raise RedisConnectionError("Connection has data")
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise RedisConnectionError("Connection not ready") from None
    except BaseException:
        give(pool, conn, True)
        raise
    return conn, True


def give(pool: Any, conn: Any, listed: bool) -> None:
    if not listed:
        pool.release(conn)
        return
    with pool._lock:
        if conn not in pool._in_use_connections:  # the pool was reset meanwhile (a fork)
            return
        pool._in_use_connections.remove(conn)
        if not pool.owns_connection(conn):
            conn.disconnect()
            return
        if conn.should_reconnect():
            conn.disconnect()
        pool._available_connections.append(conn)


async def take_async(pool: Any) -> tuple[Any, bool]:
    """The asyncio twin of take; `ensure_connection` is the pool's own check."""
    if not _plain_pool(pool, aredis.ConnectionPool):
        return await pool.get_connection(), False
    async with pool._lock:
        if not pool._available_connections:
            conn = None
        else:
            conn = pool._available_connections.pop()
            pool._in_use_connections.add(conn)
    if conn is None:
        return await pool.get_connection(), False
    try:
        await pool.ensure_connection(conn)
    except BaseException:
        await give_async(pool, conn, True)
        raise
    return conn, True


# Put-backs handed to a task after a cancel (referenced until done: the loop keeps weak ones).
_giving: set[asyncio.Task[None]] = set()


async def give_async(pool: Any, conn: Any, listed: bool) -> None:
    if not listed:
        await pool.release(conn)
        return
    try:
        await pool._lock.acquire()
    except asyncio.CancelledError:
        # Cancelled while another task holds the lock (a deadline during a release or
        # disconnect): the put-back goes on in a task, as redis-py 8's release does; skipped,
        # the connection stayed in use for good and 100 of them refused every call.
        task = asyncio.ensure_future(give_async(pool, conn, listed))
        _giving.add(task)
        task.add_done_callback(_giving.discard)
        raise
    try:
        if conn not in pool._in_use_connections:
            return
        pool._in_use_connections.remove(conn)
        try:
            if conn.should_reconnect():
                await conn.disconnect()
        finally:  # a disconnect cancelled part-way: back all the same (it reconnects on use)
            pool._available_connections.append(conn)
    finally:
        pool._lock.release()
