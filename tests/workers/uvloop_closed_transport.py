"""Child of tests/test_transport_race.py: a write on a connection whose transport uvloop closed,
in a process of its own. In one CI run the scenario passed and then uvloop's `loop.close()`
never returned (its loop run waited in epoll for a handle that never closed), which hung the
whole suite; here the test kills the child instead and says so.

    python tests/workers/uvloop_closed_transport.py <redis url> <queue> <retries>

Prints one JSON line (what the second enqueue did, the due count), then `closed`."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import redis.asyncio as aredis
import uvloop
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import AsyncQueue
from scheduler.core import direct_io


async def scenario(url: str, queue: str, retries: int) -> dict[str, Any]:
    c = aredis.Redis.from_url(url, retry=Retry(NoBackoff(), retries))
    q = AsyncQueue(c, queue)
    await q.enqueue("t", 0)
    (conn,) = c.connection_pool._available_connections
    writer = conn._writer
    assert writer is not None
    writer.transport.close()  # as the peer's close does, under redis-py's feet
    # The handle's close completes; most often the EOF has not reached redis-py's reader yet,
    # so the write meets uvloop's closed handle. If it has, redis-py's own check refuses the
    # write first ("closed by the server before write"): a ConnectionError as well.
    await asyncio.sleep(0.01)
    out: dict[str, Any] = {}
    try:
        if retries:  # through the pool: the call is sent again on a new connection
            job = await q.enqueue("t", {"n": 1})
            out["payload"] = (await q.get_job(job)).payload()
        else:
            # On the connection itself: the pool's checkout may already see the close and
            # reconnect (it did in one CI run), and then no write meets the closed transport.
            await direct_io._send_async(conn, direct_io._pack(("PING",)))
            out["sent"] = True
    except RedisConnectionError as exc:
        out["error"] = str(exc)
    out["due"] = await c.zcard(q.keys.due)
    await c.aclose()
    return out


def main() -> None:
    url, queue, retries = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loop = uvloop.new_event_loop()
    print(json.dumps(loop.run_until_complete(scenario(url, queue, retries))), flush=True)
    loop.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
