"""One logical queue over N partitions (core/partitions.py, client/partitioned.py): the stored
count, routing by key / id, merged views, schedules in one partition, a worker on the logical
name. Runs on one server and, in the cluster stage, on a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from scheduler import BadArgument, JobSpec, Queue
from scheduler.client.partitioned import PartitionedQueue, read_layout
from scheduler.core.keys import QueueKeys
from scheduler.core.partitions import SLOTS, Layout, PartitionMismatch, sub_queue_names
from tests.conftest import delete_queue
from tests.redis_server import RedisProcess, require_server
from tests.workers.procs import spawn_worker, stop_all, wait_for


@pytest.mark.parametrize("n", [1, 3, 12])
def test_partition_names_spread_over_equal_slot_ranges(n: int) -> None:
    names = sub_queue_names("emails", n)
    assert names == sub_queue_names("emails", n) and len(set(names)) == n
    for k, name in enumerate(names):
        slot = key_slot(QueueKeys(name).prefix.encode())
        assert k * SLOTS // n <= slot < (k + 1) * SLOTS // n


def test_the_id_tells_the_partition_and_a_key_decides_it() -> None:
    layout = Layout.create("emails", 4)
    k, job_id = layout.route(None, None, spread=6)
    assert k == 2 and job_id.startswith("p2.") and layout.partition_of_id(job_id) == 2
    assert layout.partition_of_id("order-17") == layout.partition_of_id("order-17")
    k, job_id = layout.route("user-9", None, spread=0)
    assert k == layout.partition_of_key("user-9") == layout.partition_of_id(job_id)
    other = next(f"x{i}" for i in range(100) if layout.partition_of_id(f"x{i}") != k)
    with pytest.raises(BadArgument, match="different partitions"):
        layout.route("user-9", other, spread=0)
    with pytest.raises(BadArgument):
        Layout.parse("emails", "2|1|emails.p0")


def test_the_count_is_stored_and_another_is_refused(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    stored = read_layout(client, pq.name)
    assert stored is not None and stored.n == 3
    assert PartitionedQueue.create(client, pq.name, partitions=3).layout == stored
    with pytest.raises(PartitionMismatch, match="created with 3 partitions, not 12"):
        PartitionedQueue.create(client, pq.name, partitions=12)
    assert read_layout(client, pq.name) == stored  # nothing changed
    assert PartitionedQueue.open(client, pq.name).layout == stored


def test_a_plain_queue_is_not_turned_into_partitions(client: redis.Redis, queue_name: str) -> None:
    from scheduler import Queue

    plain = Queue(client, queue_name)
    plain.enqueue("t", None)
    try:
        with pytest.raises(PartitionMismatch, match="unpartitioned"):
            PartitionedQueue.create(client, queue_name, partitions=3)
        with pytest.raises(PartitionMismatch, match="not partitioned"):
            PartitionedQueue.open(client, queue_name)
        assert read_layout(client, queue_name) is None
    finally:
        delete_queue(client, plain)


def test_jobs_spread_keys_stay_unique_and_views_merge(pq: PartitionedQueue) -> None:
    ids = pq.enqueue_many([JobSpec("t", {"n": i}) for i in range(30)], batch_size=4)
    assert len(set(ids)) == 30
    assert [p.counts().due for p in pq.parts] == [10, 10, 10]
    assert pq.counts().due == 30
    first = pq.enqueue("t", None, key="once")
    assert pq.enqueue("t", None, key="once") == first and pq.counts().due == 31
    assert pq.status(ids[7]) == "due" and pq.get_job(ids[7]).payload() == {"n": 7}
    assert pq.cancel(ids[7]) == "due" and pq.status(ids[7]) == "cancelled"
    assert pq.counts().due == 30
    # One job dies in each partition, 1 ms apart on each partition's test clock (a client
    # that reads the clock key, not TIME): the merged dead list is newest first.
    died = []
    start_ms = pq.counts().now_ms
    for k, part in enumerate(pq.parts):
        clocked = Queue(part.client, part.name, _clock="test")
        part.client.set(clocked.keys.test_clock, start_ms + k)
        job = clocked.claim("w", limit=1).jobs[0]
        clocked.fail(job.id, job.token, ValueError("x"), retryable=False)
        died.append(job.id)
    assert pq.dead_ids() == died[::-1] and pq.counts().dead == 3
    assert pq.requeue_dead(died) == 3 and pq.counts().dead == 0


def test_a_schedule_lives_in_one_partition(pq: PartitionedQueue) -> None:
    assert pq.schedule("nightly", "report", None, every_ms=60_000) == "created"
    holders = [p.name for p in pq.parts if p.list_schedules()]
    assert holders == [pq.parts[pq.layout.partition_of_schedule("nightly")].name]
    assert [s.name for s in pq.list_schedules()] == ["nightly"]
    assert pq.get_schedule("nightly").name == "nightly"


def test_a_worker_on_the_logical_name_drains_every_partition(
    redis_url: str, pq: PartitionedQueue
) -> None:
    ids = pq.enqueue_many([JobSpec("noop", None) for _ in range(12)])
    w = spawn_worker(redis_url, pq.name)
    try:
        wait_for(lambda: all(pq.status(i) == "done" for i in ids), what="every partition drained")
    finally:
        stop_all([w])
    assert pq.counts().due == 0


def test_a_worker_does_not_claim_empty_partitions_for_every_job(tmp_path: Path) -> None:
    """12 partitions, a backlog in one: a claim of an empty partition is skipped for up to
    1 s after it took nothing (not sent once per claim round). Counted exactly: the server's
    SLOWLOG at 0 us logs every EVALSHA with its keys."""
    from scheduler import Queue
    from scheduler.core.scripts import Scripts

    with RedisProcess(require_server("slowlog count")) as server:
        client = server.client()
        pq = PartitionedQueue.create(client, "wide", partitions=12)
        busy = pq.parts[0]
        busy.enqueue_many([JobSpec("noop", None, job_id=f"p0.j{i}") for i in range(300)])
        client.config_set("slowlog-max-len", 1_000_000)
        client.config_set("slowlog-log-slower-than", 0)
        w = spawn_worker(server.url, "wide", "--concurrency", "2", "--batch", "3",
                         log=str(tmp_path / "w.log"))  # fmt: skip
        try:
            wait_for(lambda: Queue(client, busy.name).counts().due == 0, 60, "the backlog drained")
        finally:
            stop_all([w])
        claim_sha = Scripts().sha["claim"]
        logged = [e["command"] for e in client.slowlog_get(1_000_000)]
        claims = [(c.decode() if isinstance(c, bytes) else str(c)).split() for c in logged]
        claims = [c for c in claims if len(c) > 3 and c[0] == "EVALSHA" and c[1] == claim_sha]
        on_busy = sum(1 for c in claims if c[3] == busy.keys.prefix)
        on_empty = len(claims) - on_busy
        assert on_busy >= 30  # many claim rounds on the busy partition
        assert on_empty < on_busy, (on_empty, on_busy)  # before: ~5 empty claims per round


def _claims(client: redis.Redis) -> list[list[str]]:
    """Every claim EVALSHA the server logged (SLOWLOG at 0 us), oldest first, split."""
    from scheduler.core.scripts import Scripts

    sha = Scripts().sha["claim"]
    logged = [e["command"] for e in reversed(client.slowlog_get(1_000_000))]
    split = [(c.decode() if isinstance(c, bytes) else str(c)).split() for c in logged]
    return [c for c in split if len(c) > 9 and c[0] == "EVALSHA" and c[1] == sha]


def test_a_worker_gives_every_backlogged_partition_a_batch_per_cycle(tmp_path: Path) -> None:
    """12 partitions with a backlog each; a round of claims covers 2-3 of them (about 50 free
    slots, batches of 20). At every point of the claim sequence the jobs asked of any two
    partitions differ by at most 2 batches (measured: 1, a deficit round robin). Before, the
    start moved by one per round, so a partition got its batches in a burst of consecutive
    rounds: 110 jobs (5.5 batches) apart."""
    from scheduler import Queue

    batch = 20
    with RedisProcess(require_server("slowlog count")) as server:
        client = server.client()
        pq = PartitionedQueue.create(client, "fair", partitions=12)
        for k, part in enumerate(pq.parts):
            part.enqueue_many([JobSpec("noop", None, job_id=f"p{k}.j{i}") for i in range(150)])
        client.config_set("slowlog-max-len", 1_000_000)
        client.config_set("slowlog-log-slower-than", 0)
        w = spawn_worker(server.url, "fair", "--concurrency", "30", "--batch", str(batch),
                         log=str(tmp_path / "w.log"))  # fmt: skip
        try:
            wait_for(lambda: pq.counts().due <= 900, 60, "half the backlog drained")
        finally:
            stop_all([w])
        client.config_set("slowlog-log-slower-than", 10_000)
        prefixes = {Queue(client, p.name).keys.prefix: k for k, p in enumerate(pq.parts)}
        asked = [0] * 12
        widest = 0
        claims = _claims(client)
        for c in claims:
            asked[prefixes[c[3]]] += int(c[9])  # ARGV[2], the limit: all taken (a backlog)
            if min(asked) > 0:  # once every partition had its first turn
                widest = max(widest, max(asked) - min(asked))
        assert len(claims) >= 30 and sum(asked) >= 600
        assert widest <= 2 * batch, (widest, asked)


def test_the_async_client_shares_the_layout_and_routing(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    import asyncio

    from scheduler.client.partitioned_aio import AsyncPartitionedQueue
    from scheduler.core.connection import connect_async

    async def main() -> tuple[list[str], int, str]:
        aclient = connect_async(redis_url)
        try:
            with pytest.raises(PartitionMismatch):
                await AsyncPartitionedQueue.create(aclient, pq.name, partitions=5)
            aq = await AsyncPartitionedQueue.open(aclient, pq.name)
            ids = await aq.enqueue_many([JobSpec("t", None) for _ in range(6)])
            keyed = await aq.enqueue("t", None, key="k1")
            assert await aq.enqueue("t", None, key="k1") == keyed
            return ids, (await aq.counts()).due, str(await aq.status(ids[0]))
        finally:
            await aclient.aclose()

    ids, due, state = asyncio.run(main())
    assert due == 7 and state == "due"
    assert all(p.counts().due >= 2 for p in pq.parts)  # round robin, as the sync client
    assert pq.status(ids[5]) == "due" and pq.counts().due == 7
