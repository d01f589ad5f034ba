"""One command on a plain redis-py client's pooled connection, without execute_command's layers.

redis-py 8 wraps every command in observability hooks (timers, per-call metric recorders,
argument filtering, pool-name lookups): 25-30 us of client CPU per call here, more than the
rest of a single enqueue (docs/performance.md section 13). The driver's single calls go
straight to a connection of the client's own pool instead, under the same retry object
(`conn.retry`: a dropped connection is disconnected and the command sent again exactly as
execute_command would), so pooling, AUTH/ACL, TLS, timeouts and retries stay redis-py's.

Only an exact `redis.Redis` / `redis.asyncio.Redis` without a single dedicated connection is
served here; anything else (a subclass such as fakeredis, a single-connection client, a cluster
client) goes through its own execute_command.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis


def _direct(client: Any, cls: type) -> bool:
    return type(client) is cls and getattr(client, "connection", None) is None


def call_sync(client: Any, cmd: tuple[Any, ...]) -> Any:
    """`client.execute_command(*cmd)`; a reply error is raised (a ResponseError subclass)."""
    if not _direct(client, redis.Redis):
        return client.execute_command(*cmd)
    pool = client.connection_pool
    conn = pool.get_connection()

    def send() -> Any:
        conn.send_command(*cmd)
        return conn.read_response()

    try:
        return conn.retry.call_with_retry(send, lambda _error: conn.disconnect())
    finally:
        pool.release(conn)


async def call_async(client: Any, cmd: tuple[Any, ...]) -> Any:
    """`await client.execute_command(*cmd)`, the asyncio twin of call_sync."""
    if not _direct(client, aredis.Redis):
        return await client.execute_command(*cmd)
    pool = client.connection_pool
    conn = await pool.get_connection()

    async def send() -> Any:
        await conn.send_command(*cmd)
        return await conn.read_response()

    async def fail(_error: BaseException) -> None:
        await conn.disconnect()

    try:
        return await conn.retry.call_with_retry(send, fail)
    finally:
        await pool.release(conn)
