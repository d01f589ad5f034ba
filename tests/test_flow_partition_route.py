"""docs/flow-control.md: on a partitioned queue a concurrency limit holds per partition (a
limit K over N partitions allows up to N*K leases), and the page's way to keep one key's K is
to give that key's jobs ids tagged with one partition. Both halves, on real partitions."""

from __future__ import annotations

import uuid

from scheduler import PartitionedQueue
from tests.conftest import delete_queue

LIMIT = {"concurrency_key": "tenant:7", "concurrency_limit": 1}


def leased(pq: PartitionedQueue) -> int:
    return sum(len(part.claim("w", limit=10, lease_ms=60_000).jobs) for part in pq.parts)


def test_a_limit_holds_per_partition_unless_the_keys_jobs_share_one(pq: PartitionedQueue) -> None:
    for _ in range(6):  # no id: round robin over the 3 partitions
        pq.enqueue("t", None, **LIMIT)
    assert leased(pq) == 3  # one per partition: the documented N*K
    for part in pq.parts:
        delete_queue(pq.client, part)
    k = 1  # one partition for the key, as the page says
    for _ in range(6):
        pq.enqueue("t", None, job_id=f"p{k}.{uuid.uuid4().hex}", **LIMIT)
    assert [part.counts().due for part in pq.parts] == [0, 6, 0]
    assert leased(pq) == 1


def test_a_rate_limit_holds_per_partition_too(pq: PartitionedQueue) -> None:
    for _ in range(6):  # round robin: 2 per partition, 1 start per hour each
        pq.enqueue("t", None, rate_limit="1/1h", rate_key="api")
    assert leased(pq) == 3
