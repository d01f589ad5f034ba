"""Review: cancellation safety of the asyncio client (AsyncQueue, its enqueue batcher, the
direct I/O path that reads its own replies, AsyncPartitionedQueue).

A web app's handler is cancelled at any await (client gone, asyncio.timeout, wait_for). The
classic failure (redis-py CVE-2023-28858/28859): a command cancelled after its send leaves its
reply on a pooled connection and the next user of that connection reads it as its own. Checked
on a private server (CLIENT PAUSE slows it; never the shared one): the next calls get their own
answers, the pool's in-use count returns to 0, a cancelled enqueue re-sent with its job_id is
not written twice, batched callers beside a cancelled one keep their own answers
(client/enqueue_batcher.py's docstring: a caller cancelled while it waits sends nothing; one
cancelled once sent may be written), and a cancelled claim's jobs are found again by its nonce.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, JobNotFound, JobSpec
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.models import JobState
from tests.redis_server import RedisProcess

Call = Callable[[], Awaitable[Any]]


def in_use(c: aredis.Redis) -> int:
    return len(c.connection_pool._in_use_connections)


async def settle(c: aredis.Redis) -> int:
    """The pool's in-use count once background calls (a batch's flush, the queue index's
    SADD) had time to end: 0 unless a connection was leaked."""
    for _ in range(100):
        if in_use(c) == 0:
            return 0
        await asyncio.sleep(0.01)
    return in_use(c)


async def warm(c: aredis.Redis, n: int = 8) -> None:
    """n connections in the pool, so that no call under a pause waits on a new connection's
    handshake (which the pause blocks too)."""
    await asyncio.gather(*(c.ping() for _ in range(n)))


@contextlib.contextmanager
def write_pause(ctl: redis.Redis) -> Iterator[None]:
    """Writes (every script call) wait on the server until the block ends; reads and CLIENT
    UNPAUSE go on."""
    ctl.client_pause(10_000, all=False)
    try:
        yield
    finally:
        ctl.client_unpause()


async def outcome(task: asyncio.Task[Any]) -> Any:
    """The task's result, or its exception (CancelledError included) as a value."""
    try:
        return await task
    except BaseException as exc:  # the outcome is what is checked
        return exc


@pytest.fixture
def ctl(module_server: RedisProcess) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(module_server.url)
    c.flushall()
    yield c
    with contextlib.suppress(redis.RedisError):
        c.client_unpause()
    c.close()


async def three(aq: AsyncQueue) -> tuple[str, str, str]:
    """a and b due, s scheduled an hour ahead."""
    a = await aq.enqueue("t", {"who": "a"}, job_id="job-a")
    b = await aq.enqueue("t", {"who": "b"}, job_id="job-b")
    s = await aq.enqueue("t", {"who": "s"}, job_id="job-s", delay_ms=3_600_000)
    return a, b, s


async def answers_are_their_own(aq: AsyncQueue) -> None:
    """Concurrent and sequential calls, each answer checked against what it asked."""
    jb, st, counts, ja = await asyncio.gather(
        aq.get_job("job-b"), aq.status("job-s"), aq.counts(), aq.get_job("job-a")
    )
    assert (jb.id, jb.payload()) == ("job-b", {"who": "b"})
    assert (ja.id, ja.payload()) == ("job-a", {"who": "a"})
    assert st == JobState.SCHEDULED
    assert counts.scheduled == 1 and counts.leased == 0
    assert await aq.status("job-a") == JobState.DUE
    assert (await aq.get_job("job-s")).payload() == {"who": "s"}


