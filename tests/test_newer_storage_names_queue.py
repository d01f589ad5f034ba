"""NewerStorage raised by a script (lua/lib/util.lua newer_storage_err, turned into the error
by scheduler/core/script_errors.py) names the queue whose `config` generation refused the call:
through a PartitionedQueue, the partition's own name (`<queue>.p<k>`), so the caller can tell
which partition a newer version stores. The error keeps its type and its words."""

from __future__ import annotations

import pytest
import redis

from scheduler import JobSpec, NewerStorage, PartitionedQueue, Queue
from scheduler.core.keys import STORAGE_GENERATION

NEWER = str(STORAGE_GENERATION + 1)
WORDS = "the queue is stored by a newer version: generation="


def _refusal(call: object) -> str:
    with pytest.raises(NewerStorage) as got:
        call()  # type: ignore[operator]
    return str(got.value)


def test_an_enqueue_routed_to_a_newer_partition_names_that_partition(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    newer = pq.parts[1]
    client.hset(newer.keys.config, "generation", NEWER)
    texts: list[str] = []
    for _ in range(len(pq.parts)):  # one job to each partition in turn (no key, no id)
        try:
            pq.enqueue("echo", None)
        except NewerStorage as exc:
            texts.append(str(exc))
    assert len(texts) == 1
    assert f"queue {newer.name!r}" in texts[0], texts[0]
    assert WORDS in texts[0] and "upgrade this one" in texts[0]
    for other in (pq.name, pq.parts[0].name, pq.parts[2].name):
        assert f"queue {other!r}" not in texts[0]
    assert client.zcard(newer.keys.due) == 0


def test_a_plain_queues_calls_name_the_queue(client: redis.Redis, q: Queue) -> None:
    client.hset(q.keys.config, "generation", NEWER)
    single = _refusal(lambda: q.enqueue("echo", 1))  # one script call, sent straight
    batch = _refusal(lambda: q.enqueue_many([JobSpec("echo", 1), JobSpec("echo", 2)]))
    claim = _refusal(lambda: q.claim("w1", limit=1))
    for text in (single, batch, claim):
        assert f"queue {q.name!r}" in text, text
        assert WORDS in text, text
    client.hdel(q.keys.config, "generation")
    assert q.counts().due == 0  # nothing was written
