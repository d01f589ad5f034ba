"""Partitioned queues, from a review (client/partitioned*.py, core/partitions.py): each test
failed on the code as reviewed."""

from __future__ import annotations

import asyncio

import pytest
import redis

from scheduler import BadArgument, JobSpec, NotDurable, Queue
from scheduler.client.partitioned import PartitionedQueue, read_layout
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.partitions import PartitionMismatch, meta_key
from tests.conftest import delete_queue
from tests.fixtures.partitioned import delete_partitioned


def test_not_durable_carries_every_id_of_a_partitioned_batch(
    client: redis.Redis, queue_name: str
) -> None:
    """NotDurable.job_ids is 'every id the call enqueued' (the ids to re-send with): a
    partitioned enqueue_many raised one partition's error, with that partition's ids only."""
    pq = PartitionedQueue.create(
        client, queue_name, partitions=3, wait_replicas=1, wait_timeout_ms=20
    )
    try:
        ids = [f"p{i % 3}.j{i}" for i in range(6)]
        with pytest.raises(NotDurable) as err:
            pq.enqueue_many([JobSpec("t", None, job_id=i) for i in ids])
        assert pq.counts().due == 6  # all six were written
        assert err.value.job_ids == ids, f"NotDurable.job_ids={err.value.job_ids}"
    finally:
        delete_partitioned(client, pq)


def test_a_refused_partition_batch_names_the_jobs_written_in_the_others(
    pq: PartitionedQueue,
) -> None:
    """Each partition's jobs are one batch (README 'Partitioned queues'): a refused one writes
    nothing, the others are written, and the error names them (written_ids), so a caller
    re-sends only the refused jobs instead of enqueueing the others a second time."""
    home = pq.layout.partition_of_id("nope")
    other = (home + 1) % pq.layout.n
    with pytest.raises(BadArgument) as err:
        pq.enqueue_many(
            [JobSpec("t", None, job_id=f"p{other}.a"), JobSpec("t", None, after=["nope"])]
        )
    assert getattr(err.value, "written_ids", None) == [f"p{other}.a"]
    assert pq.counts().due == 1
    assert pq.status(f"p{other}.a") == "due"


@pytest.mark.parametrize("shape", ["parents apart", "id apart", "key apart"])
def test_a_job_and_its_parents_must_share_a_partition(pq: PartitionedQueue, shape: str) -> None:
    """Refused before anything is sent: a flow's keys are one partition's."""
    a, b = pq.enqueue("t", None, job_id="p0.a"), pq.enqueue("t", None, job_id="p1.b")
    key = next(f"k{i}" for i in range(100) if pq.layout.partition_of_key(f"k{i}") != 0)
    spec = {
        "parents apart": JobSpec("t", None, after=[a, b]),
        "id apart": JobSpec("t", None, job_id="p2.c", after=[a]),
        "key apart": JobSpec("t", None, key=key, after=[a]),
    }[shape]
    with pytest.raises(BadArgument, match="share one partition"):
        pq.enqueue_many([JobSpec("t", None, job_id="p2.first"), spec])
    assert pq.counts().due == 2


def test_a_child_goes_to_its_parents_partition(pq: PartitionedQueue) -> None:
    """enqueue(after=[id]) with an id this queue returned: the round robin put the child in
    another partition, where the server refused the parent as 'no such job'."""
    parent = pq.enqueue("t", None)
    child = pq.enqueue("t", None, after=[parent])
    assert pq.part_of(child) is pq.part_of(parent)
    assert pq.get_job(child).fields.get("waiting_for") is not None


