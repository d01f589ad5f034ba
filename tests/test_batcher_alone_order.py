"""The asyncio enqueue batcher's order with the calls that go alone (client/enqueue_batcher.py
`alone`): enqueue_many and every enqueue of a queue that waits for replicas join no batch, and
were sent at once, beside a call in flight that writes the job they name in `after` (refused
'no such job' when the server ran theirs first, while the parent's caller was told it was
written). Both ways round: a batched child of a job an `alone` call writes waits for it too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler.core.connection import connect_async
from scheduler.operations.ops import Request
from tests.conftest import delete_queue
from tests.test_client_paths_review import HeldSends, _steps


def _run(client: redis.Redis, queue_name: str, main: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    finally:
        delete_queue(client, Queue(client, queue_name))


def test_a_child_on_a_queue_waiting_for_replicas_waits_for_its_parents_call(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    async def main() -> tuple[list[Any], str]:
        aq = AsyncQueue(connect_async(redis_url), queue_name, wait_replicas=1, wait_timeout_ms=1)
        held = HeldDirect(aq)
        try:
            parent = asyncio.ensure_future(aq.enqueue("t", job_id="p"))
            await _steps()
            child = asyncio.ensure_future(aq.enqueue("t", after=["p"], job_id="c"))
            await _steps()
            await held.release_last_first(parent, child)  # before: the child's call went first
            got: list[Any] = list(await asyncio.gather(parent, child, return_exceptions=True))
            return got, str(Queue(client, queue_name).status("c"))
        finally:
            await aq.aclose()

    got, child_state = _run(client, queue_name, main)
    # No replica here: each job is written and its caller told so (NotDurable names it).
    assert [type(g).__name__ for g in got] == ["NotDurable", "NotDurable"], got
    assert child_state == "held"


class HeldDirect:
    """Hold every call that does not go through the batcher's send until the test releases it:
    the test decides in which order the server runs them (as pooled connections may)."""

    def __init__(self, aq: AsyncQueue) -> None:
        self.real: Callable[[Request], Awaitable[Any]] = aq._execute
        self.calls: list[tuple[asyncio.Future[None], asyncio.Event]] = []
        aq._execute = self.execute  # type: ignore[method-assign]

    async def execute(self, req: Request) -> Any:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        answered = asyncio.Event()
        self.calls.append((gate, answered))
        await gate
        try:
            return await self.real(req)
        finally:
            answered.set()

    async def release_last_first(self, *calls: asyncio.Future[Any]) -> None:
        """Answer the held call that came last first, one at a time, until `calls` are done."""
        while not all(c.done() for c in calls):
            held = [(g, a) for g, a in self.calls if not g.done()]
            if held:
                held[-1][0].set_result(None)
                await held[-1][1].wait()
            await _steps()


def test_enqueue_many_naming_a_job_in_flight_waits_for_its_call(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    async def main() -> tuple[list[Any], str]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        sends = HeldSends(aq)
        try:
            parent = asyncio.ensure_future(aq.enqueue("t", job_id="p"))
            await _steps()
            many = asyncio.ensure_future(
                aq.enqueue_many(iter([JobSpec("t", job_id="a"), JobSpec("t", after=["p"])]))
            )
            await _steps()
            assert not many.done()
            await sends.release(0)
            got: list[Any] = list(await asyncio.gather(parent, many, return_exceptions=True))
            return got, str(Queue(client, queue_name).status(got[1][1]))
        finally:
            await aq.aclose()

    got, child_state = _run(client, queue_name, main)
    assert got[0] == "p"
    assert isinstance(got[1], list) and got[1][0] == "a", got  # a generator, read once
    assert child_state == "held"  # waits for its parent


def test_a_batched_child_of_a_job_enqueue_many_writes_waits_for_that_call(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        held = HeldDirect(aq)
        sends = HeldSends(aq)
        sends.passing = True
        try:
            parent = asyncio.ensure_future(aq.enqueue_many([JobSpec("t", job_id="p")]))
            await _steps()
            child = asyncio.ensure_future(aq.enqueue("t", after=["p"], job_id="c"))
            await _steps()
            assert not child.done()  # before: sent beside the parent's call and refused
            await held.release_last_first(parent, child)
            return list(await asyncio.gather(parent, child, return_exceptions=True))
        finally:
            await aq.aclose()

    got = _run(client, queue_name, main)
    assert got == [["p"], "c"], got


def test_a_debounced_call_naming_nothing_in_flight_goes_at_once(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Held: an `alone` call waits only for its own parents, not for other calls in flight."""

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        sends = HeldSends(aq)
        try:
            other = asyncio.ensure_future(aq.enqueue("t", job_id="o"))
            await _steps()
            lone = await aq.enqueue("t", key="dk", debounce=True)
            assert not other.done()  # answered while the other call is still held
            await sends.release(0)
            return [await other, lone]
        finally:
            await aq.aclose()

    got = _run(client, queue_name, main)
    assert got[0] == "o" and isinstance(got[1], str) and got[1] != "o"
