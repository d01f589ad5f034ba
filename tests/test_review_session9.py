"""Review of 12a674d (storage-generation guard), e75411e (queue index) and ce99fef (sync
results encoded in the handler thread): each test failed before its fix."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis

from scheduler import NewerStorage, Queue
from scheduler.admin.startup import check_access_async


def _python_refuses(redis_url: str, queue: str) -> bool:
    async def go() -> bool:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await check_access_async(client, [queue])
        except NewerStorage:
            return True
        finally:
            await client.aclose()
        return False

    return asyncio.run(go())


@pytest.mark.parametrize("value", ["00000002", "0000000000000002", "0000002", "02", "1000001"])
def test_lua_and_the_worker_start_read_a_generation_alike(
    client: redis.Redis, redis_url: str, q: Queue, value: str
) -> None:
    """Before: the scripts read '00000002' as generation 2 and refused every call while
    `scheduler worker` (and the doctor) read it as no generation: the worker started on a
    queue it could never claim from. Now a value the Python side does not read as a
    generation (over 7 digits) refuses nothing in Lua either."""
    client.hset(q.keys.config, "generation", value)
    try:
        q.enqueue("echo", None)
        lua_refuses = False
    except NewerStorage:
        lua_refuses = True
    assert lua_refuses == _python_refuses(redis_url, q.name)
