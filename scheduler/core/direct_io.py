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
callbacks that differ between RESP2 and RESP3, and keep execute_command.

Only an exact `redis.Redis` / `redis.asyncio.Redis` without a dedicated single connection is
served here; anything else (a subclass such as fakeredis or an instrumented client, a
single-connection client, a cluster client) goes through its own execute_command. APM tools
that patch execute_command do not see these calls: `SCHEDULER_REDIS_DIRECT=0` turns the path off.
"""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio as aredis

_ENABLED = os.environ.get("SCHEDULER_REDIS_DIRECT", "1") != "0"


def _direct(client: Any, cls: type, cmd: tuple[Any, ...]) -> bool:
    if not _ENABLED or cmd[0] != "EVALSHA" or type(client) is not cls:
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
    if not _direct(client, aredis.Redis, cmd):
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
