"""scripts.run_one_sync / run_one_async, the queues' one call path: a single script call on a
plain client is sent straight, without the driver's batch (issue 16, single enqueue), and keeps
the driver's answers: a NOSCRIPT reply goes through the driver (load, send again) and an error
reply is raised translated. A private server: SCRIPT FLUSH is not for a shared one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, Queue
from scheduler.core.errors import BadArgument
from scheduler.core.scripts import Scripts
from scheduler.operations.requests import Script
from tests.redis_server import RedisProcess

# One enqueue.lua job whose id the script refuses (the client's checks are bypassed).
BAD_ID = Script(
    "enqueue",
    ["1", "bad id!", "t", "1", "in", "0", "5", "1000,2.0,3600000,0.25", "0", "", "86400000",
     "", "", ""],
)  # fmt: skip


def count_drives(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of requests of each Scripts.drive call from now on."""
    calls: list[int] = []
    real = Scripts.drive

    def drive(self: Scripts, items: Sequence[Any]) -> Any:
        calls.append(len(items))
        return real(self, items)

    monkeypatch.setattr(Scripts, "drive", drive)
    return calls


def test_a_single_call_skips_the_driver_until_noscript(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = redis.Redis.from_url(module_server.url)
    q = Queue(c, queue_name)
    q.enqueue("t", 1)  # the script loaded, through the driver if it was not
    drives = count_drives(monkeypatch)
    first = q.enqueue("t", {"n": 2})
    assert drives == []
    c.script_flush()
    second = q.enqueue("t", {"n": 3})
    assert drives == [1]  # NOSCRIPT: the driver loaded the script and sent the call again
    assert c.zscore(q.keys.due, first) is not None and c.zscore(q.keys.due, second) is not None
    with pytest.raises(BadArgument, match="id="):
        q._execute(BAD_ID)
    assert drives == [1] and c.zcard(q.keys.due) == 3
    c.close()


def test_the_asyncio_queue_skips_the_driver_until_noscript(
    module_server: RedisProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        c = aredis.Redis.from_url(module_server.url)
        q = AsyncQueue(c, queue_name)
        await q.enqueue("t", 1)
        drives = count_drives(monkeypatch)
        first = await q.enqueue("t", {"n": 2})
        assert drives == []
        await c.script_flush()
        second = await q.enqueue("t", {"n": 3})
        assert drives == [1]
        assert await c.zscore(q.keys.due, first) is not None
        assert await c.zscore(q.keys.due, second) is not None
        with pytest.raises(BadArgument, match="id="):
            await q._execute(BAD_ID)
        assert drives == [1] and await c.zcard(q.keys.due) == 3
        await c.aclose()

    asyncio.run(main())