@pytest.mark.parametrize("kind", ["connect_async", "socket_timeout"])
def test_a_cancel_at_any_loop_step_leaves_the_next_calls_their_own_replies(
    module_server: RedisProcess, ctl: redis.Redis, kind: str
) -> None:
    """socket_timeout: a plain bytes client whose sends go direct_io's no-wait_for way (or
    redis-py's wait_for one) and whose reads are under a timeout."""

    async def main() -> None:
        c = (
            connect_async(module_server.url)
            if kind == "connect_async"
            else aredis.Redis.from_url(module_server.url, socket_timeout=5)
        )
        aq = AsyncQueue(c, "cq")
        await three(aq)
        sent: set[str] = set()
        calls: dict[str, Callable[[int], Call]] = {
            "enqueue": lambda n: lambda: aq.enqueue("t", {"n": n}, job_id=f"e{n}"),
            "enqueue_many": lambda n: (
                lambda: aq.enqueue_many(
                    [JobSpec("t", {"m": n, "k": k}, job_id=f"m{n}-{k}") for k in range(3)],
                    batch_size=1,  # three EVALSHA in one pipeline: pipeline_async's reads
                )
            ),
            "get_job": lambda n: lambda: aq.get_job("job-a"),
            "status": lambda n: lambda: aq.status("job-s"),
            "counts": lambda n: aq.counts,
            "list_jobs": lambda n: lambda: aq.list_jobs("scheduled"),
        }
        for name, make in calls.items():
            for n in range(14):
                task = asyncio.ensure_future(make(n)())
                for _ in range(n):
                    await asyncio.sleep(0)
                task.cancel()
                got = await outcome(task)
                if name == "enqueue":
                    sent.add(f"e{n}")
                    assert isinstance(got, asyncio.CancelledError) or got == f"e{n}", got
                elif name == "enqueue_many":
                    sent.update(f"m{n}-{k}" for k in range(3))
                    want = [f"m{n}-{k}" for k in range(3)]
                    assert isinstance(got, asyncio.CancelledError) or got == want, got
                elif name == "get_job" and not isinstance(got, BaseException):
                    assert got.id == "job-a"
                elif name == "status" and not isinstance(got, BaseException):
                    assert got == JobState.SCHEDULED
                await answers_are_their_own(aq)
        assert await settle(c) == 0
        # Each cancelled enqueue re-sent with its id: its id back, nothing written twice.
        for job_id in sorted(sent):
            assert await aq.enqueue("t", {"again": 1}, job_id=job_id) == job_id
        assert (await aq.counts()).due == 2 + len(sent)
        await c.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["wait_for", "timeout"])
def test_calls_timed_out_on_a_slow_server_leave_nothing_behind(
    module_server: RedisProcess, ctl: redis.Redis, how: str
) -> None:
    """The replies arrive after their callers gave up: no later call reads them."""

    async def bounded(call: Call) -> Any:
        if how == "wait_for":
            return await asyncio.wait_for(call(), 0.03)
        async with asyncio.timeout(0.03):
            return await call()

    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "sq")
        await three(aq)
        await warm(c)
        many = [JobSpec("t", {"k": k}, job_id=f"slow-m{k}") for k in range(3)]
        calls: list[Call] = [
            lambda: aq.get_job("job-a"),
            lambda: aq.status("job-s"),
            aq.counts,
            lambda: aq.enqueue("t", {"slow": 1}, job_id="slow-1"),
            lambda: aq.enqueue_many(many, batch_size=1),
            lambda: aq.list_jobs("due"),
        ]
        ctl.client_pause(200)
        got = await asyncio.gather(*(bounded(call) for call in calls), return_exceptions=True)
        assert all(isinstance(g, TimeoutError) for g in got), got
        await asyncio.sleep(0.25)  # the pause is over: the late replies came (or were dropped)
        await answers_are_their_own(aq)
        assert await settle(c) == 0
        assert await aq.enqueue("t", {"slow": 2}, job_id="slow-1") == "slow-1"
        assert await aq.enqueue_many(many) == [s.job_id for s in many]
        assert (await aq.counts()).due == 2 + 1 + 3
        await c.aclose()

    asyncio.run(main())


def test_batched_callers_beside_cancelled_ones_get_their_own_answers(
    module_server: RedisProcess, ctl: redis.Redis
) -> None:
    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "bq")
        await three(aq)
        await warm(c)
        with write_pause(ctl):
            lone = [aq.enqueue("t", {"lone": i}, job_id=f"L{i}") for i in range(2)]
            lone_tasks = [asyncio.ensure_future(x) for x in lone]
            await asyncio.sleep(0.02)  # both sent alone, held by the pause
            wait = [
                asyncio.ensure_future(aq.enqueue("t", {"w": i}, job_id=f"W{i}")) for i in range(6)
            ]
            anon = [asyncio.ensure_future(aq.enqueue("t", {"anon": i})) for i in range(4)]
            await asyncio.sleep(0.02)
            wait[1].cancel()  # still waiting in the batcher: sends nothing
            anon[2].cancel()
            await asyncio.sleep(0)
            ctl.client_unpause()  # the lone calls run ...
            ctl.client_pause(10_000, all=False)  # ... the batch waits
            assert await asyncio.gather(*lone_tasks) == ["L0", "L1"]
            await asyncio.sleep(0.02)  # the batch is sent, held
            wait[3].cancel()  # sent: may be written (the batcher's docstring)
            anon[0].cancel()
            await asyncio.sleep(0)
        got = [await outcome(t) for t in wait]
        anon_got = [await outcome(t) for t in anon]
        for i, g in enumerate(got):
            if i in (1, 3):
                assert isinstance(g, asyncio.CancelledError), g
            else:
                assert g == f"W{i}"
                assert (await aq.get_job(g)).payload() == {"w": i}
        for i, g in enumerate(anon_got):
            if i in (0, 2):
                assert isinstance(g, asyncio.CancelledError), g
            else:
                assert isinstance(g, str) and (await aq.get_job(g)).payload() == {"anon": i}
        with pytest.raises(JobNotFound):  # cancelled while waiting: not sent
            await aq.status("W1")
        await answers_are_their_own(aq)
        assert await settle(c) == 0
        assert not aq._batcher._waiting and aq._batcher._in_flight == 0
        # Re-sent with their ids: found when written, not written twice.
        assert await aq.enqueue("t", {"w": 1}, job_id="W1") == "W1"
        assert await aq.enqueue("t", {"w": 3}, job_id="W3") == "W3"
        due = 2 + 2 + 6 + 3  # a, b, L0-1, W0-5, the anonymous jobs written (1, 3 and 0)
        assert (await aq.counts()).due in (due, due - 1)  # anon 0: sent, may be written
        await c.aclose()

    asyncio.run(main())


