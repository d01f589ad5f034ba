"""Review: the asyncio enqueue batcher (client/enqueue_batcher.py), as AsyncQueue
(client/aio.py) and AsyncPartitionedQueue (client/partitioned_aio.py) use it. Each batched
behaviour is compared with the same calls made alone (the sync Queue, or one caller at a time).
A test marked xfail(strict=True) shows a defect: it asserts the right behaviour and fails today."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

from scheduler import AsyncPartitionedQueue, AsyncQueue, JobSpec, Queue
from scheduler._spawn import RedisProcess
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect, connect_async
from scheduler.core.errors import NoReplicas
from tests.conftest import delete_queue
from tests.fixtures.partitioned import delete_partitioned
from tests.redis_server import is_cluster_run

# One server: the pool and call-order checks below count one node's connections and calls.
pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a single server's pool and order")


async def _steps(n: int = 20) -> None:
    """Let the loop run `n` rounds of ready callbacks (no wall-clock wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


class Held:
    """An AsyncQueue's batcher send that holds each script call until released, then sends it
    to the real server (the test picks the order the server runs calls in flight, as two
    pooled connections may reach it in either order)."""

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

    def held(self) -> list[int]:
        return [k for k, (_, gate, _) in enumerate(self.calls) if not gate.done()]

    async def release(self, k: int) -> None:
        _, gate, answered = self.calls[k]
        gate.set_result(None)
        await answered.wait()
        await _steps()


# -- defects ------------------------------------------------------------------------------------


def test_each_batched_partitioned_caller_whose_answer_was_lost_is_told_its_own_id(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """README 'Partitioned queues': a job sent to a node that did not answer is named in the
    error's `unknown_ids`; re-send it with `job_id=` that id (one already written is found, not
    written twice). Callers that shared one script call share one exception object, and each
    caller's AsyncPartitionedQueue.enqueue overwrites `unknown_ids` on it: a caller that reads
    it after any await (a retry's backoff) re-sends under another caller's id and is answered
    with that caller's job; its own job is never written."""
    pq = PartitionedQueue.create(client, queue_name, partitions=2)

    async def main() -> list[Any]:
        apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
        lose = {"on": True}
        for part in apq.parts:
            real = part._batcher._send

            async def send(args: list[str], real: Any = real) -> Any:
                if lose["on"] and int(args[0]) > 1:  # a shared call: its connection drops
                    raise redis.ConnectionError("Connection closed by server.")
                return await real(args)

            part._batcher._send = send

        async def caller(i: int) -> str:
            try:
                return await apq.enqueue("t", {"n": i})
            except redis.ConnectionError as err:
                await asyncio.sleep(0.01)  # a retry's backoff
                lose["on"] = False
                (job_id,) = err.unknown_ids  # type: ignore[attr-defined]
                return await apq.enqueue("t", {"n": i}, job_id=job_id)

        try:
            return list(await asyncio.gather(*(caller(i) for i in range(10))))
        finally:
            await apq.aclose()

    try:
        ids = asyncio.run(main())
        payloads = {i: pq.get_job(i).payload() for i in set(ids)}
        assert [payloads[i] for i in ids] == [{"n": n} for n in range(10)]
        assert pq.counts().due == 10
    finally:
        delete_partitioned(client, pq)


@pytest.mark.parametrize("parent_by", ["enqueue", "enqueue_many"])
def test_a_partitioned_child_waits_for_its_parents_call_in_flight(
    redis_url: str, client: redis.Redis, queue_name: str, parent_by: str
) -> None:
    """AsyncQueue: enqueue_many naming in `after` a job whose enqueue is in flight waits for
    that call, and a batched enqueue naming a job an enqueue_many in flight writes waits for
    it (enqueue_batcher.py `alone`, tests/test_batcher_alone_order.py), else the server may run
    the child's call first (a pooled connection's handshake is enough) and refuse it ('no
    such job') while the parent's caller is told its job was written. AsyncPartitionedQueue
    (same routing: the child goes to its parent's partition) sends the other call at once."""
    pq = PartitionedQueue.create(client, queue_name, partitions=2)

    async def main() -> list[Any]:
        apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
        # Every call of the two, held until released: the batched enqueues of the parent's
        # partition (its batcher's send) and enqueue_many's driver call (_run_many).
        gates: list[asyncio.Future[None]] = []
        part = apq.parts[apq.layout.partition_of_id("parent-1")]
        send, run_many = part._batcher._send, apq._run_many

        async def hold() -> None:
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            gates.append(gate)
            await gate

        async def held_send(args: list[str]) -> Any:
            await hold()
            return await send(args)

        async def held_many(*args: Any, **kwargs: Any) -> Any:
            await hold()
            return await run_many(*args, **kwargs)

        part._batcher._send = held_send
        apq._run_many = held_many  # type: ignore[method-assign]
        try:
            if parent_by == "enqueue":
                parent: Any = asyncio.ensure_future(apq.enqueue("t", job_id="parent-1"))
                await _steps()
                child: Any = asyncio.ensure_future(
                    apq.enqueue_many([JobSpec("t", after=["parent-1"])])
                )
            else:
                parent = asyncio.ensure_future(apq.enqueue_many([JobSpec("t", job_id="parent-1")]))
                await _steps()
                child = asyncio.ensure_future(apq.enqueue("t", after=["parent-1"]))
            await _steps()
            assert len(gates) >= 1
            # The server runs the call that reached it last first, until both are answered.
            while not (parent.done() and child.done()):
                waiting = [g for g in gates if not g.done()]
                if waiting:
                    waiting[-1].set_result(None)
                await _steps(50)
            return list(await asyncio.gather(parent, child, return_exceptions=True))
        finally:
            await apq.aclose()

    try:
        got = asyncio.run(main())
        assert got[0] in ("parent-1", ["parent-1"])
        assert not isinstance(got[1], BaseException), f"the child's caller got {got[1]!r}"
        child_id = got[1][0] if isinstance(got[1], list) else got[1]
        assert pq.status(child_id) == "held"  # waits for its parent
    finally:
        delete_partitioned(client, pq)


def test_a_batch_refused_by_the_whole_server_answers_its_callers_in_a_few_round_trips(
    module_server: RedisProcess, queue_name: str
) -> None:
    """A server that refuses every write for now (min-replicas-to-write with a replica lost,
    maxmemory reached: Redis refuses a script's first write) refuses a batch of n callers; the
    batcher sends it again in halves, one half after the other, down to one job per call: 2n-1
    script calls in sequence. Each caller gets the right error, but the last one only after
    ~2n round trips (200 callers at 5 ms: 2 s; a lone call: one round trip), and while it
    lasts the queue's batched calls drain at about one caller per round trip, so a web app
    enqueueing faster than that piles up waiting callers for the whole incident."""
    ctl = connect(module_server.url)
    trips: list[int] = []  # jobs per round trip: a script call, or a pipeline of one-job calls

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(module_server.url), queue_name)
        real, real_each = aq._batcher._send, aq._batcher._send_each
        assert real_each is not None

        async def send(args: list[str]) -> Any:
            trips.append(int(args[0]))
            return await real(args)

        async def send_each(calls: list[list[str]]) -> list[Any]:
            trips.append(len(calls))
            return await real_each(calls)

        aq._batcher._send, aq._batcher._send_each = send, send_each
        try:
            got = await asyncio.gather(
                *(aq.enqueue("t", {"n": i}) for i in range(200)), return_exceptions=True
            )
            return list(got)
        finally:
            await aq.aclose()

    ctl.config_set("min-replicas-to-write", 1)
    try:
        got = asyncio.run(main())
    finally:
        ctl.config_set("min-replicas-to-write", 0)
        ctl.close()
    assert {type(g) for g in got} == {NoReplicas}  # each caller's answer is right
    # The lone calls sent at once, the batch, and its jobs again in one pipeline: a few round
    # trips (halving down to one job a call made 2n-1, one after another).
    assert sum(trips) >= 200 and len(trips) <= 8, trips


def test_concurrent_partitioned_enqueues_share_calls_within_the_pool(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """docs/guide/manual.md 'asyncio': 128 request handlers enqueueing at once cost a few round
    trips and two connections instead of 128 (redis.asyncio's pool refuses calls past 100 with
    MaxConnectionsError), and `AsyncPartitionedQueue.enqueue` does the same. With 64
    partitions (limit 1,024) the round robin gives each partition two callers, both sent at
    once: 128 connections, and 28 callers get MaxConnectionsError."""
    pq = PartitionedQueue.create(client, queue_name, partitions=64)

    async def main() -> list[Any]:
        apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
        try:
            calls = (apq.enqueue("t", {"n": i}) for i in range(128))
            return list(await asyncio.gather(*calls, return_exceptions=True))
        finally:
            await apq.aclose()

    try:
        got = asyncio.run(main())
        refused = [type(g).__name__ for g in got if not isinstance(g, str)]
        assert refused == [], f"{len(refused)} of 128 callers refused: {set(refused)}"
        assert pq.counts().due == 128
    finally:
        delete_partitioned(client, pq)


# -- checked and found right ---------------------------------------------------------------------


def test_a_batch_refused_for_every_write_answers_each_caller_as_alone(
    module_server: RedisProcess, queue_name: str
) -> None:
    """The fix of the test above sends a refused-for-now batch again as one pipeline of one-job
    calls: a caller re-sending a job already written (which writes nothing, so NOREPLICAS does
    not refuse it) is answered with its id, as alone (tests/test_review_real_replica.py); the
    others get NoReplicas, each its own error object; the callers' order is kept."""
    ctl = connect(module_server.url)
    sizes: list[int] = []

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(module_server.url), queue_name)
        real = aq._batcher._send

        async def send(args: list[str]) -> Any:
            sizes.append(int(args[0]))
            return await real(args)

        aq._batcher._send = send
        try:
            assert await aq.enqueue("t", {"n": 1}, job_id="e1") == "e1"
            assert await aq.enqueue("t", {"n": 3}, job_id="e3") == "e3"
            ctl.config_set("min-replicas-to-write", 1)
            fill = [aq.enqueue("t", job_id=f"f{i}") for i in range(2)]  # in flight: the rest wait
            batch = [aq.enqueue("t", {"n": n}, job_id=f"e{n}") for n in range(5)]
            return list(await asyncio.gather(*fill, *batch, return_exceptions=True))
        finally:
            ctl.config_set("min-replicas-to-write", 0)
            await aq.aclose()

    try:
        got = asyncio.run(main())
        assert sizes[2:] == [1, 1, 5]  # the two first ones alone, then the batch, refused once
        assert [type(g) for g in got[:2]] == [NoReplicas] * 2
        assert got[3] == "e1" and got[5] == "e3"
        refused = [got[i] for i in (2, 4, 6)]
        assert [type(g) for g in refused] == [NoReplicas] * 3
        assert len({id(g) for g in refused}) == 3
        q = Queue(ctl, queue_name)
        assert q.counts().due == 2 and q.get_job("e3").payload() == {"n": 3}
    finally:
        delete_queue(ctl, Queue(ctl, queue_name))
        ctl.close()


def test_batches_stay_bounded_and_lose_nothing_under_a_large_burst(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """2,500 concurrent callers, 30 of them with 100 KB payloads: no script call carries more
    than 1,000 jobs (enqueue.lua's MAX_BATCH) or, unless it holds one job, more than 1 MiB of
    fields (a script holds every client of the server), and every job is written once."""
    q = Queue(client, queue_name)
    sizes: list[tuple[int, int]] = []

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        real = aq._batcher._send

        async def send(args: list[str]) -> Any:
            sizes.append((int(args[0]), sum(len(a) for a in args[1:])))
            return await real(args)

        aq._batcher._send = send
        try:
            calls = [
                aq.enqueue("t", {"n": i, "pad": "x" * 100_000 if i % 83 == 0 else ""})
                for i in range(2_500)
            ]
            return list(await asyncio.gather(*calls, return_exceptions=True))
        finally:
            await aq.aclose()

    try:
        got = asyncio.run(main())
        assert all(isinstance(g, str) for g in got) and len(set(got)) == 2_500
        assert sum(n for n, _ in sizes) == 2_500
        assert max(n for n, _ in sizes) <= 1_000
        assert all(chars <= 1 << 20 for n, chars in sizes if n > 1), sizes
        assert len(sizes) < 100  # shared calls
        assert q.counts().due == 2_500
    finally:
        delete_queue(client, q)


# One batch's callers: a key given twice where one of its two jobs is refused (a missing
# parent), so the batch is refused and sent again in halves; each caller must get what the
# sync Queue answers the same calls made in turn.
KEY_CLASH: list[dict[str, Any]] = [
    {"key": "K1", "job_id": "a1"},
    {"key": "K1", "job_id": "b1", "after": ["missing"]},  # K1 is a1's: answered 'a1'
    {"key": "K2", "job_id": "a2", "after": ["missing"]},  # refused: K2 stays free
    {"key": "K2", "job_id": "b2"},  # so this one takes it
    {"job_id": "c", "after": ["a1"]},  # waits for a1 (a parent of an earlier caller)
    {"key": "K3", "job_id": "a3", "after": ["a2"]},  # a refused parent: refused
    {"key": "K3", "job_id": "b3"},
]


def test_a_refused_batch_with_a_key_given_twice_answers_as_in_turn(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    sync_q, async_q = Queue(client, queue_name + "-s"), Queue(client, queue_name + "-a")

    def in_turn() -> list[Any]:
        out: list[Any] = []
        for kw in KEY_CLASH:
            try:
                out.append(sync_q.enqueue("t", dict(kw), **kw))
            except Exception as exc:
                out.append((type(exc).__name__, str(exc)))
        return out

    async def shared() -> tuple[list[Any], list[int]]:
        aq = AsyncQueue(connect_async(redis_url), async_q.name)
        held = Held(aq)
        try:
            fill = [asyncio.ensure_future(aq.enqueue("t")) for _ in range(2)]
            await _steps()
            calls = [asyncio.ensure_future(aq.enqueue("t", dict(kw), **kw)) for kw in KEY_CLASH]
            await _steps()
            while held.held():
                await held.release(held.held()[0])
            await asyncio.gather(*fill)
            got = await asyncio.gather(*calls, return_exceptions=True)
            out = [(type(g).__name__, str(g)) if isinstance(g, BaseException) else g for g in got]
            return out, [int(args[0]) for args, _, _ in held.calls]
        finally:
            await aq.aclose()

    try:
        want = in_turn()
        got, sizes = asyncio.run(shared())
        # a1, b1, a2 and b2 share one call (refused, then sent again in halves); c and a3, whose
        # parents have keys, go in a later call (enqueue_batcher.py _names_one_of).
        assert sizes[:3] == [1, 1, 4]
        assert got == want
        assert got[1] == "a1" and got[3] == "b2" and got[6] == "b3"
        for job_id in ("a1", "b2", "c", "b3"):
            a, s = async_q.get_job(job_id), sync_q.get_job(job_id)
            assert (a.state, a.payload(), a.fields.get("parents")) == (
                s.state,
                s.payload(),
                s.fields.get("parents"),
            )
        a_counts, s_counts = async_q.counts(), sync_q.counts()
        assert a_counts.due == s_counts.due + 2  # and the two calls that went first
        assert a_counts.held_waiting == s_counts.held_waiting == 1
    finally:
        delete_queue(client, sync_q)
        delete_queue(client, async_q)


def test_refused_partitioned_callers_of_one_batch_each_get_their_own_error(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Beside the shared connection error above: callers of one partition's batch that the
    server refuses (a missing parent) each get an error object of their own, naming no job of
    another caller, and the other callers' jobs are written."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)

    async def main() -> list[Any]:
        apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
        try:
            calls = [
                apq.enqueue("t", {"n": i}, after=["p0.missing"] if i % 7 == 3 else None)
                for i in range(60)
            ]
            return list(await asyncio.gather(*calls, return_exceptions=True))
        finally:
            await apq.aclose()

    try:
        got = asyncio.run(main())
        bad = [g for g in got if isinstance(g, BaseException)]
        assert [i for i, g in enumerate(got) if isinstance(g, BaseException)] == [
            i for i in range(60) if i % 7 == 3
        ]
        assert len({id(e) for e in bad}) == len(bad)
        for e in bad:
            assert "after=p0.missing" in str(e), e
            assert getattr(e, "unknown_ids", []) == [] and getattr(e, "written_ids", []) == []
        assert pq.counts().due == 60 - len(bad)
    finally:
        delete_partitioned(client, pq)
