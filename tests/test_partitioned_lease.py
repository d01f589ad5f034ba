"""The manual lease API on a partitioned queue (client/partitioned_lease*.py): claim over every
partition (at most `limit` in all, shared fairly, a busy partition's surplus taken in a second
round), and heartbeat / set_progress / complete_many / fail / release of jobs from several
partitions (answers in the caller's order), set_dead_retention on every partition, sync and
asyncio. Before, PartitionedQueue and AsyncPartitionedQueue had none of them (AttributeError):
a consumer loop reached into `pq.parts[k]`. A node down: test_partitioned_lease_node_down.py."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest
from redis import Redis

from scheduler import AsyncPartitionedQueue, BadArgument, JobSpec, StaleToken
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_lease import PartitionedClaimBatch
from scheduler.client.partitioned_partial import nodes_of
from scheduler.core.connection import connect_async
from scheduler.core.scripts import run_sync

pytestmark = pytest.mark.pq(partitions=3)


def _put(pq: PartitionedQueue, k: int, n: int, **kw: object) -> list[str]:
    """n jobs in partition k (ids tagged with it)."""
    specs = [JobSpec("t", {"i": i}, job_id=f"p{k}.{uuid.uuid4().hex}", **kw) for i in range(n)]  # type: ignore[arg-type]
    return pq.enqueue_many(specs)


def _where(pq: PartitionedQueue, ids: list[str]) -> Counter[int]:
    return Counter(pq.layout.partition_of_id(i) for i in ids)


def _leased(pq: PartitionedQueue) -> int:
    return sum(p.counts().leased for p in pq.parts)


def test_claim_spreads_over_partitions_and_respects_limit(pq: PartitionedQueue) -> None:
    for k in range(3):
        _put(pq, k, 5)
    batch = pq.claim("w", limit=6)
    assert isinstance(batch, PartitionedClaimBatch) and batch.not_reached == {}
    assert _where(pq, [j.id for j in batch.jobs]) == {0: 2, 1: 2, 2: 2}
    more = pq.claim("w", limit=4)
    got = [j.id for j in more.jobs]
    assert len(got) == 4 and set(_where(pq, got)) == {0, 1, 2}  # 2, 1, 1 from the turn's start
    assert _leased(pq) == 10 and not {j.id for j in batch.jobs} & set(got)
    assert 0 <= batch.next_ms <= batch.now_ms  # more due now


def test_a_busy_partition_neither_starves_the_others_nor_is_capped_by_its_share(
    pq: PartitionedQueue,
) -> None:
    busy = _put(pq, 1, 20)
    lone = _put(pq, 0, 1) + _put(pq, 2, 1)
    batch = pq.claim("w", limit=3)
    ids = [j.id for j in batch.jobs]
    assert set(lone) <= set(ids) and len(ids) == 3  # each partition its share: one
    batch = pq.claim("w", limit=5)  # the others are empty: the busy one gives all 5
    assert len(batch.jobs) == 5 and {j.id for j in batch.jobs} <= set(busy)
    assert _leased(pq) == 8
    for limit in (1, 2):  # below the partition count: the turns still reach the busy one
        assert len(pq.claim("w", limit=limit).jobs) == limit
    assert _leased(pq) == 11


def test_claim_of_an_empty_queue_and_a_resent_nonce(pq: PartitionedQueue) -> None:
    empty = pq.claim("w", limit=10)
    assert empty.jobs == [] and empty.next_ms == -1
    ids = _put(pq, 0, 2) + _put(pq, 2, 2)
    first = pq.claim("w", limit=3, nonce="abc123")
    again = pq.claim("w", limit=3, nonce="abc123")  # its answer lost: the same jobs, no more
    assert [(j.id, j.token) for j in again.jobs] == [(j.id, j.token) for j in first.jobs]
    assert len(first.jobs) == 3 and _leased(pq) == 3
    rest = pq.claim("w", limit=10)
    assert {j.id for j in rest.jobs} | {j.id for j in first.jobs} == set(ids)


def test_round_trip_across_partitions(pq: PartitionedQueue) -> None:
    ids = [_put(pq, k, 1, max_attempts=2)[0] for k in range(3)]
    batch = pq.claim("w", limit=10, lease_ms=5_000)
    tok = {j.id: j.token for j in batch.jobs}
    assert set(tok) == set(ids)
    leases = [(i, tok[i]) for i in reversed(ids)]
    until, statuses = pq.heartbeat(leases, lease_ms=60_000)
    assert statuses == {i: "held" for i in ids} and until >= batch.now_ms + 59_000
    assert pq.set_progress(ids[1], tok[ids[1]], {"done": 1}) == "held"
    assert pq.get_job(ids[1]).progress == {"done": 1}
    assert pq.complete_many([(ids[2], tok[ids[2]], 2), (ids[0], tok[ids[0]], None)]) == [
        "done",
        "done",
    ]
    assert pq.result(ids[2], timeout_s=1) == 2
    out = pq.fail(ids[1], tok[ids[1]], ("E", "boom", ""), delay_ms=0)
    assert out.status == "retry"
    again = pq.claim("w", limit=10)
    assert [j.id for j in again.jobs] == [ids[1]] and again.jobs[0].attempts == 2
    out = pq.fail(ids[1], again.jobs[0].token, ("E", "boom", ""))
    assert (out.status, out.dead_reason) == ("dead", "attempts exhausted")
    assert pq.dead_ids() == [ids[1]]
    assert pq.heartbeat(leases)[1] == {ids[0]: "missing", ids[1]: "missing", ids[2]: "missing"}


def test_release_gives_back_jobs_of_several_partitions_in_the_callers_order(
    pq: PartitionedQueue,
) -> None:
    ids = [_put(pq, k, 1)[0] for k in (2, 0, 1)]
    tok = {j.id: j.token for j in pq.claim("w", limit=10).jobs}
    pairs = [(ids[0], tok[ids[0]]), ("p1.nope", "1-abc"), (ids[2], tok[ids[2]])]
    assert pq.release(pairs) == ["released", "missing", "released"]
    assert pq.status(ids[0]) == "due" and pq.status(ids[1]) == "leased"
    back = pq.claim("w", limit=10).jobs
    assert {j.id for j in back} == {ids[0], ids[2]} and {j.attempts for j in back} == {1}


@pytest.mark.pq(partitions=3, _clock="test")
def test_a_stale_token_is_refused_across_partitions(pq: PartitionedQueue, client: Redis) -> None:
    """Leases lapsed, then reaped and leased again by another claim: the first tokens are
    refused by every call, in every partition ('expired' before the reap)."""

    def at(ms: int) -> None:
        for p in pq.parts:
            client.set(p.keys.test_clock, ms)

    at(1_000)
    ids = [_put(pq, k, 1)[0] for k in range(3)]
    first = {j.id: j.token for j in pq.claim("w", limit=10, lease_ms=1_000).jobs}
    old = [(i, first[i]) for i in ids]
    at(3_000)
    assert pq.heartbeat(old)[1] == dict.fromkeys(ids, "expired")
    now = {j.id: j.token for j in pq.claim("w2", limit=10).jobs}  # reaps, leases again
    assert set(now) == set(ids)
    assert pq.heartbeat(old)[1] == dict.fromkeys(ids, "stale")
    assert pq.set_progress(ids[0], first[ids[0]], 1) == "stale"
    assert pq.complete_many([(i, first[i], None) for i in ids]) == ["stale"] * 3
    assert pq.release(old) == ["stale"] * 3
    with pytest.raises(StaleToken):
        pq.fail(ids[2], first[ids[2]], ("E", "x", ""))
    assert pq.heartbeat([(i, now[i]) for i in ids])[1] == dict.fromkeys(ids, "held")


def test_bad_input_is_a_typed_error_that_changes_nothing(pq: PartitionedQueue) -> None:
    ids = [_put(pq, k, 1)[0] for k in range(3)]
    for bad in (-1, 1001, "3", None):
        with pytest.raises(BadArgument):
            pq.claim("w", limit=bad)  # type: ignore[arg-type]
    for kw in ({"lease_ms": 0}, {"reap_limit": -1}, {"nonce": "not ok"}):
        with pytest.raises(BadArgument):
            pq.claim("w", **kw)
    with pytest.raises(BadArgument):
        pq.claim("", limit=1)
    assert _leased(pq) == 0
    assert pq.claim("w", limit=0).jobs == [] and _leased(pq) == 0  # as Queue: leases nothing
    tok = {j.id: j.token for j in pq.claim("w", limit=10).jobs}
    good = [(i, tok[i]) for i in ids]
    for leases in ("abc", [("a",)], [good[0], (None, "1-a")], [good[0], (3, tok[ids[1]])]):
        for call in (pq.heartbeat, pq.release):
            with pytest.raises(BadArgument):
                call(leases)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        pq.complete_many([(ids[0], tok[ids[0]], None), (ids[1], 7, None)])  # type: ignore[list-item]
    with pytest.raises(BadArgument):
        pq.complete_many([(ids[0], tok[ids[0]])])  # type: ignore[list-item]
    with pytest.raises(BadArgument):
        pq.set_progress(3, tok[ids[0]], 1)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        pq.fail(ids[0], tok[ids[0]], ("E", "x", ""), delay_ms=-1)
    for kw in ({"max_count": -1}, {"max_age_ms": 0}, {"max_count": "1"}):
        with pytest.raises(BadArgument):
            pq.set_dead_retention(**kw)
    assert [pq.status(i) for i in ids] == ["leased"] * 3  # nothing completed, failed, released
    assert (
        pq.complete_many(
            [(i, tok[i], None) for i in ids] + [("p0.nope", "1-a", None), ("nope", "1-a", None)]
        )
        == ["done"] * 3 + ["missing"] * 2
    )


def test_set_dead_retention_applies_to_every_partition(pq: PartitionedQueue) -> None:
    pq.set_dead_retention(max_count=0)
    ids = [_put(pq, k, 1)[0] for k in range(3)]
    for j in pq.claim("w", limit=10).jobs:
        assert pq.fail(j.id, j.token, ("E", "x", ""), retryable=False).status == "dead"
    assert pq.dead_ids() == [] and [p.counts().dead for p in pq.parts] == [0, 0, 0]
    pq.set_dead_retention()  # both None: every dead letter kept again
    _put(pq, 1, 1, max_attempts=1)
    j = pq.claim("w", limit=10).jobs[0]
    pq.fail(j.id, j.token, ("E", "x", ""))
    assert pq.dead_ids() == [j.id] and j.id not in ids


def test_a_job_written_to_a_partitions_own_queue_is_leased_where_it_is(
    pq: PartitionedQueue,
) -> None:
    """An untagged id routing to another partition than the one holding it (`pq.parts[k]`):
    the calls by id look for it in the others when its own answers 'missing'."""
    stray = next(f"s-{n}" for n in range(500) if pq.layout.partition_of_id(f"s-{n}") != 0)
    pq.parts[0].enqueue("t", None, job_id=stray)
    (job,) = pq.claim("w", limit=10).jobs
    assert job.id == stray
    assert pq.heartbeat([(stray, job.token)])[1] == {stray: "held"}
    assert pq.set_progress(stray, job.token, 5) == "held"
    assert pq.release([(stray, job.token)]) == ["released"]
    job = pq.claim("w", limit=10).jobs[0]
    assert pq.complete_many([(stray, job.token, 1)]) == ["done"]
    assert pq.parts[0].status(stray) == "done"


def test_the_asyncio_twin_leases_as_the_sync_one(pq: PartitionedQueue, redis_url: str) -> None:
    ids = [_put(pq, k, 1, max_attempts=1)[0] for k in (0, 2)] + _put(pq, 1, 5, max_attempts=1)

    async def main() -> None:
        ac = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            with pytest.raises(BadArgument):
                await apq.claim("w", limit=-1)
            with pytest.raises(BadArgument):
                await apq.heartbeat([(ids[0], 5)])  # type: ignore[list-item]
            batch = await apq.claim("w", limit=3)
            assert isinstance(batch, PartitionedClaimBatch)
            assert set(_where(pq, [j.id for j in batch.jobs])) == {0, 1, 2}  # one each
            tok = {j.id: j.token for j in batch.jobs}
            rest = await apq.claim("w", limit=10)  # the busy partition's surplus
            assert _where(pq, [j.id for j in rest.jobs]) == {1: 4}
            tok |= {j.id: j.token for j in rest.jobs}
            # ids: the first claim's, partition 0, 1, 2, then the surplus of partition 1
            first = sorted((j.id for j in batch.jobs), key=pq.layout.partition_of_id)
            ids[:] = first + [j.id for j in rest.jobs]
            leases = [(i, tok[i]) for i in ids]
            assert (await apq.heartbeat(leases))[1] == dict.fromkeys(ids, "held")
            assert await apq.set_progress(ids[1], tok[ids[1]], [1]) == "held"
            assert await apq.release(leases[3:]) == ["released"] * 4
            assert await apq.complete_many([(ids[2], tok[ids[2]], 1), (ids[0], "1-x", 1)]) == [
                "done",
                "stale",
            ]
            with pytest.raises(StaleToken):
                await apq.fail(ids[0], "1-x", ("E", "x", ""))
            out = await apq.fail(ids[0], tok[ids[0]], ("E", "x", ""))
            assert (out.status, out.dead_reason) == ("dead", "attempts exhausted")
            with pytest.raises(BadArgument):
                await apq.set_dead_retention(max_count=-1)
            await apq.set_dead_retention(max_count=0)
            out = await apq.fail(ids[1], tok[ids[1]], ("E", "x", ""), retryable=False)
            assert out.status == "dead"
        finally:
            await ac.aclose()

    asyncio.run(main())
    # Retention trims as jobs die: ids[1] at once; ids[0], dead before, at its partition's next.
    assert pq.dead_ids() == [ids[0]] and pq.status(ids[2]) == "done"
    assert [pq.status(i) for i in ids[3:]] == ["due"] * 4


def test_one_driver_call_per_node_for_every_partition(
    pq: PartitionedQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every partition's part of a call goes in one driver call per node (one server: one
    call); a claim whose first round fills `limit` makes no second."""
    calls: list[int] = []
    node = nodes_of(pq.client, pq.parts)

    def per_node(ks: list[int]) -> int:
        return len({node[k] for k in ks})

    def counted(client: Any, gen: Any) -> Any:
        calls.append(1)
        return run_sync(client, gen)

    ids = [i for k in range(3) for i in _put(pq, k, 2)]
    monkeypatch.setattr("scheduler.client.partitioned.run_sync", counted)
    batch = pq.claim("w", limit=3)
    assert len(calls) == per_node([0, 1, 2])
    assert set(_where(pq, [j.id for j in batch.jobs])) == {0, 1, 2}
    tok = {j.id: j.token for j in batch.jobs}
    leases = list(tok.items())
    for call in (
        lambda: pq.heartbeat(leases),
        lambda: pq.complete_many([(i, t, None) for i, t in leases]),
    ):
        calls.clear()
        call()
        assert len(calls) == per_node([0, 1, 2])
    calls.clear()  # every partition checked, then every partition written: two per node
    pq.set_dead_retention(max_count=5)
    assert len(calls) == 2 * per_node([0, 1, 2])
    calls.clear()
    assert len(pq.claim("w", limit=10).jobs) == 3  # one each left: their share, no second round
    assert len(calls) == per_node([0, 1, 2])
    calls.clear()  # a tagged id answered 'missing' is not looked for elsewhere
    assert pq.release([(ids[0], "1-x"), ("p2.none", "1-x")]) == ["stale", "missing"]
    assert len(calls) == per_node([0, 2])
    calls.clear()  # an untagged one is: one more call
    k = pq.layout.partition_of_id("none")
    assert pq.release([("none", "1-x")]) == ["missing"]
    assert len(calls) == 1 + per_node([j for j in range(3) if j != k])


def test_an_id_tagged_beyond_the_partition_count_is_looked_for_as_untagged(
    pq: PartitionedQueue,
) -> None:
    """'p7.x' on 3 partitions routes by its hash: a job of that id written to another
    partition's own queue is found there as any untagged one."""
    odd = next(f"p7.{n}" for n in range(500) if pq.layout.partition_of_id(f"p7.{n}") != 1)
    pq.parts[1].enqueue("t", None, job_id=odd)
    (job,) = pq.claim("w", limit=10).jobs
    assert job.id == odd and pq.heartbeat([(odd, job.token)])[1] == {odd: "held"}
    assert pq.complete_many([(odd, job.token, None)]) == ["done"]
