"""Dead letters in a ZSET scored by dead_ms (lua/lib/job.lua): requeue / purge by id, listing by
age, counts; the in-place conversion of a LIST written by older versions (small and 20,000 ids,
with requeue / purge / counts / a new park during a partial conversion); the opt-in retention."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import fakeredis
import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, BadArgument, Queue
from scheduler.operations.requests import Op, Script
from tests.conftest import Clock

STEP = 1000  # lib/job.lua DEAD_MIGRATE_STEP


def park(q: Queue, clock: Clock, at_ms: int, task: str = "t") -> str:
    """A real dead letter parked by fail.lua at server time at_ms."""
    clock.set_ms(at_ms)
    job_id = q.enqueue(task, None, max_attempts=1)
    (job,) = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert q.fail(job_id, job.token, ("E", "boom", "")).status == "dead"
    return job_id


def to_old_layout(client: redis.Redis, q: Queue) -> list[str]:
    """Rewrite the dead ZSET as the LIST older versions wrote (newest first); returns it."""
    ids = [str(i) for i in client.zrange(q.keys.dead, 0, -1, desc=True)]
    client.delete(q.keys.dead)
    if ids:
        client.rpush(q.keys.dead, *ids)
    return ids


def migrate_step(q: Queue) -> int:
    def op() -> Op[int]:
        return int((yield Script("dead_migrate", [])))

    return q._run(op())


def stats(client: redis.Redis, q: Queue, minute: int = 0) -> dict[str, Any]:
    return {str(f): v for f, v in client.hgetall(q.keys.stats(minute)).items()}


def test_dead_letters_are_a_zset_by_dead_ms_listed_newest_first(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    a, c, b = park(q, clock, 1_000), park(q, clock, 2_000), park(q, clock, 3_000)
    assert client.type(q.keys.dead) == "zset"
    assert client.zrange(q.keys.dead, 0, -1, withscores=True) == [
        (a, 1000.0),
        (c, 2000.0),
        (b, 3000.0),
    ]
    assert [j.id for j in q.list_jobs("dead")] == [b, c, a]
    assert q.list_jobs("dead", offset=1, limit=1)[0].id == c
    assert q.counts().dead == 3
    clock.set_ms(10_000)
    assert q.dead_ids(older_than_ms=7_500) == [c, a]
    assert q.requeue_dead([c]) == 1 and q.requeue_dead([c]) == 0
    assert q.purge_dead([a]) == 1 and not client.exists(q.keys.job(a))
    assert client.zrange(q.keys.dead, 0, -1) == [b]
    assert q.status(c) == "due"


def test_a_small_old_list_is_converted_by_the_first_script_that_touches_it(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    ids = [park(q, clock, ms) for ms in (1_000, 2_000, 3_000)]
    client.hdel(q.keys.job(ids[0]), "dead_ms")  # unreadable: scored by the server's now
    assert to_old_layout(client, q) == list(reversed(ids))
    client.rpush(q.keys.dead, "not-a-hash")  # the oldest, parked by id: its key is no hash
    client.set(q.keys.job("not-a-hash"), "x")
    assert client.type(q.keys.dead) == "list"
    clock.set_ms(9_000)
    assert q.counts().dead == 4  # counts.lua converts it in this one call
    assert client.type(q.keys.dead) == "zset"
    assert not client.exists(q.keys.dead_migrating)
    rows = cast(list[tuple[str, float]], client.zrange(q.keys.dead, 0, -1, withscores=True))
    scores = dict(rows)
    assert scores == {ids[0]: 9000.0, ids[1]: 2000.0, ids[2]: 3000.0, "not-a-hash": 9000.0}
    assert q.purge_dead(["not-a-hash"]) == 1
    assert q.requeue_dead([ids[1]]) == 1 and q.counts().dead == 2


def _old_layout_bulk(client: redis.Redis, q: Queue, n: int) -> list[str]:
    """n dead job hashes (dead_ms = index) in the old LIST, newest first, written by hand."""
    ids = [f"old-{i:05d}" for i in range(n)]
    pipe = client.pipeline(transaction=False)
    for i, job_id in enumerate(ids):
        pipe.hset(
            q.keys.job(job_id),
            mapping={"state": "dead", "dead_ms": i, "task": "t", "dead_reason": "x"},
        )
    for i in range(0, n, 1000):
        pipe.lpush(q.keys.dead, *ids[i : i + 1000])
    pipe.execute()
    return ids


def test_a_large_old_list_is_converted_in_bounded_steps_losing_nothing(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    ids = _old_layout_bulk(client, q, 20_000)
    clock.set_ms(50_000)
    assert q.counts().dead == 20_000  # one step done, both keys counted
    assert (client.llen(q.keys.dead), client.zcard(q.keys.dead_migrating)) == (19_000, STEP)
    # the oldest went first (the LIST's tail), scored by their dead_ms
    assert client.zrange(q.keys.dead_migrating, 0, 0, withscores=True) == [(ids[0], 0.0)]
    # during the partial conversion: a new park, and by id in either part
    new = park(q, clock, 60_000)
    assert client.zscore(q.keys.dead_migrating, new) == 60_000.0
    migrated, still_listed = ids[5], ids[19_999]
    assert q.requeue_dead([migrated, still_listed]) == 2
    assert q.status(migrated) == "due" and q.status(still_listed) == "due"
    assert q.purge_dead([ids[6], ids[19_998]]) == 2
    # still part-way (each script call above moved at most one step), nothing lost
    listed, moved = client.llen(q.keys.dead), client.zcard(q.keys.dead_migrating)
    assert 0 < listed < 19_000 and listed + moved == 20_000 - 4 + 1
    assert q.counts().dead == 20_000 - 4 + 1
    # a reader that pages the key finishes the conversion (in bounded script calls) first
    dead = q.dead_ids()
    assert len(dead) == 20_000 - 3 and dead[0] == new and dead[-1] == ids[0]
    assert client.type(q.keys.dead) == "zset" and not client.exists(q.keys.dead_migrating)
    assert set(dead) == set(ids) - {migrated, still_listed, ids[6], ids[19_998]} | {new}
    assert migrate_step(q) == 0


def test_one_migration_step_moves_at_most_a_step(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, _ = tq
    _old_layout_bulk(client, q, 2_500)
    assert [migrate_step(q), migrate_step(q), migrate_step(q)] == [1_500, 500, 0]
    assert client.type(q.keys.dead) == "zset" and client.zcard(q.keys.dead) == 2_500


def test_retention_is_off_by_default(client: redis.Redis, tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    ids = [park(q, clock, ms) for ms in range(0, 300, 1)]
    assert q.counts().dead == 300 and all(client.exists(q.keys.job(i)) for i in ids)
    assert "dead_trimmed" not in stats(client, q)


def test_retention_by_count_deletes_the_oldest_and_counts_them(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    ids = [park(q, clock, ms) for ms in (1, 2, 3, 4)]
    q.set_dead_retention(max_count=2)
    newest = park(q, clock, 5)
    assert client.zrange(q.keys.dead, 0, -1) == [ids[3], newest]
    assert not any(client.exists(q.keys.job(i)) for i in ids[:3])
    assert stats(client, q)["dead_trimmed"] == "3"
    q.set_dead_retention()  # both None: off again
    park(q, clock, 6)
    assert q.counts().dead == 3


def test_retention_by_age_and_bounded_per_park(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    _old_layout_bulk(client, q, 250)  # dead_ms 0 .. 249
    assert migrate_step(q) == 0
    q.set_dead_retention(max_age_ms=1_000)
    park(q, clock, 10_000)
    # At most 100 trimmed per script: park's claim, then its fail.
    assert q.counts().dead == 251 - 200
    park(q, clock, 10_001)
    park(q, clock, 10_002)
    assert q.counts().dead == 3  # the 250 old ones are gone, the young ones stay
    assert stats(client, q)["dead_trimmed"] == "250"


def test_retention_by_age_is_applied_by_claims_once_nothing_dies(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """A queue that stopped failing kept its dead letters past the age it set for good: the
    retention ran only when another job was parked (a key audit's finding). A claim applies
    it too, at most 100 a call, with or without a job to lease; a paused queue's too."""
    q, clock = tq
    ids = [park(q, clock, 1_000 + i) for i in range(150)]
    q.set_dead_retention(max_age_ms=60_000)
    assert q.counts().dead == 150  # setting it deletes nothing
    clock.set_ms(1_000 + 60_000 + 100)  # the first 100 are past the age
    q.pause()
    assert q.claim("w", limit=1, lease_ms=1_000).jobs == []
    assert q.counts().dead == 50 and not client.exists(q.keys.job(ids[0]))
    q.resume()
    clock.set_ms(10**9)
    assert q.claim("w", limit=1, lease_ms=1_000).jobs == []
    assert q.counts().dead == 0
    assert stats(client, q, 10**9 // 60_000)["dead_trimmed"] == "50"
    q.set_dead_retention()  # off: a claim trims nothing
    young = park(q, clock, 10**9 + 1)
    clock.set_ms(10**10)
    q.claim("w", limit=1, lease_ms=1_000)
    assert q.dead_ids() == [young]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_age_ms": 0}, {"max_count": -1}, {"max_age_ms": "1"}, {"max_count": 2**53}],
)
def test_bad_retention_is_refused_and_changes_nothing(
    client: redis.Redis, q: Queue, kwargs: dict[str, Any]
) -> None:
    q.set_dead_retention(max_age_ms=5_000, max_count=7)
    with pytest.raises(BadArgument):
        q.set_dead_retention(**kwargs)
    assert client.hgetall(q.keys.config) == {"dead_max_age_ms": "5000", "dead_max_count": "7"}


def test_the_lua_counts_success_and_lapsed_leases_under_the_new_words(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    done = q.enqueue("t", None)
    (job,) = q.claim("w", limit=1, lease_ms=1_000).jobs
    q.complete(done, job.token)
    q.enqueue("t", None)
    q.claim("w", limit=1, lease_ms=1_000)
    clock.set_ms(2_000)
    q.claim("w", limit=0, lease_ms=1_000)
    fields = stats(client, q)
    assert (fields.get("done"), fields.get("expired")) == ("1", "1")
    assert "complete" not in fields and "lease_expired" not in fields


def test_conversion_and_retention_on_fakeredis() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    q = Queue(client, "fake", _clock="test")
    clock = Clock(client, q)
    ids = [park(q, clock, ms) for ms in (1, 2, 3)]
    to_old_layout(client, q)
    assert q.counts().dead == 3 and client.type(q.keys.dead) == "zset"
    assert [j.id for j in q.list_jobs("dead")] == list(reversed(ids))
    q.set_dead_retention(max_count=1)
    newest = park(q, clock, 4)
    assert client.zrange(q.keys.dead, 0, -1) == [newest]
    assert q.requeue_dead([newest]) == 1 and q.counts().dead == 0


def test_async_queue_sets_the_same_retention(redis_url: str, q: Queue, client: redis.Redis) -> None:
    async def main() -> None:
        aclient = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            aq = AsyncQueue(aclient, q.name)
            await aq.set_dead_retention(max_age_ms=60_000)
            with pytest.raises(BadArgument):
                await aq.set_dead_retention(max_count=-1)
        finally:
            await aclient.aclose()

    asyncio.run(main())
    assert client.hgetall(q.keys.config) == {"dead_max_age_ms": "60000"}


def test_a_hostile_config_key_trims_nothing_and_fails_no_park(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    first = park(q, clock, 1)
    client.hset(q.keys.config, mapping={"dead_max_age_ms": "1e3", "dead_max_count": "-0x1"})
    park(q, clock, 2)
    client.delete(q.keys.config)
    client.set(q.keys.config, "not a hash")
    park(q, clock, 3)
    assert q.counts().dead == 3 and client.exists(q.keys.job(first))
