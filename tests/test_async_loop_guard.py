"""An AsyncQueue's connections belong to the event loop and the process that first used them
(client fork / thread audit). A process forked after that first use (gunicorn --preload,
multiprocessing's fork) and a second event loop still open beside the first (another thread's)
are refused with BadArgument before any I/O: before, the child wrote on the parent's socket and
the parent read the child's replies as its own, and a second thread's loop waited for ever."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import Iterator

import pytest

from scheduler import AsyncPartitionedQueue, AsyncQueue, BadArgument, JobNotFound, Queue
from scheduler._spawn import RedisProcess
from scheduler.core import loop_guard
from scheduler.core.connection import connect, connect_async
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")


@pytest.fixture
def url(module_server: RedisProcess) -> Iterator[str]:
    yield module_server.url


def _child(fn: object) -> int:
    """Run fn() in a forked child; its exit code (0: fn returned True)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if fn() else 2  # type: ignore[operator]
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_child_forked_after_first_use_is_refused_and_the_parent_keeps_its_replies(
    url: str, queue_name: str
) -> None:
    aq = AsyncQueue(connect_async(url), queue_name)
    loop = asyncio.new_event_loop()  # the parent's loop stays open across the fork
    try:
        loop.run_until_complete(aq.counts())

        def refused() -> bool:
            async def go() -> bool:
                try:
                    await aq.enqueue("t", job_id="child")
                except BadArgument as exc:
                    return "fork" in str(exc)
                return False

            return asyncio.run(go())

        assert _child(refused) == 0  # fails before: the child's call ran on the parent's socket

        async def parent() -> list[object]:
            wrong: list[object] = []
            for i in range(30):
                got = await aq.enqueue("t", job_id=f"p{i}")
                if got != f"p{i}":
                    wrong.append(got)
                if (await aq.get_job(f"p{i}")).id != f"p{i}":
                    wrong.append(i)
            return wrong

        assert loop.run_until_complete(parent()) == []
    finally:
        loop.run_until_complete(aq.aclose())
        loop.close()
    q = Queue(connect(url), queue_name)
    with pytest.raises(JobNotFound):
        q.get_job("child")  # the refused call wrote nothing
    q.close()


def test_a_queue_first_used_in_the_child_works(url: str, queue_name: str) -> None:
    aq = AsyncQueue(connect_async(url), queue_name)  # made before the fork, used only after

    def works() -> bool:
        async def go() -> bool:
            ok = await aq.enqueue("t", job_id="c1") == "c1"
            await aq.aclose()
            return ok

        return asyncio.run(go())

    assert _child(works) == 0


def test_a_second_event_loop_still_open_is_refused(url: str, queue_name: str) -> None:
    aq = AsyncQueue(connect_async(url), queue_name)
    first = asyncio.new_event_loop()
    runner = threading.Thread(target=first.run_forever, daemon=True)
    runner.start()
    try:
        asyncio.run_coroutine_threadsafe(aq.counts(), first).result(10)

        async def other_loop() -> None:
            await asyncio.wait_for(aq.enqueue("t", job_id="x"), 10)

        # fails before: TimeoutError (the call waited on the first loop's connection)
        with pytest.raises(BadArgument, match="event loop"):
            asyncio.run(other_loop())
        assert asyncio.run_coroutine_threadsafe(aq.enqueue("t", job_id="y"), first).result(10)
    finally:
        asyncio.run_coroutine_threadsafe(aq.aclose(), first).result(10)
        first.call_soon_threadsafe(first.stop)
        runner.join(10)
        first.close()


def test_a_new_loop_after_the_first_one_closed_is_not_refused(url: str, queue_name: str) -> None:
    aq = AsyncQueue(connect_async(url), queue_name)
    asyncio.run(aq.counts())

    async def second() -> str:
        await aq.counts()  # the closed loop's connection closed first (test_async_loop_reuse.py)
        try:
            return await aq.enqueue("t", job_id="after")
        finally:
            await aq.aclose()

    assert asyncio.run(second()) == "after"
    gc.collect()  # no transport of the closed loop left to warn (filterwarnings = error)


def test_a_partitioned_queue_is_refused_in_a_child_forked_after_first_use(
    url: str, queue_name: str
) -> None:
    loop = asyncio.new_event_loop()
    pq = loop.run_until_complete(
        AsyncPartitionedQueue.create(connect_async(url), queue_name, partitions=2)
    )
    try:
        loop.run_until_complete(pq.counts())  # one call over both partitions

        def refused() -> bool:
            async def go() -> bool:
                try:
                    await pq.counts()
                except BadArgument as exc:
                    return "fork" in str(exc)
                return False

            return asyncio.run(go())

        assert _child(refused) == 0  # fails before: the child read on the parent's socket
        assert loop.run_until_complete(pq.counts()).due == 0
    finally:
        loop.run_until_complete(pq.aclose())
        loop.close()


def test_a_first_loop_left_open_on_this_thread_is_named(url: str, queue_name: str) -> None:
    aq = AsyncQueue(connect_async(url), queue_name)
    first = asyncio.new_event_loop()  # run_until_complete at start-up, never closed
    try:
        first.run_until_complete(aq.counts())

        async def later() -> None:
            await asyncio.wait_for(aq.counts(), 10)

        with pytest.raises(BadArgument, match="never closed"):
            asyncio.run(later())
        assert first.run_until_complete(aq.enqueue("t", job_id="still")) == "still"
    finally:
        first.run_until_complete(aq.aclose())
        first.close()


def test_a_childs_aclose_leaves_the_parents_connections_alone(url: str, queue_name: str) -> None:
    """Defect: aclose() in a child of an AsyncQueue its parent used (a child's cleanup, `async
    with`) closed the parent's connections through the parent's event loop, whose epoll
    instance the child shares: the parent's next call waited until its timeout."""
    aq = AsyncQueue(connect_async(url), queue_name)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(aq.counts())

        def close_it() -> bool:
            asyncio.run(aq.aclose())
            return True

        code = _child(close_it)

        async def after() -> str:
            return await asyncio.wait_for(aq.enqueue("t", job_id="after"), 10)

        assert loop.run_until_complete(after()) == "after"  # fails before: TimeoutError
        assert code == 0  # before: exit 3, a RuntimeError from the parent's loop
    finally:
        loop.run_until_complete(aq.aclose())
        loop.close()


def test_two_loops_racing_to_the_first_call_one_is_refused(
    url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads' loops making an unused AsyncQueue's first call at once: both read 'not
    bound yet' (a barrier holds them there) and, before, both bound it and went on."""
    barrier, reads = threading.Barrier(2, timeout=10), [0]

    class Racing(dict):  # type: ignore[type-arg]
        def get(self, key: object, default: object = None) -> object:
            got = super().get(key, default)
            reads[0] += 1
            if reads[0] <= 2:  # the two first reads meet here
                barrier.wait()
            return got

    monkeypatch.setattr(loop_guard, "_BOUND", Racing())
    aq = AsyncQueue(connect_async(url), queue_name)
    outcomes: list[str] = []

    def first_call() -> None:
        async def go() -> None:
            await asyncio.sleep(0)
            try:
                loop_guard.check(aq.client, "AsyncQueue")
                outcomes.append("bound")
                await asyncio.sleep(0.5)  # this loop stays open while the other one checks
            except BadArgument:
                outcomes.append("refused")

        asyncio.run(go())

    threads = [threading.Thread(target=first_call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(outcomes) == ["bound", "refused"]  # fails before: both bound
