"""Concurrent AsyncQueue.enqueue callers share script calls (client/enqueue_batcher.py), and each
still gets the answer it would have had alone."""

from __future__ import annotations

import asyncio
import gc
import hashlib
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, BadArgument, CorruptKey, Queue
from scheduler.client.enqueue_batcher import EnqueueBatcher
from scheduler.core.connection import connect_async


def _fields(job_id: str) -> list[str]:
    # A job's 13 enqueue.lua fields, as codec.enqueue_fields makes them (only the id is read).
    return [job_id, "t", "null", "in", "0", "5", "", "0", "", "86400000", "", "", ""]


class Gate:
    """A send that holds each call until released, and records what it was sent."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release: list[asyncio.Future[Any]] = []

    async def send(self, args: list[str]) -> Any:
        self.calls.append(args)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.release.append(done)
        return await done

    def ids(self, k: int) -> list[str]:
        args = self.calls[k]
        return [args[1 + i * 13] for i in range(int(args[0]))]


async def batch_behind_one(gate: Gate, b: EnqueueBatcher, names: str) -> list[asyncio.Task[str]]:
    """'a' sent alone and answered; the calls of `names`, made while it was in flight, waited
    and are now gate.calls[1], unanswered."""
    first = asyncio.ensure_future(b.enqueue(_fields("a")))
    await asyncio.sleep(0)  # one loop step: 'a' is sent, nothing else runs meanwhile
    rest = [asyncio.ensure_future(b.enqueue(_fields(x))) for x in names]
    await asyncio.sleep(0)
    gate.release[0].set_result(["c"])
    assert await first == "a"
    await asyncio.sleep(0)
    return rest


def test_calls_made_while_others_are_in_flight_go_out_together_in_order() -> None:
    async def main() -> None:
        gate = Gate()
        b = EnqueueBatcher(gate.send, max_in_flight=1)
        first = asyncio.ensure_future(b.enqueue(_fields("a")))
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(b.enqueue(_fields(x))) for x in "bcd"]
        await asyncio.sleep(0)
        assert gate.ids(0) == ["a"] and len(gate.calls) == 1  # the others wait
        gate.release[0].set_result(["c"])
        assert await first == "a"
        await asyncio.sleep(0)
        assert gate.ids(1) == ["b", "c", "d"]
        # The key of 'c' named an earlier job: its caller gets that one, as alone.
        gate.release[1].set_result(["cec", 2, "z"])
        assert await asyncio.gather(*rest) == ["b", "z", "d"]

    asyncio.run(main())


def test_a_refused_batch_is_sent_again_one_job_per_call() -> None:
    async def main() -> None:
        gate = Gate()
        b = EnqueueBatcher(gate.send, max_in_flight=1)
        rest = await batch_behind_one(gate, b, "bc")
        gate.release[1].set_exception(BadArgument("after=missing"))
        await asyncio.sleep(0)
        assert gate.ids(2) == ["b"]
        gate.release[2].set_exception(BadArgument("after=missing"))
        await asyncio.sleep(0)
        assert gate.ids(3) == ["c"]
        gate.release[3].set_result(["c"])
        got = await asyncio.gather(*rest, return_exceptions=True)
        assert isinstance(got[0], BadArgument) and got[1] == "c"

    asyncio.run(main())


def test_one_refused_job_among_many_costs_a_few_calls_not_one_each() -> None:
    # A refused batch was sent again one job per call: 1 bad job among 999 made 1,000 calls.
    calls: list[list[str]] = []

    async def send(args: list[str]) -> Any:
        calls.append(args)
        await asyncio.sleep(0)
        ids = [args[1 + i * 13] for i in range(int(args[0]))]
        if "bad" in ids:
            raise BadArgument("after=missing")
        return [""]

    async def main() -> list[Any]:
        b = EnqueueBatcher(send, max_in_flight=1)
        names = [f"j{i}" for i in range(257)]
        names[100] = "bad"
        return await asyncio.gather(*(b.enqueue(_fields(n)) for n in names), return_exceptions=True)

    got = asyncio.run(main())
    assert isinstance(got[100], BadArgument)
    assert [g for k, g in enumerate(got) if k != 100] == [f"j{i}" for i in range(257) if i != 100]
    sent = [args[1 + i * 13] for args in calls for i in range(int(args[0]))]
    assert sorted(set(sent)) == sorted({f"j{i}" for i in range(257) if i != 100} | {"bad"})
    assert len(calls) <= 1 + 1 + 2 * 8  # the lone first, the batch, two halves per level


def test_a_lost_connection_reaches_every_caller_of_the_batch() -> None:
    async def main() -> None:
        gate = Gate()
        b = EnqueueBatcher(gate.send, max_in_flight=1)
        rest = await batch_behind_one(gate, b, "bc")
        gate.release[1].set_exception(redis.ConnectionError("gone"))
        got = await asyncio.gather(*rest, return_exceptions=True)
        assert [type(e) for e in got] == [redis.ConnectionError] * 2
        assert len(gate.calls) == 2  # not re-sent: its jobs may be written already
        # And the batcher goes on: the next call is sent at once.
        nxt = asyncio.ensure_future(b.enqueue(_fields("d")))
        await asyncio.sleep(0)
        assert gate.ids(2) == ["d"]
        gate.release[2].set_result(["c"])
        assert await nxt == "d"

    asyncio.run(main())


def test_a_caller_cancelled_while_it_waits_sends_nothing() -> None:
    async def main() -> None:
        gate = Gate()
        b = EnqueueBatcher(gate.send, max_in_flight=1)
        first = asyncio.ensure_future(b.enqueue(_fields("a")))
        await asyncio.sleep(0)
        gone = asyncio.ensure_future(b.enqueue(_fields("b")))
        kept = asyncio.ensure_future(b.enqueue(_fields("c")))
        await asyncio.sleep(0)
        gone.cancel()
        gate.release[0].set_result(["c"])
        await first
        await asyncio.sleep(0)
        assert gate.ids(1) == ["c"]
        gate.release[1].set_result(["c"])
        assert await kept == "c"
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(main())


def test_a_batcher_left_by_a_closed_loop_serves_a_new_one() -> None:
    gate = Gate()
    b = EnqueueBatcher(gate.send, max_in_flight=1)
    loop = asyncio.new_event_loop()
    lost = loop.create_task(b.enqueue(_fields("a")))
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()  # its call never answered, its task never finished
    assert not lost.done()

    async def main() -> str:
        call = asyncio.ensure_future(b.enqueue(_fields("b")))
        await asyncio.sleep(0)
        assert gate.ids(1) == ["b"]  # sent at once, not queued behind the lost call
        gate.release[1].set_result(["c"])
        return await call

    assert asyncio.run(main()) == "b"


def test_concurrent_callers_on_redis_share_calls_and_lose_nothing(redis_url: str) -> None:
    async def main() -> None:
        aq = AsyncQueue(connect_async(redis_url), "batcher-share")
        sent: list[int] = []
        send = aq._batcher._send

        async def counted(args: list[str]) -> Any:
            sent.append(int(args[0]))
            return await send(args)

        aq._batcher._send = counted
        try:
            ids = await asyncio.gather(*(aq.enqueue("t", {"n": i}) for i in range(200)))
            assert len(set(ids)) == 200 and sum(sent) == 200
            assert len(sent) < 200  # shared calls
            jobs = {j.id: j for j in await aq.list_jobs("due", limit=500)}
            assert sorted(jobs) == sorted(ids)
            assert [jobs[i].payload() for i in ids] == [{"n": i} for i in range(200)]
            # One key in two concurrent calls: both answered with the first's job, as in turn.
            a, b = await asyncio.gather(aq.enqueue("t", key="k1"), aq.enqueue("t", key="k1"))
            assert a == b
        finally:
            await aq.aclose()

    asyncio.run(main())


def test_one_callers_bad_job_refuses_no_other_callers(redis_url: str, client: redis.Redis) -> None:
    q = Queue(client, "batcher-refusal")
    digest = hashlib.sha256(b"edited").hexdigest()  # as codec.enqueue_fields makes it
    client.hset(q.keys.idem(digest), "x", "1")  # a key edited by hand

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), q.name)
        try:
            bad: dict[int, dict[str, Any]] = {
                5: {"after": ["no-such-parent"]},
                9: {"key": "edited"},
            }
            calls = [aq.enqueue("t", {"n": i}, **bad.get(i, {})) for i in range(20)]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await aq.aclose()

    got = asyncio.run(main())
    assert isinstance(got[5], BadArgument) and "after" in str(got[5])
    assert isinstance(got[9], CorruptKey)
    ok = [g for k, g in enumerate(got) if k not in (5, 9)]
    assert all(isinstance(g, str) for g in ok)
    assert sorted(j.id for j in q.list_jobs("due", limit=100)) == sorted(ok)


class Interrupt(BaseException):
    """Not an Exception: what a send may raise besides errors (as KeyboardInterrupt is)."""


def test_a_send_interrupted_during_the_one_by_one_resend_answers_every_caller() -> None:
    async def main() -> None:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        gate = Gate()
        b = EnqueueBatcher(gate.send, max_in_flight=1)
        rest = await batch_behind_one(gate, b, "bc")
        gate.release[1].set_exception(BadArgument("after=missing"))  # refused: one by one
        await asyncio.sleep(0)
        assert gate.ids(2) == ["b"]
        gate.release[2].set_exception(Interrupt())
        while b._tasks:
            await asyncio.sleep(0)
        # 'c' was never sent: it is answered too (before, it waited for ever).
        assert [r.done() for r in rest] == [True, True]
        got = await asyncio.gather(*rest, return_exceptions=True)
        assert [type(e) for e in got] == [Interrupt, Interrupt]
        assert len(gate.calls) == 3
        del got, rest
        gc.collect()
        # It reached its callers: not also left on the batch's task, never retrieved.
        assert reported == []

    asyncio.run(main())


def test_a_parent_named_by_another_caller_of_the_batch_is_the_job_in_turn_would_give(
    redis_url: str, client: redis.Redis
) -> None:
    # Callers of one batch must not share enqueue.lua's in-call rename of a parent whose key
    # was taken (the job the key names): in turn, the child names the id as it then stands.
    q = Queue(client, "batcher-keyed-parent")

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), q.name)
        try:
            await aq.enqueue("t", key="K", job_id="orig")
            return await asyncio.gather(
                aq.enqueue("t"),  # these two in flight: the five below wait, one batch
                aq.enqueue("t"),
                aq.enqueue("t", key="K", job_id="x"),  # the key is taken: answered 'orig'
                aq.enqueue("t", job_id="x"),  # so 'x' is this caller's new job
                aq.enqueue("t", after=["x"], job_id="child"),
                aq.enqueue("t", key="K", job_id="y"),  # answered 'orig': no job 'y'
                aq.enqueue("t", after=["y"], job_id="orphan"),
                return_exceptions=True,
            )
        finally:
            await aq.aclose()

    got = asyncio.run(main())
    assert got[2:6] == ["orig", "x", "child", "orig"]
    # The child waits for the job 'x' its caller named (before: for 'orig', the key's).
    assert client.hget(q.keys.job("child"), "parents") == "x"
    # And a parent that does not exist is refused, as in turn (before: it waited for 'orig').
    assert isinstance(got[6], BadArgument) and "after=y" in str(got[6])


def test_a_task_handle_and_a_partitioned_queue_share_calls_too(redis_url: str) -> None:
    # Both went through enqueue_many, one script call (and pooled connection) per caller:
    # past 100 concurrent callers they raised MaxConnectionsError.
    from scheduler.client.partitioned_aio import AsyncPartitionedQueue
    from scheduler.worker.registry import Registry

    registry = Registry()

    @registry.task("batcher.remind", max_attempts=2)
    def remind(payload: Any, ctx: Any) -> None:
        return None

    async def main() -> tuple[list[Any], list[Any], AsyncQueue, AsyncPartitionedQueue]:
        client = connect_async(redis_url)
        aq = AsyncQueue(client, "batcher-handle")
        pq = await AsyncPartitionedQueue.create(client, "batcher-parts", partitions=3)
        try:
            by_handle = await asyncio.gather(
                *(remind.aenqueue(aq, {"n": i}) for i in range(150)), return_exceptions=True
            )
            by_parts = await asyncio.gather(
                *(pq.enqueue("t", {"n": i}, priority=1) for i in range(150)),
                return_exceptions=True,
            )
            jobs = [await aq.get_job(str(i)) for i in by_handle[:3]]
            assert {j.max_attempts for j in jobs} == {2}  # the handle's default kept
            counts = await pq.counts()
            assert counts.due == 150
            parted = [await pq.get_job(str(i)) for i in by_parts[:3]]
            assert [j.payload() for j in parted] == [{"n": 0}, {"n": 1}, {"n": 2}]
            return by_handle, by_parts, aq, pq
        finally:
            await client.aclose()

    by_handle, by_parts, _, _ = asyncio.run(main())
    assert [g for g in by_handle + by_parts if not isinstance(g, str)] == []
    assert len(set(by_handle)) == 150 and len(set(by_parts)) == 150
