"""A plain Queue opened on a partitioned queue's own name: its enqueue and its schedules are
refused (workers serve the partitions, so such a job waited where no worker looked, and no
listing, stats or doctor showed it), and nothing is written."""

from __future__ import annotations

import pytest
import redis

from scheduler import BadArgument, JobSpec, Queue
from scheduler.client.partitioned import PartitionedQueue
from tests.conftest import delete_queue, dump_queue


def test_a_plain_queue_cannot_write_under_a_partitioned_name(
    client: redis.Redis, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=2)
    plain = Queue(client, queue_name)
    try:
        before = dump_queue(client, plain)
        assert list(before) == [plain.keys.prefix + "partitions"]
        with pytest.raises(BadArgument, match="partitioned"):
            plain.enqueue("t", 1)
        with pytest.raises(BadArgument, match="partitioned"):
            plain.enqueue_many([JobSpec("t", i) for i in range(3)])
        with pytest.raises(BadArgument, match="partitioned"):
            plain.schedule("nightly", "t", every_ms=60_000)
        assert dump_queue(client, plain) == before
        job_id = pq.enqueue("t", 1)  # the partitioned queue itself is unaffected
        assert pq.get_job(job_id).task == "t"
    finally:
        delete_queue(client, plain)
        for name in pq.layout.names:
            delete_queue(client, Queue(client, name))


def test_the_refusal_names_the_queue(client: redis.Redis, queue_name: str) -> None:
    PartitionedQueue.create(client, queue_name, partitions=2)
    try:
        with pytest.raises(BadArgument) as info:
            Queue(client, queue_name).enqueue("t", 1)
        assert f"queue={queue_name} is partitioned" in str(info.value)
        assert "open_queue" in str(info.value)
    finally:
        client.delete(Queue(client, queue_name).keys.prefix + "partitions")
