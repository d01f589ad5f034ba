"""A cancel of an AsyncQueue call that the transport swallowed is still raised. redis-py sends
under asyncio.wait_for, which on Python 3.11 drops a cancel landing as the send completes (a
reconnect's handshake, a payload over 64 KiB): the call returned normally and the task ran on,
so a `while True: await aq.enqueue(...)` loop ignored asyncio.run's one shutdown cancel (an
audit: 5 of 300 loops still enqueueing). Only result() was guarded. The swallowing is made
exact here: the driver call catches its cancellation and returns."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from scheduler import AsyncQueue, JobSpec
from scheduler.client import aio, partitioned_aio
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.scripts import run_async, run_one_async


def swallowing(real: Any) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        # As wait_for on 3.11 when the cancel meets the send's completion: swallowed.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
        return await real(*args, **kwargs)

    return call


def test_a_swallowed_cancel_of_enqueue_is_raised(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aio, "run_one_async", swallowing(run_one_async))

    async def main() -> None:
        async with AsyncQueue(connect_async(redis_url), queue_name) as aq:
            task = asyncio.create_task(aq.enqueue("t", {"n": 1}))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await aq.enqueue("t", {"n": 2})  # the queue is fine afterwards

    asyncio.run(main())


def test_a_swallowed_cancel_of_a_partitioned_call_is_raised(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitioned_aio, "run_async", swallowing(run_async))

    async def main() -> None:
        client = connect_async(redis_url)
        pq = await AsyncPartitionedQueue.create(client, queue_name + "-p", partitions=2)
        task = asyncio.create_task(pq.enqueue_many([JobSpec("t", {"n": i}) for i in range(4)]))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.aclose()

    asyncio.run(main())
