"""Review of the app developer's API across its four clients (Queue, AsyncQueue,
PartitionedQueue, AsyncPartitionedQueue), the task handles, chain and open_queue(_async): what
one client refuses, writes or answers, its twins refuse, write and answer alike, and the types a
user's `mypy --strict` sees are the ones the docs promise.

Defects are strict xfails asserting the correct behaviour; the passing tests pin parity found
correct that no other test checks (tests/test_api_parity_audit.py, tests/test_parity.py cover
the rest)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import (
    AsyncPartitionedQueue,
    AsyncQueue,
    BadArgument,
    InvalidPayload,
    JobSpec,
    PartitionedQueue,
    Queue,
)
from scheduler.client.chain import achain, chain
from scheduler.core.connection import connect_async
from scheduler.core.keys import QueueKeys
from scheduler.core.partitions import Layout, meta_key
from tests.conftest import dump_queue
from tests.fixtures.partitioned import MakePq

pytestmark = pytest.mark.pq(partitions=3, suffix="-p")  # beside the plain queue `q`


def _mypy(tmp: Path, cache: Path, source: str) -> tuple[int, str]:
    """`mypy --strict` on a user's module, run from a directory of its own (no project config)."""
    (tmp / "user_app.py").write_text(textwrap.dedent(source))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), "user_app.py"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


def _drop(client: redis.Redis, name: str) -> None:
    """Every key of a partitioned queue `name` (its record, and each partition's)."""
    names = [name, *Layout.create(name, 4).names, *Layout.create(name, 2).names]
    for queue in names:
        keys = list(client.scan_iter(match=QueueKeys(queue).pattern(), count=1000))
        if keys:
            client.delete(*keys)


# -- defects ---------------------------------------------------------------------------------


