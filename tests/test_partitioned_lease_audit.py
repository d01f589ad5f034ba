"""Audit of the partitioned manual lease API (client/partitioned_lease*.py): a re-sent nonce,
a round that errors, limit, fairness under load."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any, get_type_hints

import pytest
import redis

from scheduler import JobSpec
from scheduler.client import partitioned_lease, partitioned_lease_plan, partitioned_partial
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async

pytestmark = pytest.mark.pq(partitions=3)


def _put(pq: PartitionedQueue, k: int, n: int) -> list[str]:
    specs = [JobSpec("t", {"i": i}, job_id=f"p{k}.{uuid.uuid4().hex}") for i in range(n)]
    return pq.enqueue_many(specs)


def test_limit_below_the_partition_count(pq: PartitionedQueue) -> None:
    for k in range(3):
        _put(pq, k, 3)
    batch = pq.claim("w", limit=1)
    assert len(batch.jobs) == 1
    batch = pq.claim("w", limit=2)
    assert len(batch.jobs) == 2


def _lose_reply(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """The next claim's first round: partition k runs it, but its reply is lost."""
    real = partitioned_partial.answering_sync
    calls = [0]

    def lossy(q: Any, make: Any, asked: Any, lost: Any = None) -> list[Any]:
        out = real(q, make, asked, lost)
        calls[0] += 1
        if calls[0] == 1:
            out[k] = redis.ConnectionError("reply lost")
        return out

    monkeypatch.setattr(partitioned_lease, "answering_sync", lossy)


