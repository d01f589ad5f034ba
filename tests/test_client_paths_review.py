"""A review of two client surfaces: the asyncio enqueue batcher (client/aio.py,
client/enqueue_batcher.py: concurrent `await aq.enqueue(...)` calls share script calls) and the
partitioned queues (client/partitioned*.py). Tests that show a defect fail on the code as
reviewed; the others guard behaviour checked to be right."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler import AsyncQueue, BadArgument, JobSpec, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from tests.conftest import delete_queue
from tests.fixtures.partitioned import delete_partitioned


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
        self.passing = False  # set: calls go straight through
        aq._batcher._send = self.send

    async def send(self, args: list[str]) -> Any:
        if self.passing:
            return await self.real(args)
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


@pytest.mark.parametrize("split_by", ["parent's key", "size"])
def test_a_child_split_off_its_parents_batch_is_not_run_before_the_parent(
    redis_url: str, client: redis.Redis, queue_name: str, split_by: str
) -> None:
    """Defect: callers P (a job with a fresh idempotency key, job_id 'parent') and C
    (after=['parent']) wait in order behind two calls in flight. The batcher puts C in a later
    call than P on purpose (enqueue_batcher.py _names_one_of: 'in turn, the id names what
    stands under it then'), but it starts that later call as soon as a second call in flight
    comes back, while P's call is still unanswered: the two go on two connections at once, and
    when the server runs C's first, C's caller gets BadArgument 'after=parent (no such job)'
    although P's caller, ahead of it, is told its job was written. In one call, or in turn,
    C is accepted and waits for P. A user sees a child enqueued after its parent refused
    (its job lost unless the caller retries). The same holds for a parent without a key when
    the two jobs did not fit one call (MAX_BYTES): `size`, with large payloads."""
    q = Queue(client, queue_name)

    async def main() -> list[Any]:
        aq = AsyncQueue(connect_async(redis_url), queue_name, max_payload_bytes=800_000)
        sends = HeldSends(aq)
        big = "x" * 600_000 if split_by == "size" else None  # two of them pass MAX_BYTES
        key = "K" if split_by == "parent's key" else None
        try:
            first = [asyncio.ensure_future(aq.enqueue("t")) for _ in range(2)]
            await _steps()
            assert len(sends.calls) == 2  # two calls in flight: the next callers wait
            parent = asyncio.ensure_future(aq.enqueue("t", big, key=key, job_id="parent"))
            child = asyncio.ensure_future(aq.enqueue("t", big, after=["parent"], job_id="child"))
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


# Each caller's call, as (args, kwargs) of enqueue: one batch mixing what enqueue.lua resolves
# inside one call (a key twice, an id twice, a parent of the same batch, a bad parent).
MIXED: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("t", {"n": 1}), {"key": "K", "job_id": "k1"}),
    (("t", {"n": 2}), {"key": "K", "job_id": "k2"}),  # the key is k1's: answered 'k1'
    (("t", {"n": 3}), {"job_id": "j"}),
    (("t", {"n": 4}), {"job_id": "j"}),  # a re-send: 'j', its first payload kept
    (("t", {"n": 5}), {"job_id": "c1", "concurrency_key": "ck", "concurrency_limit": 1}),
    (("t", {"n": 6}), {"job_id": "c2", "concurrency_key": "ck", "concurrency_limit": 1}),
    (("t", {"n": 7}), {"job_id": "hi", "priority": 9}),
    (("t", {"n": 8}), {"job_id": "bad", "after": ["nope"]}),  # refused: this caller only
    (("t", {"n": 9}), {"job_id": "kid", "after": ["j"]}),  # waits for 'j'
    (("t", {"n": 10}), {"job_id": "late", "delay_ms": 3_600_000, "start_within_ms": 1000}),
]


def _outcome(got: Any) -> Any:
    return type(got).__name__ if isinstance(got, BaseException) else got


def _state(q: Queue, ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in ids:
        try:
            job = q.get_job(i)
        except Exception as exc:
            out[i] = type(exc).__name__
        else:
            out[i] = (str(job.state), job.payload(), job.fields.get("priority"))
    return out


def test_a_shared_call_answers_and_writes_as_the_sync_queue_does_in_turn(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Held: callers that share one script call get, each, what the sync Queue answers for the
    same calls in turn (a key given twice names the first job, an id given twice keeps the
    first payload, a bad parent refuses its own caller only, a parent of the same batch is
    waited for), and the queue holds the same jobs; the concurrency key lets one run."""
    sync_q, async_name = Queue(client, queue_name + "-sync"), queue_name + "-async"
    async_q = Queue(client, async_name)

    def alone() -> list[Any]:
        out: list[Any] = []
        for args, kwargs in MIXED:
            try:
                out.append(sync_q.enqueue(*args, **kwargs))
            except Exception as exc:
                out.append(exc)
        return out

    async def shared() -> tuple[list[Any], list[int]]:
        aq = AsyncQueue(connect_async(redis_url), async_name)
        sends = HeldSends(aq)
        try:
            fill = [asyncio.ensure_future(aq.enqueue("t", job_id=f"f{i}")) for i in range(2)]
            await _steps()
            calls = [asyncio.ensure_future(aq.enqueue(*a, **k)) for a, k in MIXED]
            await _steps()
            while sends.held():
                await sends.release(sends.held()[0])
            await asyncio.gather(*fill)
            got = await asyncio.gather(*calls, return_exceptions=True)
            return list(got), [int(args[0]) for args, _, _ in sends.calls]
        finally:
            await aq.aclose()

    try:
        want = alone()
        got, sizes = asyncio.run(shared())
        assert sizes[:3] == [1, 1, len(MIXED)]  # the ten callers went out as one call
        assert [_outcome(g) for g in got] == [_outcome(w) for w in want]
        assert got[1] == "k1" and got[3] == "j" and isinstance(got[7], BadArgument)
        ids = ["k1", "k2", "j", "c1", "c2", "hi", "bad", "kid", "late"]
        assert _state(async_q, ids) == _state(sync_q, ids), _state(sync_q, ids)
        taken = {j.id for j in async_q.claim("w", limit=20).jobs}
        assert taken - {"f0", "f1"} == {j.id for j in sync_q.claim("w", limit=20).jobs}
        assert "hi" in taken and len(taken & {"c1", "c2"}) == 1 and "kid" not in taken
    finally:
        delete_queue(client, sync_q)
        delete_queue(client, async_q)


def test_a_caller_cancelled_while_it_waits_writes_nothing_and_its_retry_writes_once(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Held: a caller cancelled before its batch went out sends nothing (no job, its key not
    taken), the callers beside it are written, and a retry with the key writes its job once."""
    q = Queue(client, queue_name)

    async def main() -> tuple[list[Any], str, str]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        sends = HeldSends(aq)
        try:
            fill = [asyncio.ensure_future(aq.enqueue("t")) for _ in range(2)]
            await _steps()
            before = asyncio.ensure_future(aq.enqueue("t", {"n": 1}, key="A"))
            gone = asyncio.ensure_future(aq.enqueue("t", {"n": 2}, key="C", job_id="gone"))
            after = asyncio.ensure_future(aq.enqueue("t", {"n": 3}, key="B"))
            await _steps()
            gone.cancel()
            while sends.held():
                await sends.release(sends.held()[0])
            got = await asyncio.gather(*fill, before, gone, after, return_exceptions=True)
            sends.passing = True
            retried = await aq.enqueue("t", {"n": 2}, key="C", job_id="again")
            same = await aq.enqueue("t", {"n": 2}, key="C", job_id="third")
            return list(got), retried, same
        finally:
            await aq.aclose()

    try:
        got, retried, same = asyncio.run(main())
        assert isinstance(got[3], asyncio.CancelledError)
        assert all(isinstance(g, str) for k, g in enumerate(got) if k != 3)
        assert retried == same == "again"
        assert q.counts().due == 5  # two fillers, A, B and the retried C: not 'gone'
        with pytest.raises(Exception, match="gone"):
            q.get_job("gone")
    finally:
        delete_queue(client, q)


def test_a_caller_cancelled_once_its_batch_went_out_is_answered_as_a_retry_would_be(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Held: a caller cancelled while its shared call is in flight gets CancelledError, its
    job may be written (as a lone call's), and a retry with the same key is answered with that
    job, not a second one; the other callers of the call get their own ids."""
    q = Queue(client, queue_name)

    async def main() -> tuple[list[Any], str]:
        aq = AsyncQueue(connect_async(redis_url), queue_name)
        sends = HeldSends(aq)
        try:
            fill = [asyncio.ensure_future(aq.enqueue("t")) for _ in range(2)]
            await _steps()
            mine = asyncio.ensure_future(aq.enqueue("t", key="M", job_id="mine"))
            other = asyncio.ensure_future(aq.enqueue("t", job_id="other"))
            await _steps()
            await sends.release(0)  # 'mine' and 'other' go out together, held
            assert sends.ids(2) == ["mine", "other"]
            mine.cancel()
            while sends.held():
                await sends.release(sends.held()[0])
            got = await asyncio.gather(*fill, mine, other, return_exceptions=True)
            sends.passing = True
            return list(got), await aq.enqueue("t", key="M", job_id="retry")
        finally:
            await aq.aclose()

    try:
        got, retried = asyncio.run(main())
        assert isinstance(got[2], asyncio.CancelledError) and got[3] == "other"
        assert retried == "mine" and q.status("mine") == "due"
        assert q.counts().due == 4
    finally:
        delete_queue(client, q)


# -- partitioned queues ------------------------------------------------------------------------


def test_an_async_partitioned_enqueue_whose_answer_is_lost_names_the_id_to_resend(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Defect (sync/async parity): PartitionedQueue.enqueue makes the job's id itself
    (`p<k>.<id>`), so a ConnectionError carries it as `unknown_ids` (README 'Partitioned
    queues': re-send with `job_id=` those ids, one already written is found, not written
    twice). AsyncPartitionedQueue.enqueue ('every method of the sync one') raises the bare
    error: the id it made is lost, and a caller whose answer was lost after the script ran can
    only enqueue again under a new id, so the job is written twice."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)

    # The sync client's error, from a server that cannot be reached (nothing written).
    down = PartitionedQueue(
        redis.Redis(
            unix_socket_path="/nonexistent/review.sock",
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),
        ),
        pq.layout,
    )
    with pytest.raises(redis.ConnectionError) as sync_err:
        down.enqueue("t", None)
    assert len(getattr(sync_err.value, "unknown_ids", [])) == 1

    async def main() -> tuple[Any, str]:
        apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
        real = [part._batcher._send for part in apq.parts]
        for part, send in zip(apq.parts, real, strict=True):

            async def lost(args: list[str], send: Any = send) -> Any:
                await send(args)  # the script runs, then its answer is lost
                raise redis.ConnectionError("Connection closed by server.")

            part._batcher._send = lost
        try:
            with pytest.raises(redis.ConnectionError) as err:
                await apq.enqueue("t", {"order": 42})
            for part, send in zip(apq.parts, real, strict=True):
                part._batcher._send = send
            ids = getattr(err.value, "unknown_ids", None)
            # The documented recovery: re-send with the id the error names.
            again = await apq.enqueue("t", {"order": 42}, job_id=ids[0]) if ids else ""
            return ids, again
        finally:
            await apq.aclose()

    try:
        ids, again = asyncio.run(main())
        assert ids is not None and len(ids) == 1, (
            "the async error carries no id to re-send with (the sync one does)"
        )
        assert again == ids[0] and pq.counts().due == 1
    finally:
        delete_partitioned(client, pq)


@pytest.mark.parametrize("change", ["pause", "set_dead_retention"])
def test_a_plain_queue_on_a_partitioned_name_does_not_answer_a_change_it_did_not_make(
    client: redis.Redis, queue_name: str, change: str
) -> None:
    """Defect: a plain Queue opened on a partitioned queue's name (`Queue.from_url(url,
    "emails")`, which the README says stays plain) is refused an enqueue or a schedule
    (lib/util.lua partitioned_err: 'a plain Queue would write where no worker looks'), but
    `pause()` answers 'paused' and `set_dead_retention(...)` returns as done, writing under the
    logical name that no worker or partition reads: an operator who pauses the queue in an
    incident is told it is paused while every worker goes on claiming its jobs (and a dead
    list keeps growing past the retention set). Either is refused as enqueue is, or it acts
    on the partitions."""
    pq = PartitionedQueue.create(client, queue_name, partitions=2)
    try:
        job = pq.enqueue("t", None, job_id="p0.a", max_attempts=1)
        plain = Queue(client, queue_name)
        with pytest.raises(BadArgument, match="partitioned"):
            plain.enqueue("t", None)  # the guard the other writes have
        try:
            if change == "pause":
                answer = plain.pause()
            else:
                plain.set_dead_retention(max_count=0)
        except BadArgument:
            return  # refused, as enqueue: nothing to check further
        if change == "pause":
            assert answer == "paused"
            claimed = [j.id for j in pq.claim("w", limit=5).jobs]
            assert claimed == [], f"told 'paused', yet {claimed} were claimed"
        else:
            leased = pq.claim("w", limit=5).jobs
            pq.fail(leased[0].id, leased[0].token, ValueError("x"), retryable=False)
            assert pq.dead_ids() == [], f"retention max_count=0 set, yet {job} is kept dead"
    finally:
        delete_partitioned(client, pq)


def test_async_partitioned_flow_limits_hold_per_partition_as_documented(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Held (docs/flow-control.md, README 'Partitioned queues'): concurrent async enqueues of
    one concurrency key (limit 1) without ids go round robin, so the merged claim leases one
    per partition (N*K); given ids tagged with one partition, the key's K holds."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    limit: dict[str, Any] = {"concurrency_key": "tenant:7", "concurrency_limit": 1}

    async def enqueue(tagged: bool) -> list[str]:
        apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
        try:
            ids = [f"p1.{tagged}-{i}" if tagged else None for i in range(9)]
            return list(
                await asyncio.gather(*(apq.enqueue("t", None, job_id=i, **limit) for i in ids))
            )
        finally:
            await apq.aclose()

    try:
        spread = asyncio.run(enqueue(False))
        assert sorted(pq.layout.partition_of_id(i) for i in spread) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        first = pq.claim("w", limit=20, lease_ms=60_000)
        assert len(first.jobs) == 3  # one per partition
        for part in pq.parts:
            delete_queue(client, part)
        asyncio.run(enqueue(True))
        assert [p.counts().due for p in pq.parts] == [0, 9, 0]
        assert len(pq.claim("w", limit=20, lease_ms=60_000).jobs) == 1
    finally:
        delete_partitioned(client, pq)


def test_dead_letters_across_partitions_sync_and_async_agree(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """Held: jobs parked in every partition, one of them written to a partition's own queue
    (its id routes elsewhere): the sync and async clients list the same dead ids, requeue and
    purge by id where each job is (the stray too), and a bulk purge of the listing empties
    every partition's dead list."""
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        ids = pq.enqueue_many([JobSpec("t", {"n": i}, max_attempts=1) for i in range(6)])
        stray_home = next(k for k in range(3) if pq.layout.partition_of_id("stray") != k)
        pq.parts[stray_home].enqueue("t", None, job_id="stray", max_attempts=1)
        for part in pq.parts:
            for job in part.claim("w", limit=10).jobs:
                part.fail(job.id, job.token, ValueError("boom"), retryable=False)
        everyone = sorted([*ids, "stray"])

        async def async_side() -> tuple[list[str], int, int, list[str]]:
            apq = await AsyncPartitionedQueue.open(connect_async(redis_url), queue_name)
            try:
                listed = await apq.dead_ids()
                requeued = await apq.requeue_dead(["stray", ids[0]])
                purged = await apq.purge_dead([ids[1], ids[1], "not-dead"])
                return listed, requeued, purged, await apq.dead_ids()
            finally:
                await apq.aclose()

        sync_listed = pq.dead_ids()
        assert sorted(sync_listed) == everyone
        listed, requeued, purged, after = asyncio.run(async_side())
        assert listed == sync_listed  # the same merge, newest first
        assert (requeued, purged) == (2, 1)
        assert pq.status("stray") == "due" and pq.parts[stray_home].status("stray") == "due"
        assert sorted(after) == sorted(set(everyone) - {"stray", ids[0], ids[1]})
        assert pq.dead_ids() == after
        assert pq.purge_dead(pq.dead_ids()) == len(after)  # the bulk purge: every partition
        assert pq.dead_ids() == [] and sum(p.counts().dead for p in pq.parts) == 0
    finally:
        delete_partitioned(client, pq)
