"""chain() / achain() on a partitioned queue (docs/flow-control.md, Chains): a chain is one
partition's, its steps run in order there, and chains spread over the partitions. Before,
both refused a PartitionedQueue (BadArgument), and plain made ids could not work: a step and its
parent must share a partition, and an untagged id routes by its hash."""

from __future__ import annotations

import asyncio

import pytest
import redis

from scheduler.client.chain import achain, chain
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.errors import BadArgument
from tests.conftest import dump_queue


def _run_in_order(pq: PartitionedQueue, ids: list[str]) -> None:
    """Each step is claimable only once the one before it is done, on its partition."""
    part = pq.part_of(ids[0])
    for i, job_id in enumerate(ids):
        jobs = part.claim("w", limit=10, lease_ms=10_000).jobs
        assert [j.id for j in jobs] == [job_id]
        parent = ids[i - 1] if i else None
        assert jobs[0].payload() == {"payload": i, "parent": parent}
        part.complete(job_id, jobs[0].token, {"step": i})
    assert [pq.status(j) for j in ids] == ["done"] * len(ids)


@pytest.mark.pq(partitions=3)
def test_a_chain_on_a_partitioned_queue_is_one_partitions_and_runs_in_order(
    pq: PartitionedQueue,
) -> None:
    ids = chain(pq, [("a", 0), ("b", 1), ("c", 2)])
    homes = {pq.layout.partition_of_id(i) for i in ids}
    assert len(homes) == 1 and all(pq.part_of(i).status(i) for i in ids)
    _run_in_order(pq, ids)
    assert pq.result(ids[1], timeout_s=1) == {"step": 1}


@pytest.mark.pq(partitions=3)
def test_chains_spread_over_the_partitions(pq: PartitionedQueue) -> None:
    homes = [pq.layout.partition_of_id(chain(pq, [("a", 0), ("b", 1)])[0]) for _ in range(3)]
    assert sorted(homes) == [0, 1, 2]


@pytest.mark.pq(partitions=2)
def test_achain_on_an_async_partitioned_queue(pq: PartitionedQueue, redis_url: str) -> None:
    async def main() -> list[str]:
        ac = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            return await achain(apq, [("a", 0), ("b", 1)])
        finally:
            await ac.aclose()

    ids = asyncio.run(main())
    assert len({pq.layout.partition_of_id(i) for i in ids}) == 1
    _run_in_order(pq, ids)


@pytest.mark.pq(partitions=2)
def test_a_bad_step_on_a_partitioned_queue_writes_nothing(
    pq: PartitionedQueue, client: redis.Redis
) -> None:
    before = [dump_queue(client, p) for p in pq.parts]
    with pytest.raises(BadArgument, match="step"):
        chain(pq, [("a", 0), "b"])  # type: ignore[list-item]
    with pytest.raises(BadArgument, match="takes a Queue or PartitionedQueue"):
        chain("q", [("a", 0)])  # type: ignore[arg-type]
    assert [dump_queue(client, p) for p in pq.parts] == before
