"""A partitioned queue's storage generation is each partition's own (`sched:{<queue>.p<k>}:config`
field `generation`): a newer version may raise it on some partitions first. Every partition is
checked, not only the first or the logical name's: `scheduler worker` refuses to start naming the
partition, and the clients' calls refuse it (docs/guide/workers.md, "The storage generation").
Guards: these held when written (serve() reads each partition's generation after expanding the
name, one HGET each, and every partition's scripts are guarded)."""

from __future__ import annotations

import pytest
import redis

from scheduler import NewerStorage, PartitionedQueue
from scheduler.core.keys import STORAGE_GENERATION
from tests.fixtures.partitioned import MakePq
from tests.workers.procs import run_worker

NEWER = str(STORAGE_GENERATION + 1)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_worker_does_not_start_when_any_one_partition_is_newer(
    client: redis.Redis, redis_url: str, make_pq: MakePq, k: int
) -> None:
    pq = make_pq(partitions=3)
    job = pq.enqueue("echo", None)
    newer = pq.parts[k]
    client.hset(newer.keys.config, "generation", NEWER)
    # --burst: a worker that started anyway exits 0 once nothing is claimable, not hang.
    done = run_worker(redis_url, pq.name, "--burst")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"queue {newer.name!r} is stored by a newer version" in done.stderr, done.stderr
    assert "upgrade this one" in done.stderr
    for part in pq.parts:
        assert client.exists(part.keys.workers) == 0, part.name  # never registered
    client.hdel(newer.keys.config, "generation")
    assert pq.status(job) == "due"  # claimed nowhere


def test_the_clients_calls_refuse_a_newer_partition(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    newer = pq.parts[2]
    client.hset(newer.keys.config, "generation", NEWER)
    with pytest.raises(NewerStorage):
        pq.counts()
    with pytest.raises(NewerStorage, match=f"queue '{newer.name}'"):
        pq.list_schedules()
    refused = 0
    for _ in range(len(pq.parts)):  # one job to each partition in turn (no key, no id)
        try:
            pq.enqueue("echo", None)
        except NewerStorage:
            refused += 1
    assert refused == 1
    assert client.zcard(newer.keys.due) == 0  # nothing written there
    assert [client.zcard(p.keys.due) for p in pq.parts[:2]] == [1, 1]
