"""enqueue_many closes a script call at ENQUEUE_BYTES_PER_CALL bytes of fields, as the asyncio
batcher does (operations/enqueue_calls.py): 100 payloads of 512 KiB went as one 50 MiB call
that held Redis ~200 ms. Jobs that a later job of the call names in `after` (a chain, a parent
and its children) are never cut apart by bytes: all written or none, as in one call."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
import redis

import scheduler.operations.enqueue_calls as cut
import scheduler.operations.producing as producing
from scheduler import AsyncQueue, BadArgument, JobNotFound, JobSpec, Queue
from scheduler.client import enqueue_batcher
from scheduler.client.chain import achain, chain, chain_specs
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core import codec
from scheduler.core.connection import connect_async
from scheduler.core.limits import ENQUEUE_BYTES_PER_CALL, ENQUEUE_PER_CALL, ENQUEUE_WORK_PER_CALL
from scheduler.operations.enqueue_calls import enqueue_calls

W = codec.ENQUEUE_FIELDS
LIMIT = codec.MAX_PAYLOAD_BYTES
SMALL_BOUND = 2_000  # the bound the tests below set, for payloads of ~700 bytes


def call_bytes(args: list[str]) -> int:
    return len("".join(args[1:]).encode())


def job_bytes(args: list[str]) -> list[int]:
    return [len("".join(args[b : b + W]).encode()) for b in range(1, len(args), W)]


def tasks(calls: list[list[str]]) -> list[list[str]]:
    return [[a[b + 1] for b in range(1, len(a), W)] for a in calls]


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cut, "ENQUEUE_BYTES_PER_CALL", SMALL_BOUND)


def mid(task: str, **options: Any) -> JobSpec:
    return JobSpec(task, {"d": "x" * 700}, **options)


# --- the cut, without a server ------------------------------------------------------------------


def test_big_payloads_go_in_calls_bounded_by_bytes() -> None:
    big = {"d": "a" * (LIMIT - 10)}
    calls, in_turn = enqueue_calls([JobSpec("big", big) for _ in range(20)], 1000, LIMIT)
    assert sum(int(a[0]) for a in calls) == 20 and not in_turn
    assert all(call_bytes(a) <= ENQUEUE_BYTES_PER_CALL for a in calls), list(map(call_bytes, calls))
    # Cut at the bound, not before: each call but the last had no room for the next job.
    for a, b in itertools.pairwise(calls):
        assert call_bytes(a) + job_bytes(b)[0] > ENQUEUE_BYTES_PER_CALL


def test_bytes_are_counted_encoded_not_as_characters() -> None:
    """Payloads of 120,000 emoji: 480,000 bytes each, two a call of 1 MiB (eight if its
    characters were counted)."""
    wide = {"d": "\U0001f600" * 120_000}
    calls, _ = enqueue_calls([JobSpec("wide", wide) for _ in range(10)], 1000, LIMIT)
    assert [int(a[0]) for a in calls] == [2] * 5
    assert all(call_bytes(a) <= ENQUEUE_BYTES_PER_CALL for a in calls)


def test_both_enqueue_paths_share_one_bound() -> None:
    assert enqueue_batcher.MAX_BYTES == ENQUEUE_BYTES_PER_CALL == 1 << 20


@pytest.mark.usefixtures("small_bound")
def test_a_job_over_the_bound_goes_alone() -> None:
    specs = [mid("a"), JobSpec("huge", {"d": "y" * 5_000}), mid("b")]
    assert tasks(enqueue_calls(specs, 1000, LIMIT)[0]) == [["a"], ["huge"], ["b"]]


@pytest.mark.usefixtures("small_bound")
def test_jobs_a_later_job_names_are_not_cut_apart() -> None:
    """p, u, c after p: one call (c names p); then d, e after d, f: the call of p, u, c is full
    at d (no job after it names one of them), d and e stay together, f is cut off by bytes."""
    specs = [
        mid("p", job_id="p"),
        mid("u"),
        mid("c", after=["p"]),
        mid("d", job_id="d"),
        mid("e", after=["d"]),
        mid("f"),
    ]
    calls, in_turn = enqueue_calls(specs, 1000, LIMIT)
    assert tasks(calls) == [["p", "u", "c"], ["d", "e"], ["f"]]
    assert not in_turn  # a byte cut never leaves a parent in an earlier call


@pytest.mark.usefixtures("small_bound")
def test_a_chain_over_the_bound_is_one_call() -> None:
    specs = chain_specs([("step", {"d": "x" * 700}) for _ in range(30)], {})
    calls, in_turn = enqueue_calls(specs, len(specs), LIMIT)
    assert len(calls) == 1 and int(calls[0][0]) == 30 and not in_turn
    assert call_bytes(calls[0]) > 10 * SMALL_BOUND
    # Two chains: cut between them, each whole.
    two = specs + chain_specs([("next", {"d": "x" * 700}) for _ in range(3)], {})
    assert [int(a[0]) for a in enqueue_calls(two, 1000, LIMIT)[0]] == [30, 3]


def _by_count_and_work(specs: list[JobSpec], size: int) -> tuple[list[int], bool]:
    """The cut before the byte bound (jobs per call, in_turn): the reference for small jobs."""
    size, counts, work, in_turn = min(size, ENQUEUE_PER_CALL), list[int](), 0, False
    call_of: dict[str, int] = {}
    for spec in specs:
        fields = codec.enqueue_fields(spec, LIMIT)
        parents = fields[-1].rsplit("|", 1)[1].split() if fields[-1] else []
        if not counts or counts[-1] == size or work + 1 + len(parents) > ENQUEUE_WORK_PER_CALL:
            counts.append(0)
            work = 0
        k = len(counts) - 1
        in_turn = in_turn or any(call_of.get(p, k) < k for p in parents)
        call_of.setdefault(fields[0], k)
        counts[-1] += 1
        work += 1 + len(parents)
    return counts, in_turn


@pytest.mark.parametrize("seed", range(6))
def test_small_jobs_are_cut_as_before(seed: int) -> None:
    """Far below the byte bound, the calls are the ones counts and parents made (so their
    order, pipelining and one-at-a-time sending are unchanged)."""
    rnd = random.Random(seed)
    specs: list[JobSpec] = []
    for i in range(rnd.randrange(1, 3_000)):
        named = rnd.sample(range(i), min(i, rnd.choice([0, 0, 1, 3, 60]))) if i else []
        after = [f"j{k}" for k in named] + (["elsewhere"] if rnd.random() < 0.05 else [])
        specs.append(JobSpec("t", {"i": i}, job_id=f"j{i}", after=after or None))
    size = rnd.choice([1, 7, 500, 1000, 10_000])
    calls, in_turn = enqueue_calls(specs, size, LIMIT)
    assert ([int(a[0]) for a in calls], in_turn) == _by_count_and_work(specs, size)
    assert [a[b] for a in calls for b in range(1, len(a), W)] == [s.job_id for s in specs]


def test_a_spec_that_is_not_a_jobspec_is_refused() -> None:
    with pytest.raises(BadArgument, match="expected JobSpec"):
        enqueue_calls([JobSpec("t"), ("t", None)], 1000, LIMIT)


# --- every client's enqueue_many, on a server ---------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, small_bound: None) -> list[list[list[str]]]:
    """The calls each enqueue_many was cut into (producing.py's enqueue_calls)."""
    got: list[list[list[str]]] = []

    def record(specs: list[Any], size: int, payload_max: int) -> tuple[list[list[str]], bool]:
        calls, in_turn = enqueue_calls(specs, size, payload_max)
        got.append(calls)
        return calls, in_turn

    monkeypatch.setattr(producing, "enqueue_calls", record)
    return got


def _sync(q: Queue, client: redis.Redis, redis_url: str) -> Callable[[list[JobSpec]], list[str]]:
    return q.enqueue_many


def _async(q: Queue, client: redis.Redis, redis_url: str) -> Callable[[list[JobSpec]], list[str]]:
    def run(specs: list[JobSpec]) -> list[str]:
        async def go() -> list[str]:
            aclient = connect_async(redis_url)
            try:
                return await AsyncQueue(aclient, q.name).enqueue_many(specs)
            finally:
                await aclient.aclose()

        return asyncio.run(go())

    return run


@pytest.mark.parametrize("make", [_sync, _async], ids=["Queue", "AsyncQueue"])
def test_each_client_sends_calls_bounded_by_bytes(
    q: Queue,
    client: redis.Redis,
    redis_url: str,
    recorded: list[list[list[str]]],
    make: Callable[..., Callable[[list[JobSpec]], list[str]]],
) -> None:
    ids = make(q, client, redis_url)([mid("m") for _ in range(12)])
    assert len(set(ids)) == 12 and q.counts().due == 12
    (calls,) = recorded
    assert [int(a[0]) for a in calls] == [2] * 6
    assert all(call_bytes(a) <= SMALL_BOUND for a in calls)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["PartitionedQueue", "Async"])
