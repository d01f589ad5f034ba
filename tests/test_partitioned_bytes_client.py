"""A partitioned queue on a client with redis-py's default bytes replies (a plain Queue works on
one). `PartitionedQueue.create` wrote the layout record, then could not read it back
(UnreadableRecord "b'1|4|...'"), and the name was then unusable with such a client."""

from __future__ import annotations

import asyncio
import uuid

import redis
import redis.asyncio as aredis

from scheduler import open_queue, open_queue_async
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue


def test_sync_bytes_client(redis_url: str) -> None:
    name = f"pb-{uuid.uuid4().hex[:8]}"
    with redis.Redis.from_url(redis_url) as raw:  # decode_responses=False
        pq = PartitionedQueue.create(raw, name, partitions=4)
        ids = [pq.enqueue("t", i) for i in range(8)]
        again = open_queue(raw, name)
        assert isinstance(again, PartitionedQueue)
        assert again.counts().due == 8
        assert sorted(j.id for j in again.list_jobs("due")) == sorted(ids)


def test_async_bytes_client(redis_url: str) -> None:
    name = f"pb-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        raw = aredis.Redis.from_url(redis_url)
        try:
            pq = await AsyncPartitionedQueue.create(raw, name, partitions=3)
            await pq.enqueue("t", 1)
            again = await open_queue_async(raw, name)
            assert isinstance(again, AsyncPartitionedQueue)
            assert (await again.counts()).due == 1
        finally:
            await raw.aclose()

    asyncio.run(main())
