"""A queue holds a Redis connection: pickling one (multiprocessing's spawn or forkserver, a
queue passed as a task's argument) is refused with a TypeError that says what to pass instead,
not pickle's "cannot pickle '_thread.lock' object" from deep inside redis-py."""

from __future__ import annotations

import copy
import pickle

import pytest
import redis

from scheduler import AsyncQueue, PartitionedQueue, Queue
from scheduler.core.connection import connect_async
from tests.redis_server import is_cluster_run


def test_a_queue_is_refused_by_pickle_with_what_to_pass_instead(
    client: redis.Redis, queue_name: str, redis_url: str
) -> None:
    queues = [Queue(client, queue_name), AsyncQueue(connect_async(redis_url), queue_name)]
    if not is_cluster_run():
        queues.append(PartitionedQueue.create(client, f"{queue_name}-p", partitions=2))
    for q in queues:
        for dump in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match="URL and the queue's name"):
                dump(q)
    q = Queue(client, queue_name)
    twin = copy.copy(q)  # a shallow copy: the same connection, still usable
    assert twin.client is q.client
    assert twin.enqueue("t", job_id="c1") == "c1"