def test_create_refusing_a_queue_option_writes_no_layout_record(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    """`PartitionedQueue.create(c, name, partitions=4, wait_replicas=-1)` (or result_ttl_ms=0,
    or a misspelt option) raises, as Queue(...) does with that option, but only after it wrote
    `sched:{name}:partitions`: the name is now a 4-partition queue that nobody created (a plain
    Queue of that name is refused 'is partitioned', and the corrected call with another count
    is refused PartitionMismatch). A refusal at the boundary must change nothing."""
    sync_name, async_name = queue_name + "-s", queue_name + "-a"
    bad: list[dict[str, Any]] = [{"wait_replicas": -1}, {"result_ttl_ms": 0}, {"wait_replica": 1}]
    try:
        for kwargs in bad:
            with pytest.raises((BadArgument, TypeError)):
                Queue(client, sync_name, **kwargs)  # the plain client refuses each
            with pytest.raises((BadArgument, TypeError)):
                PartitionedQueue.create(client, sync_name, partitions=4, **kwargs)

        async def main() -> None:
            aclient = connect_async(redis_url)
            try:
                for kwargs in bad:
                    with pytest.raises((BadArgument, TypeError)):
                        await AsyncPartitionedQueue.create(
                            aclient, async_name, partitions=4, **kwargs
                        )
            finally:
                await aclient.aclose()

        asyncio.run(main())
        assert [client.exists(meta_key(n)) for n in (sync_name, async_name)] == [0, 0]
        # The corrected call may choose another count: nothing was taken.
        assert PartitionedQueue.create(client, sync_name, partitions=2).layout.n == 2
    finally:
        _drop(client, sync_name)
        _drop(client, async_name)


def test_partitioned_enqueue_many_written_ids_lists_every_job_written(
    make_pq: MakePq, redis_url: str
) -> None:
    """README 'Partitioned queues': a batch the server refuses writes nothing, and 'the error's
    `written_ids` lists those [written] (call order), so only the refused jobs need re-sending'.
    With `batch_size` below a partition's share, the batches of the refusing partition before
    and after the refused one are written too (docs/flow-control.md 'Across batches'), yet
    written_ids leaves them out: on a 1-partition queue it is [] while two jobs were written,
    and a caller that re-sends every job not in written_ids enqueues those two again (their
    ids were made by the client: a re-send makes new ones)."""
    specs = [
        JobSpec("t", {"i": 0}),
        JobSpec("t", {"i": 1}, after=["p0.no-such-parent"]),
        JobSpec("t", {"i": 2}),
    ]

    sync_pq = make_pq(partitions=1, suffix="-one")
    with pytest.raises(BadArgument) as got:
        sync_pq.enqueue_many(specs, batch_size=1)
    written = [j.id for j in sync_pq.list_jobs("due")]
    assert len(written) == 2  # the pipeline wrote the batches before and after the refused one
    assert sorted(getattr(got.value, "written_ids", [])) == sorted(written)

    async_pq = make_pq(partitions=1, suffix="-aone")

    async def main() -> tuple[list[str], list[str]]:
        aclient = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(aclient, async_pq.name)
            try:
                await apq.enqueue_many(specs, batch_size=1)
            except BadArgument as exc:
                return list(getattr(exc, "written_ids", [])), [
                    j.id for j in await apq.list_jobs("due")
                ]
            raise AssertionError("not refused")
        finally:
            await aclient.aclose()

    named, due = asyncio.run(main())
    assert len(due) == 2 and sorted(named) == sorted(due)


def test_a_redis_cluster_client_passes_the_users_type_check(
    tmp_path: Path, mypy_cache: Path
) -> None:
    """README 'Redis Cluster' and docs/cluster.md: 'pass a redis.cluster.RedisCluster /
    redis.asyncio.cluster.RedisCluster client yourself' to Queue(...) / AsyncQueue(...), which
    works at run time; a user's `mypy --strict` refuses each such call ('incompatible type
    "RedisCluster"; expected "Redis"'), and PartitionedQueue.create / open_queue alike, while
    AsyncPartitionedQueue.create accepts it (its client is Any)."""
    code, out = _mypy(
        tmp_path,
        mypy_cache,
        """
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        from redis.cluster import RedisCluster

        from scheduler import AsyncQueue, PartitionedQueue, Queue, open_queue


        def sync_side(rc: RedisCluster) -> None:
            Queue(rc, "emails").enqueue("send", {})
            PartitionedQueue.create(rc, "parted", partitions=4).enqueue("send", {})
            open_queue(rc, "any").enqueue("send", {})


        async def async_side(arc: AsyncRedisCluster) -> None:
            await AsyncQueue(arc, "emails").enqueue("send", {})
        """,
    )
    assert code == 0, out


def test_release_and_complete_many_refuse_none_as_their_twins_do(
    q: Queue, pq: PartitionedQueue, redis_url: str
) -> None:
    """`release(None)` / `complete_many(None)` (a variable left None by a bug) raise BadArgument
    ('leases must be a list of (job_id, token) pairs') from PartitionedQueue and
    AsyncPartitionedQueue, but Queue and AsyncQueue answer [] as if nothing was asked."""
    bad: Any = None
    for target in (pq, q):
        with pytest.raises(BadArgument):
            target.release(bad)
        with pytest.raises(BadArgument):
            target.complete_many(bad)

    async def main() -> None:
        aclient = connect_async(redis_url)
        try:
            for atarget in (
                await AsyncPartitionedQueue.open(aclient, pq.name),
                AsyncQueue(aclient, q.name),
            ):
                with pytest.raises(BadArgument):
                    await atarget.release(bad)
                with pytest.raises(BadArgument):
                    await atarget.complete_many(bad)
        finally:
            await aclient.aclose()

    asyncio.run(main())


def test_a_bad_batch_size_is_refused_with_no_specs_too(
    q: Queue, pq: PartitionedQueue, redis_url: str
) -> None:
    """`enqueue_many([], batch_size=0)` raises BadArgument from Queue and AsyncQueue ('batch_size
    must be in [1, 10000]') but answers [] from both partitioned clients, which refuse the same
    batch_size only once a spec is given: a misconfigured batch size passes every test run
    with an empty list."""
    for target in (q, pq):
        with pytest.raises(BadArgument, match="batch_size"):
            target.enqueue_many([], batch_size=0)

    async def main() -> None:
        aclient = connect_async(redis_url)
        try:
            for atarget in (
                AsyncQueue(aclient, q.name),
                await AsyncPartitionedQueue.open(aclient, pq.name),
            ):
                with pytest.raises(BadArgument, match="batch_size"):
                    await atarget.enqueue_many([], batch_size=0)
        finally:
            await aclient.aclose()

    asyncio.run(main())


# -- checked and found correct ---------------------------------------------------------------


def test_the_users_types_stay_precise_through_open_queue_and_the_handles(
    tmp_path: Path, mypy_cache: Path
) -> None:
    """What open_queue / open_queue_async return (a union of the twins) gives the user precise
    types, not Any: ids are str, claim a ClaimBatch, counts a QueueCounts; a handle keeps its
    function's signature (a call with a wrong payload type is refused) and takes either twin;
    chain / achain answer list[str]."""
    code, out = _mypy(
        tmp_path,
        mypy_cache,
        """
        from scheduler import JobContext, Registry, open_queue, open_queue_async
        from scheduler.client.chain import achain, chain

        registry = Registry()


        @registry.task("resize")
        def resize(payload: dict[str, int], ctx: JobContext) -> int:
            return payload["w"]


        def sync_side(url: str) -> None:
            with open_queue(url, "images") as q:
                reveal_type(q.enqueue("resize", {"w": 1}))
                reveal_type(resize.enqueue(q, {"w": 1}, delay_ms=5))
                reveal_type(q.claim("w").jobs)
                reveal_type(q.counts())
                reveal_type(chain(q, [("resize", {"w": 1})]))
            resize("not a dict", JobContext.for_test())  # type: ignore[arg-type]


        async def async_side(url: str) -> None:
            async with await open_queue_async(url, "images") as aq:
                reveal_type(await aq.enqueue("resize"))
                reveal_type(await resize.aenqueue(aq, {"w": 1}))
                reveal_type(await aq.claim("w"))
                reveal_type(await achain(aq, [("resize", {})]))
        """,
    )
    assert code == 0, out
    revealed = [
        line.split("Revealed type is ")[1] for line in out.splitlines() if "Revealed" in line
    ]
    assert revealed == [
        '"str"',
        '"str"',
        '"list[scheduler.core.models.ClaimedJob]"',
        '"scheduler.core.models.QueueCounts"',
        '"list[str]"',
        '"str"',
        '"str"',
        '"scheduler.core.models.ClaimBatch"',
        '"list[str]"',
    ], out


CHAIN_BAD: list[tuple[Any, dict[str, Any], type[Exception]]] = [
    ([("bad task", 1)], {}, BadArgument),
    ([("a", {1})], {}, InvalidPayload),
    ([("a", 1)], {"key": "k"}, BadArgument),
    ([("a", 1)], {"job_id": "x"}, BadArgument),
    ([("a", 1)], {"debounce": True}, BadArgument),
    ("ab", {}, BadArgument),
    (None, {}, BadArgument),
    ([("a",)], {}, BadArgument),
    ([("a", 1)] * 1001, {}, BadArgument),
    ([("a", 1), ("b", 2)], {"delay_ms": -1}, BadArgument),
    ([("a", 1)], {"max_attempts": 0}, BadArgument),
]


def test_chain_and_achain_refuse_bad_steps_alike_on_all_four_writing_nothing(
    q: Queue, pq: PartitionedQueue, client: redis.Redis, redis_url: str
) -> None:
    """Each bad chain raises the same typed error from chain(Queue), chain(PartitionedQueue),
    achain(AsyncQueue) and achain(AsyncPartitionedQueue), and writes nothing; a good chain
    gives each of them its steps' ids, one partition's on a partitioned queue."""

    def state() -> list[dict[str, object]]:
        return [dump_queue(client, q), *(dump_queue(client, p) for p in pq.parts)]

    before = state()
    for steps, options, error in CHAIN_BAD:
        for target in (q, pq):
            with pytest.raises(error):
                chain(target, steps, **options)

    async def main() -> list[list[str]]:
        aclient = connect_async(redis_url)
        try:
            aq = AsyncQueue(aclient, q.name)
            apq = await AsyncPartitionedQueue.open(aclient, pq.name)
            for steps, options, error in CHAIN_BAD:
                for atarget in (aq, apq):
                    with pytest.raises(error):
                        await achain(atarget, steps, **options)
            assert state() == before
            return [await achain(t, [("a", 1), ("b", 2)]) for t in (aq, apq)]
        finally:
            await aclient.aclose()

    made = asyncio.run(main()) + [chain(t, [("a", 1), ("b", 2)]) for t in (q, pq)]
    assert [len(ids) for ids in made] == [2, 2, 2, 2]
    for ids in (made[1], made[3]):  # the partitioned ones: both steps in one partition
        assert len({pq.layout.partition_of_id(i) for i in ids}) == 1


def test_plain_and_partitioned_queues_answer_one_job_flow_alike(q: Queue, make_pq: MakePq) -> None:
    """The same calls on a plain queue and on a 1- and a 3-partition queue answer the same
    words, states and errors (ids and clocks aside): listing, lease statuses for good, stale,
    duplicate and missing leases, re-sent settlements, results, dead listings."""

    def flow(t: Queue | PartitionedQueue) -> list[object]:
        ids = [t.enqueue("t", {"i": i}, max_attempts=1) for i in range(4)]
        out: list[object] = [sorted(j.id for j in t.list_jobs("due")) == sorted(ids)]
        tok = {j.id: j.token for j in t.claim("w", limit=10).jobs}
        out.append(sorted(tok) == sorted(ids))
        leases = [(i, tok[i]) for i in reversed(ids)] + [("nope", "1-a"), (ids[0], "1-bad")]
        out.append(list(t.heartbeat(leases)[1].values()))
        out.append(t.complete_many([(ids[0], tok[ids[0]], 1), (ids[0], tok[ids[0]], 1)]))
        out.append(t.release([(ids[1], tok[ids[1]]), (ids[1], tok[ids[1]]), ("nope", "1-a")]))
        first = t.fail(ids[2], tok[ids[2]], ValueError("x"))
        out += [first.status, t.fail(ids[2], tok[ids[2]], ValueError("x")) == first]
        out += [t.result(ids[0], timeout_s=1), t.status(ids[1]), t.status(ids[2])]
        out += [t.dead_ids() == [ids[2]], [j.id for j in t.list_jobs("dead")] == [ids[2]]]
        out += [t.cancel(ids[3]), t.cancel(ids[3]), t.requeue_dead([ids[2], ids[2], "nope"])]
        return out

    got = [flow(t) for t in (q, make_pq(partitions=1, suffix="-one"), make_pq(suffix="-three"))]
    assert got[0] == got[1] == got[2]
    assert got[0][2] == ["held"] * 3 + ["stale", "missing"]  # ids[0]'s bad token: last word