def test_a_cancelled_claim_is_found_again_by_its_nonce_and_complete_re_sent(
    module_server: RedisProcess, ctl: redis.Redis
) -> None:
    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "lq")
        await three(aq)
        await warm(c)
        with write_pause(ctl):
            task = asyncio.ensure_future(aq.claim("w1", limit=1, nonce="n1"))
            await asyncio.sleep(0.02)  # sent, held
            task.cancel()
            assert isinstance(await outcome(task), asyncio.CancelledError)
        batch = await aq.claim("w1", limit=1, nonce="n1")  # the lost answer, or a fresh lease
        assert len(batch.jobs) == 1
        counts = await aq.counts()
        assert counts.leased == 1 and counts.due == 1  # no lease the caller does not know of
        (job,) = batch.jobs
        with write_pause(ctl):
            done = asyncio.ensure_future(aq.complete(job.id, job.token, {"r": 1}))
            await asyncio.sleep(0.02)
            done.cancel()
            assert isinstance(await outcome(done), asyncio.CancelledError)
        await aq.complete(job.id, job.token, {"r": 1})  # re-sent: accepted (or already done)
        assert await aq.status(job.id) == JobState.DONE
        assert await aq.result(job.id, timeout_s=1) == {"r": 1}
        assert await settle(c) == 0
        await c.aclose()

    asyncio.run(main())


def test_a_cancelled_result_wait_leaves_and_the_next_wait_gets_the_result(
    module_server: RedisProcess, ctl: redis.Redis
) -> None:
    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "rq")
        a, b, _ = await three(aq)
        waiter = asyncio.ensure_future(aq.result(a, timeout_s=30))
        await asyncio.sleep(0.05)  # announced, waiting
        assert await c.exists(aq.keys.result_wait(a)) == 1
        waiter.cancel()
        assert isinstance(await outcome(waiter), asyncio.CancelledError)
        assert await c.exists(aq.keys.result_wait(a)) == 0  # took itself out
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(aq.result(b, timeout_s=30), 0.05)
        assert await c.exists(aq.keys.result_wait(b)) == 0
        await answers_are_their_own(aq)
        batch = await aq.claim("w", limit=2)
        for job in batch.jobs:
            await aq.complete(job.id, job.token, {"done": job.id})
        assert await aq.result(a, timeout_s=1) == {"done": a}
        assert await aq.result(b, timeout_s=1) == {"done": b}
        assert await settle(c) == 0
        await c.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("op", ["counts", "enqueue", "enqueue_many"])
def test_a_cancel_while_the_connection_goes_back_leaks_nothing(
    module_server: RedisProcess, ctl: redis.Redis, op: str
) -> None:
    """The pool's lock held meanwhile by another task (redis-py's own release disconnecting a
    connection marked for reconnect, pool.disconnect() under aclose) makes give_async wait for
    it; a cancel then (a deadline passing) skipped the put-back: the connection stays in use
    forever, and 100 of those (redis-py's default max_connections) refuse every call with
    MaxConnectionsError. redis-py 8's own ConnectionPool.release hands such a release to a
    background task ('Cancelled while waiting for a contended lock: don't leak')."""

    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "kq")
        await three(aq)
        pool = c.connection_pool
        calls: dict[str, Call] = {
            "counts": aq.counts,
            "enqueue": lambda: aq.enqueue("t", 1, job_id="k-1"),
            "enqueue_many": lambda: aq.enqueue_many(
                [JobSpec("t", k, job_id=f"k-m{k}") for k in range(2)], batch_size=1
            ),
        }
        task = asyncio.ensure_future(calls[op]())
        for _ in range(3):
            await asyncio.sleep(0)  # it took a connection and sent
        await pool._lock.acquire()
        try:
            await asyncio.sleep(0.05)  # its reply came; it waits for the lock to give it back
            task.cancel()
            await outcome(task)
        finally:
            pool._lock.release()
        left = await settle(c)
        await pool.disconnect()  # a leaked connection's socket too
        await c.aclose()
        assert left == 0

    asyncio.run(main())