def test_a_partitioned_queue_cuts_each_partition_by_bytes(
    pq: PartitionedQueue, redis_url: str, recorded: list[list[list[str]]], asynchronous: bool
) -> None:
    specs = [mid("m") for _ in range(18)]  # round robin over the partitions
    if asynchronous:

        async def go() -> list[str]:
            aclient = connect_async(redis_url)
            try:
                apq = await AsyncPartitionedQueue.open(aclient, pq.name)
                return await apq.enqueue_many(specs)
            finally:
                await aclient.aclose()

        ids = asyncio.run(go())
    else:
        ids = pq.enqueue_many(specs)
    assert len(set(ids)) == 18 and pq.counts().due == 18
    assert len(recorded) >= 2  # one enqueue_many per partition written to
    per_call = [int(a[0]) for calls in recorded for a in calls]
    assert sum(per_call) == 18 and max(per_call) == 2
    assert all(call_bytes(a) <= SMALL_BOUND for calls in recorded for a in calls)


def test_a_chain_over_the_bound_is_written_whole(
    q: Queue, redis_url: str, recorded: list[list[list[str]]]
) -> None:
    steps = [("step", {"d": "x" * 700}) for _ in range(10)]
    assert len(chain(q, steps)) == 10 and q.counts().held_waiting == 9

    async def go() -> list[str]:
        aclient = connect_async(redis_url)
        try:
            return await achain(AsyncQueue(aclient, q.name), steps)
        finally:
            await aclient.aclose()

    assert len(asyncio.run(go())) == 10 and q.counts().held_waiting == 18
    assert [[int(a[0]) for a in calls] for calls in recorded] == [[10], [10]]


@pytest.mark.usefixtures("small_bound")
def test_a_refused_child_writes_nothing_of_its_parent(q: Queue) -> None:
    """p and its child go in one call whatever their bytes: the child refused (a parent
    missing), p is not written either, as when they fit one call."""
    specs = [mid("p", job_id="p"), mid("u"), mid("c", after=["p", "missing"])]
    with pytest.raises(BadArgument, match="no such job") as err:
        q.enqueue_many(specs)
    assert getattr(err.value, "written_ids", []) == []
    with pytest.raises(JobNotFound):
        q.get_job("p")
    assert q.counts().due == 0