def test_due_pages_neither_repeat_nor_skip_a_released_job(
    client: redis.Redis, queue_name: str
) -> None:
    """merge_jobs orders 'due' by the hash's run_at_ms, each partition pages by its due score;
    a released job keeps its first run_at_ms but is due at its release time, so the merged
    pages repeat one job and never show another."""
    pq = PartitionedQueue.create(client, queue_name, partitions=2, _clock="test")
    try:
        clock = [p.keys.test_clock for p in pq.parts]
        client.set(clock[0], 1000)
        client.set(clock[1], 1000)
        pq.enqueue("t", None, job_id="p0.r")
        (job,) = pq.parts[0].claim("w", limit=1).jobs
        client.set(clock[0], 2000)
        pq.enqueue("t", None, job_id="p0.x")
        client.set(clock[1], 2500)
        pq.enqueue("t", None, job_id="p1.y")
        client.set(clock[0], 3000)
        assert pq.parts[0].release([(job.id, job.token)]) == ["released"]
        client.set(clock[0], 5000)
        client.set(clock[1], 5000)
        pages = [j.id for off in range(3) for j in pq.list_jobs("due", offset=off, limit=1)]
        assert sorted(pages) == ["p0.r", "p0.x", "p1.y"], f"pages of one: {pages}"
    finally:
        delete_partitioned(client, pq)


@pytest.mark.parametrize(("offset", "limit"), [(-1, 10), (3, 0)])
def test_list_jobs_refuses_a_bad_page_as_a_plain_queue_does(
    pq: PartitionedQueue, offset: int, limit: int
) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(6)])
    with pytest.raises(BadArgument):
        got = pq.list_jobs("due", offset=offset, limit=limit)
        pytest.fail(f"no BadArgument, returned {len(got)} job(s)")


@pytest.mark.parametrize("call", ["enqueue_key", "enqueue_id", "status", "cancel"])
def test_a_non_string_id_or_key_is_a_bad_argument(pq: PartitionedQueue, call: str) -> None:
    """A plain Queue raises BadArgument for these; the partitioned one raised TypeError
    from its routing (partition_of_key / partition_of_id) before the Queue's checks."""
    bad: object = 5
    with pytest.raises(BadArgument):
        if call == "enqueue_key":
            pq.enqueue("t", None, key=bad)
        elif call == "enqueue_id":
            pq.enqueue("t", None, job_id=bad)
        elif call == "status":
            pq.status(bad)  # type: ignore[arg-type]
        else:
            pq.cancel(bad)  # type: ignore[arg-type]
    assert pq.counts().due == 0


def test_the_async_create_does_not_partition_a_plain_queue_with_jobs(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """The sync create refuses (README: 'so does partitioning a plain queue that has jobs');
    the async one wrote the layout, so workers and open_queue on the name see only the
    partitions and the plain queue's jobs are never claimed again."""
    plain = Queue(client, queue_name)
    jid = plain.enqueue("t", None)

    async def main() -> None:
        aclient = connect_async(redis_url)
        try:
            await AsyncPartitionedQueue.create(aclient, queue_name, partitions=3)
        finally:
            await aclient.aclose()

    try:
        with pytest.raises(PartitionMismatch):
            asyncio.run(main())
        assert read_layout(client, queue_name) is None
        assert plain.status(jid) == "due"
    finally:
        client.delete(meta_key(queue_name))
        delete_queue(client, plain)


def test_result_waits_on_the_jobs_partition(pq: PartitionedQueue) -> None:
    """Queue.result() (the producer's wait, what chain() steps use) has no partitioned
    counterpart: a caller holding an id cannot wait for it through the logical queue."""
    jid = pq.enqueue("t", None)
    part = pq.part_of(jid)
    (job,) = part.claim("w", limit=1).jobs
    part.complete(job.id, job.token, {"ok": 1})
    assert hasattr(pq, "result"), "PartitionedQueue has no result()"
    assert pq.result(jid, timeout_s=2) == {"ok": 1}


def test_purge_dead_of_a_str_is_refused_not_split(pq: PartitionedQueue) -> None:
    """A str would be read as one-letter ids, each routed and purged if dead: refused."""
    with pytest.raises(BadArgument, match="list of job ids"):
        pq.purge_dead("ab")
    with pytest.raises(BadArgument, match="list of job ids"):
        pq.requeue_dead("ab")


def test_a_dead_id_no_api_would_make_still_routes_for_purge(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    """The dead list may hold ids claim parked as invalid (a space in a hand-written id): the
    partitioned purge routes any str by its hash, as before, instead of refusing it."""
    bad = "bad id"
    part = pq.parts[pq.layout.partition_of_id(bad)]
    client.zadd(part.keys.dead, {bad: 1})
    assert pq.purge_dead([bad]) == 1
    assert client.zscore(part.keys.dead, bad) is None
