"""due, leased or dead edited by hand into another type: fail, release, requeue_dead and
purge_dead either succeed with every job in a place, or raise having written nothing (Redis
keeps the writes a script made before its error: half a transition, a job in no set).

The scripts check the key before their first write and answer 'CORRUPT <key> is not a zset
(nothing written)'; where their first write meets the key itself (leased's ZREM in fail and
release), Redis refuses it with WRONGTYPE, also before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from scheduler import CorruptKey, Queue, SchedulerError
from tests.conftest import Clock, dump_queue

T0 = 10_000_000_000
HOUR_MS = 3_600_000


def _state(client: redis.Redis, q: Queue) -> dict[str, object]:
    return {k: v for k, v in dump_queue(client, q).items() if ":stats:" not in k}


def _spoil(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.set(key, "hand-edited")


def refused_unchanged(
    client: redis.Redis, q: Queue, call: Callable[[], Any], says: str | None = None
) -> None:
    """`call` raises, and the queue's keys (but its advisory stats) are as they were."""
    before = _state(client, q)
    with pytest.raises((SchedulerError, redis.ResponseError)) as exc:
        call()
    after = _state(client, q)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], f"raised {exc.value!s:.80} after writing {changed}"
    if says is not None:
        assert says in str(exc.value)


def _leased(q: Queue, clock: Clock, n: int = 1, **opts: Any) -> list[tuple[str, str]]:
    clock.set_ms(T0)
    ids = [q.enqueue("t", **opts) for _ in range(n)]
    got = {j.id: j.token for j in q.claim("w", limit=100, lease_ms=HOUR_MS).jobs}
    assert set(got) == set(ids)
    clock.set_ms(T0 + 1)
    return [(i, got[i]) for i in ids]


def _parked(q: Queue, clock: Clock, n: int = 1) -> list[str]:
    out = []
    for jid, token in _leased(q, clock, n):
        assert q.fail(jid, token, ("E", "x", ""), retryable=False).status == "dead"
        out.append(jid)
    return out


# -- fail ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "retryable,max_attempts", [(True, 5), (False, 5), (True, 1)], ids=["retry", "dead", "spent"]
)
def test_fail_with_due_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis, retryable: bool, max_attempts: int
) -> None:
    q, clock = tq
    ((jid, token),) = _leased(q, clock, max_attempts=max_attempts)
    _spoil(client, q.keys.due)
    refused_unchanged(
        client, q, lambda: q.fail(jid, token, ("E", "x", ""), retryable=retryable),
        "due is not a zset",
    )  # fmt: skip


def test_fail_of_a_keyed_job_with_due_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    ((jid, token),) = _leased(q, clock, concurrency_key="k", concurrency_limit=1)
    clock.set_ms(T0)
    q.enqueue("t", concurrency_key="k", concurrency_limit=1)  # held behind it
    assert q.claim("w", limit=10, lease_ms=HOUR_MS).jobs == []
    _spoil(client, q.keys.due)
    refused_unchanged(client, q, lambda: q.fail(jid, token, ("E", "x", "")), "due is not a zset")


@pytest.mark.parametrize("retryable,max_attempts", [(False, 5), (True, 1)], ids=["dead", "spent"])
def test_a_park_with_dead_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis, retryable: bool, max_attempts: int
) -> None:
    q, clock = tq
    ((jid, token),) = _leased(q, clock, max_attempts=max_attempts)
    _spoil(client, q.keys.dead)
    refused_unchanged(
        client, q, lambda: q.fail(jid, token, ("E", "x", ""), retryable=retryable),
        "dead is not a zset",
    )  # fmt: skip


def test_a_park_mid_conversion_with_dead_migrating_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """An older version's dead LIST is converted through dead:migrating (lib/job.lua)."""
    q, clock = tq
    ((jid, token),) = _leased(q, clock)
    client.rpush(q.keys.dead, "old-dead-id")
    _spoil(client, q.keys.dead_migrating)
    refused_unchanged(
        client, q, lambda: q.fail(jid, token, ("E", "x", ""), retryable=False),
        "dead:migrating is not a zset",
    )  # fmt: skip


