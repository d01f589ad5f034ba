"""A review of two client surfaces: the asyncio enqueue batcher (client/aio.py,
client/enqueue_batcher.py: concurrent `await aq.enqueue(...)` calls share script calls) and the
partitioned queues (client/partitioned*.py). Tests that show a defect fail on the code as
reviewed; the others guard behaviour checked to be right."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from scheduler import AsyncQueue, Queue
from scheduler.core.connection import connect_async
from tests.conftest import delete_queue


async def _steps(n: int = 20) -> None:
    """Let the loop run `n` rounds of ready callbacks (no wall-clock wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


class HeldSends:
    """An AsyncQueue's batcher send that holds every script call until the test releases it,
    then sends it to the real server: the test decides in which order the server runs the
    calls in flight (as two pooled connections may reach it in either order)."""

    def __init__(self, aq: AsyncQueue) -> None:
        self.real: Callable[[list[str]], Awaitable[Any]] = aq._batcher._send
        self.calls: list[tuple[list[str], asyncio.Future[None], asyncio.Event]] = []
        aq._batcher._send = self.send

    async def send(self, args: list[str]) -> Any:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        answered = asyncio.Event()
        self.calls.append((args, gate, answered))
        await gate
        try:
            return await self.real(args)
        finally:
            answered.set()

    def ids(self, k: int) -> list[str]:
        args = self.calls[k][0]
        return [args[1 + i * 13] for i in range(int(args[0]))]

    def held(self) -> list[int]:
        return [k for k, (_, gate, _) in enumerate(self.calls) if not gate.done()]

    async def release(self, k: int) -> None:
        _, gate, answered = self.calls[k]
        gate.set_result(None)
        await answered.wait()
        await _steps()


# -- the asyncio enqueue batcher ----------------------------------------------------------------


def test_a_child_split_off_its_keyed_parents_batch_is_not_run_before_the_parent(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Defect: callers P (a job with a fresh idempotency key, job_id 'parent') and C
    (after=['parent']) wait in order behind two calls in flight. The batcher puts C in a later
    call than P on purpose (enqueue_batcher.py _names_one_of: 'in turn, the id names what
    stands under it then'), but it starts that later call as soon as a second call in flight
    comes back, while P's call is still unanswered: the two go on two connections at once, and
    when the server runs C's first, C's caller gets BadArgument 'after=parent (no such job)'
    although P's caller, ahead of it, is told its job was written. In one call, or in turn,
    C is accepted and waits for P. A user sees a child enqueued after its parent refused
    (its job lost unless the caller retries) only when the parent had a key."""
    q = Queue(client, queue_name)

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        sends = HeldSends(aq)
        try:
            first = [asyncio.ensure_future(aq.enqueue("t")) for _ in range(2)]
            await _steps()
            assert len(sends.calls) == 2  # two calls in flight: the next callers wait
            parent = asyncio.ensure_future(aq.enqueue("t", key="K", job_id="parent"))
            child = asyncio.ensure_future(aq.enqueue("t", after=["parent"], job_id="child"))
            await _steps()
            for k in (0, 1):  # the two calls in flight come back
                await sends.release(k)
            # The server answers whatever call reached it last first (a legal order for calls
            # on two connections), until every caller is answered.
            while sends.held():
                await sends.release(sends.held()[-1])
            return await asyncio.gather(*first, parent, child, return_exceptions=True)
        finally:
            await aq.aclose()

    try:
        got = asyncio.run(main())
        assert got[2] == "parent"
        assert got[3] == "child", f"the child's caller got {got[3]!r}"
        assert q.status("child") == "held"  # waits for its parent
    finally:
        delete_queue(client, q)
