"""The manual API's batch calls (heartbeat, complete_many, release, progress) given a long list
go as script calls of at most SETTLE_CHUNK items each (one pipeline): one script runs alone on
the server, and one heartbeat of 100,000 leases held it 2.4 s, one complete_many of 50,000
3.2 s (bench/lua_call_bounds.py settle), every client of that Redis waiting."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler.core.keys import QueueKeys
from scheduler.operations.leasing import SETTLE_CHUNK
from scheduler.operations.ops import Ops, Settings
from scheduler.operations.requests import Script, ScriptPipeline

N = 2 * SETTLE_CHUNK + 201  # three calls: 250, 250, 201


def _items_per_call(request: Any, head: int, width: int) -> list[int]:
    calls = request.calls if isinstance(request, ScriptPipeline) else [request]
    assert all(isinstance(c, Script) for c in calls)
    return [(len(c.args) - head) // width for c in calls]


def _first(op: Generator[Any, Any, Any]) -> Any:
    return next(op)


@pytest.mark.parametrize(
    ("name", "head", "width"),
    [("heartbeat", 1, 2), ("complete_many", 1, 3), ("release", 0, 2), ("progress", 0, 3)],
)
def test_a_long_list_goes_in_calls_of_a_bounded_size(name: str, head: int, width: int) -> None:
    ops = Ops(QueueKeys("chunks"), Settings())
    pairs = [(f"job-{i}", f"tok-{i}") for i in range(N)]
    triples = [(i, t, None) for i, t in pairs]
    calls: dict[str, Callable[[], Any]] = {
        "heartbeat": lambda: ops.heartbeat(pairs, lease_ms=30_000),
        "complete_many": lambda: ops.complete_many(triples),
        "release": lambda: ops.release(pairs),
        "progress": lambda: ops.progress(triples),
    }
    op = calls[name]()
    sizes = _items_per_call(_first(op), head, width)
    assert sizes == [SETTLE_CHUNK, SETTLE_CHUNK, N - 2 * SETTLE_CHUNK]  # before: [1201]


def test_a_short_list_is_still_one_call() -> None:
    ops = Ops(QueueKeys("chunks"), Settings())
    assert isinstance(_first(ops.complete_many([("a", "t", None)])), Script)


def test_the_chunked_calls_answer_as_one(client: redis.Redis, q: Queue) -> None:
    """On a real server: every status in the order given, the earliest lease end."""
    q.enqueue_many([JobSpec("t", i) for i in range(N)])
    jobs = []
    while batch := q.claim("w", limit=1_000, lease_ms=60_000).jobs:
        jobs += batch
    assert len(jobs) == N
    leases = [(j.id, j.token) for j in jobs]
    until, statuses = q.heartbeat([*leases, ("nope", "0-0")], lease_ms=120_000)
    assert statuses == {**{i: "held" for i, _ in leases}, "nope": "missing"}
    assert until == min(int(s) for s in client.zrange(q.keys.leased, 0, 0, withscores=True)[0][1:])
    half = N // 2
    assert q.release(leases[:half]) == ["released"] * half
    done = q.complete_many([(i, t, None) for i, t in leases[half:]])
    assert done == ["done"] * (N - half)
    assert (q.counts().due, q.counts().leased) == (half, 0)


def test_the_workers_report_pipeline_sends_a_chunked_call(redis_url: str, q: Queue) -> None:
    """A worker's report round with more outcomes of one queue than SETTLE_CHUNK: its
    complete_many goes as several calls, and the worker's Pipeline refused that (TypeError:
    'single-script operations only'), which ended the reporter and the worker, every outcome
    of the round unreported (bench/worker_bench.py's drain of 300 met it 1 run in 10)."""
    import asyncio

    from scheduler.core.connection import connect_async
    from scheduler.worker.execution import Pipeline

    q.enqueue_many([JobSpec("t", {"i": i}) for i in range(N)])
    batch = q.claim("w", limit=N, lease_ms=60_000)
    assert len(batch.jobs) == N
    triples = [(j.id, j.token, None) for j in batch.jobs]

    async def run() -> list[Any]:
        client = connect_async(redis_url)
        try:
            return await Pipeline(client).run(
                [(q.keys.script_keys(), q.ops.complete_many(triples))]
            )
        finally:
            await client.aclose()

    (statuses,) = asyncio.run(run())
    assert statuses == ["done"] * N