def test_a_retry_needs_no_dead_key_and_a_park_still_converts_an_old_list(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    (a, b) = _leased(q, clock, 2)
    _spoil(client, q.keys.dead)
    assert q.fail(a[0], a[1], ("E", "x", "")).status == "retry"  # never touches dead
    assert client.zscore(q.keys.due, a[0]) is not None
    client.delete(q.keys.dead)
    client.rpush(q.keys.dead, "old-dead-id")
    assert q.fail(b[0], b[1], ("E", "x", ""), retryable=False).status == "dead"
    assert client.type(q.keys.dead) == "zset"
    assert client.zscore(q.keys.dead, b[0]) is not None


def test_fail_with_leased_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    ((jid, token),) = _leased(q, clock)
    _spoil(client, q.keys.leased)
    refused_unchanged(client, q, lambda: q.fail(jid, token, ("E", "x", "")))
    refused_unchanged(client, q, lambda: q.fail(jid, token, ("E", "x", ""), retryable=False))


# -- release ------------------------------------------------------------------------------------
def test_release_of_a_batch_with_due_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    pairs = _leased(q, clock, 3)
    ((kid, ktoken),) = _leased(q, clock, concurrency_key="k", concurrency_limit=1)
    _spoil(client, q.keys.due)
    stale = (pairs[0][0], "not-the-token")
    refused_unchanged(
        client, q, lambda: q.release([stale, *pairs, (kid, ktoken)]), "due is not a zset"
    )


def test_release_with_leased_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    pairs = _leased(q, clock, 2)
    _spoil(client, q.keys.leased)
    refused_unchanged(client, q, lambda: q.release(pairs))


def test_release_of_no_held_job_still_answers_with_due_of_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """The check comes before the first write only: a call that writes nothing is answered."""
    q, clock = tq
    ((jid, token),) = _leased(q, clock)
    assert q.release([(jid, token)]) == ["released"]
    _spoil(client, q.keys.due)
    before = _state(client, q)
    assert q.release([(jid, token), ("no-such-job", "t")]) == ["released", "missing"]
    assert _state(client, q) == before


def test_release_still_releases_and_gives_the_attempt_back(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    pairs = _leased(q, clock, 2)
    assert q.release([*pairs, ("no-such-job", "t")]) == ["released", "released", "missing"]
    for jid, _ in pairs:
        assert client.zscore(q.keys.due, jid) is not None
        assert client.zscore(q.keys.leased, jid) is None
        assert client.hget(q.keys.job(jid), "attempts") == "0"
    assert q.release(pairs) == ["released", "released"]  # a re-sent call


# -- requeue_dead -------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["due", "leased"])
def test_requeue_dead_with_a_key_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis, key: str
) -> None:
    q, clock = tq
    ids = _parked(q, clock, 3)
    _spoil(client, q.keys.prefix + key)
    refused_unchanged(
        client, q, lambda: q.requeue_dead(["no-such-job", *ids]), f"{key} is not a zset"
    )


def test_requeue_dead_with_dead_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    ids = _parked(q, clock, 2)
    _spoil(client, q.keys.dead)
    refused_unchanged(client, q, lambda: q.requeue_dead(ids))


def test_requeue_dead_of_no_dead_job_still_answers_with_due_of_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    ((jid, _),) = _leased(q, clock)
    _spoil(client, q.keys.due)
    assert q.requeue_dead([jid, "no-such-job"]) == 0


# -- purge_dead ---------------------------------------------------------------------------------
def _parked_occurrence(q: Queue, clock: Clock, client: redis.Redis) -> str:
    """As doctor --fix parks a job: the pending occurrence moved by plain commands."""
    clock.set_ms(T0)
    q.schedule("tick", "t", every_ms=60_000)
    first = q.get_schedule("tick").pending
    assert first
    client.zrem(q.keys.due, first)
    client.hset(q.keys.job(first), mapping={"state": "dead", "dead_reason": "by hand"})
    client.zadd(q.keys.dead, {first: T0})
    return first


def test_purging_an_occurrence_with_due_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    plain = _parked(q, clock, 1)
    occurrence = _parked_occurrence(q, clock, client)
    _spoil(client, q.keys.due)
    refused_unchanged(client, q, lambda: q.purge_dead([*plain, occurrence]), "due is not a zset")


def test_purging_plain_dead_jobs_needs_no_due(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    ids = _parked(q, clock, 2)
    _spoil(client, q.keys.due)
    assert q.purge_dead([*ids, ids[0]]) == 2
    assert client.zcard(q.keys.dead) == 0
    assert not any(client.exists(q.keys.job(i)) for i in ids)


def test_purging_an_occurrence_still_arms_the_next(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    occurrence = _parked_occurrence(q, clock, client)
    assert q.purge_dead([occurrence, occurrence]) == 1
    nxt = q.get_schedule("tick").pending
    assert nxt and nxt != occurrence
    assert client.zscore(q.keys.due, nxt) is not None
    assert not client.exists(q.keys.job(occurrence))


# -- claim: the reaper's moves and the parks ---------------------------------------------------
def test_a_claim_that_would_reap_into_a_due_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Before: the reaper ZREMed the lapsed lease, then its ZADD into due raised."""
    q, clock = tq
    _leased(q, clock, 2)
    clock.set_ms(T0 + 2 * HOUR_MS)
    _spoil(client, q.keys.due)
    refused_unchanged(client, q, lambda: q.claim("w", limit=10, lease_ms=HOUR_MS), "due is not")


def test_a_claim_that_would_park_into_a_dead_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Before: the reaper moved the first lapsed job back to due, then the second one's park
    (its last attempt) raised on dead: half a reap."""
    q, clock = tq
    _leased(q, clock, 1)
    _leased(q, clock, 1, max_attempts=1)
    clock.set_ms(T0 + 2 * HOUR_MS)
    _spoil(client, q.keys.dead)
    refused_unchanged(client, q, lambda: q.claim("w", limit=10, lease_ms=HOUR_MS), "dead is not")


def test_a_claim_that_would_park_an_unreadable_job_writes_nothing_with_dead_spoiled(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Step 2's park (a record edited by hand) after an earlier job of the call was leased."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t")
    bad = q.enqueue("t")
    client.set(q.keys.spec(bad), "not a record")
    _spoil(client, q.keys.dead)
    refused_unchanged(client, q, lambda: q.claim("w", limit=10, lease_ms=HOUR_MS), "dead is not")


def test_a_heartbeat_with_leased_of_another_type_is_a_corrupt_key(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Before: Redis's bare WRONGTYPE, which a worker's heartbeat loop took as a refusal and
    stopped on; CorruptKey is one it backs off from (the key is fixed, the beats go on)."""
    q, clock = tq
    ((jid, token),) = _leased(q, clock)
    _spoil(client, q.keys.leased)
    with pytest.raises(CorruptKey, match="leased is not a zset"):
        q.heartbeat([(jid, token)], lease_ms=HOUR_MS)
