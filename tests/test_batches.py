"""Large batches through every batch-taking transition on a real server: they work whole (Lua's
unpack limit of ~8,000 values is never reached in one call), and a batch refused at the boundary
or by the script writes nothing (issue 10 item 2)."""

from __future__ import annotations

import pytest
import redis

from scheduler import BadArgument, JobSpec, Queue
from scheduler.core.codec import ENQUEUE_FIELDS, LIMITS, enqueue_args
from scheduler.core.limits import ENQUEUE_PER_CALL
from scheduler.operations.ops import Script
from tests.conftest import dump_queue

N = 10_000


def test_enqueue_many_with_batch_size_4000_enqueues_every_job(
    q: Queue, client: redis.Redis
) -> None:
    specs = [JobSpec("batch.t", {"i": i}) for i in range(N)]
    ids = q.enqueue_many(specs, batch_size=4000)
    assert len(set(ids)) == N
    assert client.zcard(q.keys.due) == N
    # Every acknowledged id is in due and has its hash: none is written but unreachable.
    assert None not in client.zmscore(q.keys.due, ids)
    assert client.exists(*(q.keys.spec(i) for i in ids)) == N
    assert q.counts().due == N


def test_the_largest_batch_size_is_written_whole(q: Queue, client: redis.Redis) -> None:
    """Sent as script calls of ENQUEUE_PER_CALL jobs at most (each bounded in time)."""
    largest = LIMITS["batch_size"][1]
    ids = q.enqueue_many([JobSpec("batch.t") for _ in range(largest)], batch_size=largest)
    assert client.zcard(q.keys.due) == len(set(ids)) == largest


def test_ten_thousand_jobs_complete_in_one_call(q: Queue, client: redis.Redis) -> None:
    q.enqueue_many([JobSpec("batch.t", i) for i in range(N)], batch_size=5000)
    held = []
    while len(held) < N:
        batch = q.claim("w", limit=1000, lease_ms=600_000)
        assert batch.jobs
        held += [(j.id, j.token) for j in batch.jobs]
    _, beats = q.heartbeat(held, lease_ms=600_000)
    assert set(beats.values()) == {"held"}
    statuses = q.complete_many([(i, t, {"ok": 1}) for i, t in held])
    assert statuses == ["done"] * N
    assert client.zcard(q.keys.leased) == 0 and client.zcard(q.keys.due) == 0
    # Re-sent: the same answers, nothing changes.
    assert q.complete_many([(i, t, None) for i, t in held[:100]]) == ["done"] * 100


def test_large_release_requeue_and_purge(q: Queue, client: redis.Redis) -> None:
    q.enqueue_many([JobSpec("batch.t", max_attempts=1) for _ in range(3000)], batch_size=3000)
    held = []
    while len(held) < 3000:
        held += [(j.id, j.token) for j in q.claim("w", limit=1000, lease_ms=600_000).jobs]
    assert q.release(held) == ["released"] * 3000
    assert client.zcard(q.keys.due) == 3000
    for _ in range(3):
        for j in q.claim("w", limit=1000, lease_ms=600_000).jobs:
            q.fail(j.id, j.token, ("E", "x", ""), retryable=False)
    dead = q.dead_ids()
    assert len(dead) == 3000
    assert q.requeue_dead(dead) == 3000
    assert client.zcard(q.keys.dead) == 0 and client.zcard(q.keys.due) == 3000


@pytest.mark.parametrize("batch_size", [0, -1, LIMITS["batch_size"][1] + 1, 1.5, True, "10"])
def test_a_bad_batch_size_is_refused_and_writes_nothing(
    q: Queue, client: redis.Redis, batch_size: object
) -> None:
    q.enqueue("batch.t")
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="batch_size"):
        q.enqueue_many([JobSpec("batch.t") for _ in range(10)], batch_size=batch_size)  # type: ignore[arg-type]
    assert dump_queue(client, q) == before


def test_one_bad_job_in_a_large_call_refuses_every_batch(q: Queue, client: redis.Redis) -> None:
    q.enqueue("batch.t")
    before = dump_queue(client, q)
    specs = [JobSpec("batch.t") for _ in range(8000)] + [JobSpec("batch.t", max_attempts=2**70)]
    with pytest.raises(BadArgument, match="max_attempts"):
        q.enqueue_many(specs, batch_size=4000)
    assert dump_queue(client, q) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [(5, "1e3"), (5, "0x10"), (5, "inf"), (6, "9.2233720368547758e+18"), (6, "0"),
     (7, "1000,nan,60000,0.1"), (8, "30s"), (4, "later"), (11, "0"), (11, "1h"), (12, "keep")],
)  # fmt: skip
def test_the_script_refuses_a_batch_with_one_bad_job_and_writes_nothing(
    q: Queue, client: redis.Redis, field: int, value: str
) -> None:
    """Past the Python checks (another client, an older version): enqueue.lua checks the whole
    batch before its first write. field: 1-based position among a job's ARGV fields."""
    q.enqueue("batch.t")
    before = dump_queue(client, q)
    # The largest call the script takes (a larger one is refused on n before any field).
    n = ENQUEUE_PER_CALL
    args = enqueue_args([JobSpec("batch.t", i) for i in range(n)], 1 << 20)
    args[(n - 1) * ENQUEUE_FIELDS + field] = value  # the last job of the batch (ARGV[1] is n)
    with pytest.raises(BadArgument) as refused:
        q._execute(Script("enqueue", args))
    assert not str(refused.value).endswith(f" n={n}")  # a field refused, not the size
    assert dump_queue(client, q) == before