def test_a_nonce_resent_after_a_lost_first_round_reply_keeps_to_limit(
    pq: PartitionedQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(pq, 0, 10)
    _put(pq, 1, 10)
    _put(pq, 2, 1)  # under its share: the others' second round takes what it leaves
    with monkeypatch.context() as m:
        _lose_reply(m, 2)
        first = pq.claim("w", limit=6, nonce="n0nce1")
    assert set(first.not_reached) == {pq.parts[2].name}
    again = pq.claim("w", limit=6, nonce="n0nce1")  # re-sent: partition 2's job back
    assert again.not_reached == {}
    assert len(again.jobs) <= 6, Counter(pq.layout.partition_of_id(j.id) for j in again.jobs)
    leased = sum(p.counts().leased for p in pq.parts)
    # every job this nonce leased is in one of the replies, and a third send is the second's
    third = pq.claim("w", limit=6, nonce="n0nce1")
    assert [(j.id, j.token) for j in third.jobs] == [(j.id, j.token) for j in again.jobs]
    assert leased == len({j.id for j in first.jobs} | {j.id for j in again.jobs})


def test_a_trickling_partition_is_served_beside_a_large_backlog(pq: PartitionedQueue) -> None:
    busy = set(_put(pq, 1, 60))
    waiting: set[str] = set()
    most = 0
    for i in range(30):  # fixed nonces: the turn's start is the same on every run
        if i % 2 == 0:
            waiting |= set(_put(pq, 0, 1) + _put(pq, 2, 1))
        batch = pq.claim("w", limit=3, nonce=f"steady{i}")
        got = {j.id for j in batch.jobs}
        assert len(got) == 3 and got <= busy | waiting
        waiting -= got
        most = max(most, len(waiting))
        assert pq.complete_many([(j.id, j.token, None) for j in batch.jobs]) == ["done"] * 3
    assert most <= 2 and not waiting  # each trickled job taken at the next claim


def test_a_partition_refusing_the_second_round_hides_no_leased_job(
    pq: PartitionedQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(pq, 0, 10)
    _put(pq, 1, 10)  # partition 2 empty: its share goes to 0 and 1 in a second round
    real = partitioned_lease_plan.second_round

    def then_corrupt(*args: Any) -> dict[int, int]:
        more = real(*args)
        assert set(more) == {0, 1}
        pq.client.set(pq.parts[0].keys.dead, "edited by hand")  # 0 refuses: CorruptKey
        return more

    monkeypatch.setattr(partitioned_lease, "second_round", then_corrupt)
    batch = pq.claim("w", limit=6, nonce="r0und2")
    leased = sum(p.counts().leased for p in pq.parts[1:]) + 2  # 0's first round: its share
    assert len(batch.jobs) == leased == 5  # 2 + 2 in the first round, 1 of 1's in the second
    assert set(batch.not_reached) == {pq.parts[0].name}
    assert "not a zset" in batch.not_reached[pq.parts[0].name]


def test_claim_is_typed_as_returning_a_partitioned_claim_batch() -> None:
    """Its `not_reached` is the way to see a partition left out: a caller under mypy --strict
    reads it without a cast (the tests needed `type: ignore[attr-defined]`)."""
    from scheduler.client.partitioned_lease_plan import PartitionedClaimBatch

    for cls in (PartitionedQueue, AsyncPartitionedQueue):
        assert get_type_hints(cls.claim)["return"] is PartitionedClaimBatch, cls


def test_the_asyncio_claim_keeps_to_limit_and_hides_nothing_as_the_sync_one(
    pq: PartitionedQueue, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two fixes above, through partitioned_lease_aio.py's own round calls."""
    _put(pq, 0, 10)
    _put(pq, 1, 10)
    real_round = partitioned_lease_plan.second_round
    real_answering = partitioned_partial.answering_async
    calls = [0]

    async def lossy(q: Any, make: Any, asked: Any, lost: Any = None) -> list[Any]:
        out = await real_answering(q, make, asked, lost)
        calls[0] += 1
        if calls[0] == 1:  # the first claim's first round: partition 2's reply lost
            out[2] = redis.ConnectionError("reply lost")
        return out

    def then_corrupt(*args: Any) -> dict[int, int]:
        more = real_round(*args)
        if calls[0] == 2:  # the second claim's second round: partition 0 refuses it
            pq.client.set(pq.parts[0].keys.dead, "edited by hand")
        return more

    monkeypatch.setattr("scheduler.client.partitioned_lease_aio.answering_async", lossy)
    monkeypatch.setattr("scheduler.client.partitioned_lease_aio.second_round", then_corrupt)

    async def main() -> tuple[Any, Any]:
        ac = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            first = await apq.claim("w", limit=6, nonce="as1nc")
            return first, await apq.claim("w", limit=6, nonce="as1nc2")
        finally:
            await ac.aclose()

    first, second = asyncio.run(main())
    assert set(first.not_reached) == {pq.parts[2].name} and len(first.jobs) == 4  # no round 2
    assert set(second.not_reached) == {pq.parts[0].name}
    leased = sum(p.counts().leased for p in pq.parts[1:]) + 4  # 0's: 2 and 2 of the rounds
    assert len(first.jobs) + len(second.jobs) == leased == 9  # 4, then 2 + 2 + 1 of 1's


def test_a_lost_second_round_reply_is_named_and_a_resent_nonce_returns_its_jobs(
    pq: PartitionedQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sound before this audit: kept as a guard of the replay of both rounds."""
    from scheduler.client import partitioned_ids

    _put(pq, 0, 10)
    _put(pq, 1, 10)
    real = partitioned_ids.looked_up
    calls = [0]

    def lossy(q: Any, make: Any, asked: Any) -> list[Any]:
        out = real(q, make, asked)
        calls[0] += 1
        if calls[0] == 1:
            out[0] = redis.ConnectionError("reply lost")  # ran: its job leased
        return out

    monkeypatch.setattr("scheduler.client.partitioned_lease.looked_up", lossy)
    first = pq.claim("w", limit=6, nonce="l0st2")
    assert len(first.not_reached) == 1 and len(first.jobs) == 5  # the first asked of 0, 1
    again = pq.claim("w", limit=6, nonce="l0st2")
    assert again.not_reached == {} and len(again.jobs) == 6
    assert {j.id for j in first.jobs} < {j.id for j in again.jobs}
    assert sum(p.counts().leased for p in pq.parts) == 6


def test_a_partition_refusing_the_first_round_hides_no_leased_job(
    pq: PartitionedQueue, redis_url: str
) -> None:
    """A partition refusing its first-round claim (a key edited by hand: CorruptKey; a newer
    version's storage in a rolling deploy: NewerStorage) while the others leased their shares:
    the claim raised that error and hid their jobs until their leases lapsed (an attempt spent
    each). It is named in not_reached, and the others' jobs are returned, sync and asyncio."""
    _put(pq, 0, 10)
    _put(pq, 1, 10)
    pq.client.set(pq.parts[2].keys.dead, "edited by hand")  # 2 refuses: CorruptKey
    batch = pq.claim("w", limit=6, nonce="r0und1")
    # Each answering partition's share (no second round after a partition's error: above).
    assert len(batch.jobs) == sum(p.counts().leased for p in pq.parts[:2]) == 4
    assert set(batch.not_reached) == {pq.parts[2].name}
    assert "not a zset" in batch.not_reached[pq.parts[2].name]

    async def main() -> Any:
        ac = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            return await apq.claim("w", limit=6, nonce="r0und1async")
        finally:
            await ac.aclose()

    got = asyncio.run(main())
    assert len(got.jobs) == 4 and set(got.not_reached) == {pq.parts[2].name}
    assert sum(p.counts().leased for p in pq.parts[:2]) == 8
    # Every partition refusing: none leased anything, the refusal is raised as Queue.claim's.
    for p in pq.parts[:2]:
        pq.client.set(p.keys.dead, "edited by hand")
    with pytest.raises(redis.ResponseError, match="not a zset"):
        pq.claim("w", limit=6)