def test_redis_pys_own_calls_leak_nothing_when_cancelled_on_the_pools_lock(
    module_server: RedisProcess, ctl: redis.Redis
) -> None:
    """The control of the xfail above: get_job (redis-py's pipeline) and a plain GET, cancelled
    the same way, give their connections back."""

    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "kq2")
        await three(aq)
        pool = c.connection_pool
        for call in (lambda: aq.get_job("job-a"), lambda: c.get("x")):
            task = asyncio.ensure_future(call())
            for _ in range(3):
                await asyncio.sleep(0)
            await pool._lock.acquire()
            try:
                await asyncio.sleep(0.05)
                task.cancel()
                await outcome(task)
            finally:
                pool._lock.release()
            assert await settle(c) == 0
        await answers_are_their_own(aq)
        await c.aclose()

    asyncio.run(main())


def test_many_concurrent_calls_some_cancelled_each_answer_their_own(
    module_server: RedisProcess, ctl: redis.Redis
) -> None:
    """40 concurrent reads and enqueues, every third cancelled at a varied step."""

    async def main() -> None:
        c = connect_async(module_server.url)
        aq = AsyncQueue(c, "mq")
        ids = [await aq.enqueue("t", {"i": i}, job_id=f"x{i}") for i in range(20)]
        for rnd in range(3):
            tasks: list[tuple[str, asyncio.Task[Any]]] = []
            for i, job_id in enumerate(ids):
                tasks.append((job_id, asyncio.ensure_future(aq.get_job(job_id))))
                new = f"n{rnd}-{i}"
                tasks.append((new, asyncio.ensure_future(aq.enqueue("t", {"n": new}, job_id=new))))
            for step in range(len(tasks)):
                if step % 3 == 0:
                    tasks[step][1].cancel()
                await asyncio.sleep(0)
            for want, task in tasks:
                got = await outcome(task)
                if isinstance(got, asyncio.CancelledError):
                    continue
                if isinstance(got, str):
                    assert got == want
                else:
                    assert got.id == want and got.payload() == {"i": int(want[1:])}
        assert await settle(c) == 0
        await c.aclose()

    asyncio.run(main())


def test_partitioned_calls_cancelled_on_a_slow_server_leave_nothing_behind(
    module_server: RedisProcess, ctl: redis.Redis
) -> None:
    async def main() -> None:
        c = connect_async(module_server.url)
        pq = await AsyncPartitionedQueue.create(c, "pq", partitions=2)
        first = await pq.enqueue_many([JobSpec("t", {"i": i}) for i in range(4)])
        await warm(c)
        again = [JobSpec("t", {"j": j}, job_id=f"pj{j}") for j in range(4)]
        calls: list[Call] = [
            lambda: pq.enqueue_many(again),
            lambda: pq.enqueue("t", {"one": 1}, job_id="p-one"),
            lambda: pq.status(first[0]),
            lambda: pq.get_job(first[1]),
            pq.counts,
        ]
        ctl.client_pause(200)
        got = await asyncio.gather(
            *(asyncio.wait_for(call(), 0.03) for call in calls), return_exceptions=True
        )
        assert all(isinstance(g, TimeoutError) for g in got), got
        await asyncio.sleep(0.25)
        # Cancelled at loop steps too.
        for n in range(8):
            task = asyncio.ensure_future(pq.get_job(first[2]))
            for _ in range(n):
                await asyncio.sleep(0)
            task.cancel()
            await outcome(task)
            job, state, counts = await asyncio.gather(
                pq.get_job(first[3]), pq.status(first[0]), pq.counts()
            )
            assert job.id == first[3] and job.payload() == {"i": 3}
            assert state == JobState.DUE and counts.leased == 0
        assert await settle(c) == 0
        assert await pq.enqueue_many(again) == [s.job_id for s in again]
        assert await pq.enqueue("t", {"one": 2}, job_id="p-one") == "p-one"
        assert (await pq.counts()).due == 4 + 4 + 1
        await c.aclose()

    asyncio.run(main())
