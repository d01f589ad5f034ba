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


def swallowing(real: Any, inside: list[asyncio.Event]) -> Any:
    """`real`, after a wait that swallows its cancellation; `inside[0]` is set once the call
    is in that wait (the test cancels then, not after a guessed sleep)."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        if inside:
            inside[0].set()
        # As wait_for on 3.11 when the cancel meets the send's completion: swallowed.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
        return await real(*args, **kwargs)

    return call


def test_a_swallowed_cancel_of_enqueue_is_raised(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside: list[asyncio.Event] = []
    monkeypatch.setattr(aio, "run_one_async", swallowing(run_one_async, inside))

    async def main() -> None:
        inside.append(asyncio.Event())
        async with AsyncQueue(connect_async(redis_url), queue_name) as aq:
            task = asyncio.create_task(aq.enqueue("t", {"n": 1}))
            await inside[0].wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await aq.enqueue("t", {"n": 2})  # the queue is fine afterwards

    asyncio.run(main())


def test_a_swallowed_cancel_of_a_partitioned_call_is_raised(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside: list[asyncio.Event] = []
    monkeypatch.setattr(partitioned_aio, "run_async", swallowing(run_async, inside))

    async def main() -> None:
        client = connect_async(redis_url)
        pq = await AsyncPartitionedQueue.create(client, queue_name + "-p", partitions=2)
        inside.append(asyncio.Event())  # create's own calls went before
        task = asyncio.create_task(pq.enqueue_many([JobSpec("t", {"n": i}) for i in range(4)]))
        await inside[0].wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.aclose()

    asyncio.run(main())
