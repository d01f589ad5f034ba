"""The worker's per-job shortcuts (issue 16, docs/performance.md section 12) keep its behaviour."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis

from scheduler import Queue
from scheduler.core import claim_reply, codec
from scheduler.core.models import ClaimBatch, ClaimedJob
from scheduler.worker import EXIT_OK, Worker, WorkerSettings, dispatch
from scheduler.worker.context import JobContext
from scheduler.worker.registry import Registry


def _job_fields() -> dict[str, object]:
    return {
        "id": "j1",
        "token": "7-abc",
        "attempts": 2,
        "max_attempts": 5,
        "task": "t",
        "payload_json": '{"a": 1}',
        "run_at_ms": 10,
        "claimed_ms": 20,
        "backoff": codec.stored_backoff(""),
        "timeout_ms": 0,
        "schedule": "",
    }


def test_claimed_job_of_builds_what_the_constructor_builds() -> None:
    fields = _job_fields()
    fast = claim_reply.claimed_job_of(*fields.values())  # type: ignore[arg-type]
    slow = ClaimedJob(**fields)  # type: ignore[arg-type]
    assert fast == slow and hash(fast) == hash(slow)
    assert vars(fast) == vars(slow)
    # a field added to ClaimedJob but not to claimed_job_of would be missing here
    assert [f.name for f in dataclasses.fields(ClaimedJob)] == list(vars(fast))
    assert fast.fence == 7
    try:
        fast.id = "x"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("claimed_job_of must build a frozen ClaimedJob")


def test_parse_claim_builds_claimed_jobs_equal_to_the_constructor() -> None:
    raw = ["j1", "7-abc", "2", "5", "t", '{"a": 1}', "10", "", "0", "", ""]
    batch = claim_reply.parse_claim(["20", "-1", "1", *raw])
    assert batch.jobs == [ClaimedJob(**_job_fields())]  # type: ignore[arg-type]


# -- handler slots: a task that ends a run takes the backlog's next job (dispatch._run_async) ----

registry = Registry()
# (what, job id, the asyncio task it ran in: kept, so no two tasks can share an id())
EVENTS: list[tuple[str, str, asyncio.Task[Any] | None]] = []


def _note(what: str, ctx: JobContext) -> None:
    EVENTS.append((what, ctx.job_id, asyncio.current_task()))


@registry.task("quick")
async def quick(payload: Any, ctx: JobContext) -> None:
    _note("ran", ctx)
    await asyncio.sleep(0)


@registry.task("hang", timeout_s=0.3)
async def hang(payload: Any, ctx: JobContext) -> None:
    _note("ran", ctx)
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _note("cancelled", ctx)
        raise


@registry.task("swallow")
async def swallow(payload: Any, ctx: JobContext) -> str:
    """Stopped (cancelled at a heartbeat), it swallows the cancellation and returns anyway."""
    _note("ran", ctx)
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _note("cancelled", ctx)
    await asyncio.sleep(0.05)
    _note("returned", ctx)
    return "late"


@registry.task("bounded")
async def bounded(payload: Any, ctx: JobContext) -> None:
    """asyncio.timeout needs a task whose cancellation count is its own."""
    _note("ran", ctx)
    try:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(5)
    except TimeoutError:
        _note("timeout", ctx)


async def _poll(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; events {EVENTS}")
        await asyncio.sleep(0.01)


def _run_in_order(
    redis_url: str, q: Queue, tasks: list[str], during: Callable[[list[str]], Any] | None = None
) -> tuple[list[str], Callable[[str], set[Any]]]:
    """Enqueue one job per task name, lease them all to one worker of concurrency 1 in that
    order (one batch: the first runs, the rest wait in its backlog), run the worker until none
    is leased. Returns the ids and, per id, the tasks its handler ran in."""
    EVENTS.clear()
    ids = [q.enqueue(t, {}, max_attempts=1) for t in tasks]
    wid = "hot-" + uuid.uuid4().hex[:8]
    batch = q.claim(wid, limit=len(ids), lease_ms=10_000)
    by_id = {j.id: j for j in batch.jobs}
    assert set(by_id) == set(ids)
    ordered = ClaimBatch(batch.now_ms, batch.next_ms, [by_id[i] for i in ids], [])

    async def main() -> int:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        settings = WorkerSettings(
            queues=(q.name,), concurrency=1, lease_ms=10_000, heartbeat_ms=100, grace_s=1
        )
        w = Worker(client, registry, settings, worker_id=wid)
        run = asyncio.create_task(w.run(install_signals=False))
        await _poll(lambda: w._loop is not None, "the worker to start")
        w._take(q.name, ordered, time.monotonic())
        if during is not None:
            await during(ids)
        await _poll(lambda: not w._held and not w.running, "every job settled")
        w.request_stop()
        code = await run
        await client.aclose()
        return code

    assert asyncio.run(main()) == EXIT_OK

    def tasks_of(job_id: str) -> set[Any]:
        return {t for _, i, t in EVENTS if i == job_id}

    return ids, tasks_of


def test_a_timed_out_run_in_a_slot_stops_alone_and_the_next_job_runs(
    redis_url: str, q: Queue
) -> None:
    (first, hung, after), tasks_of = _run_in_order(redis_url, q, ["quick", "hang", "quick"])
    # the hung job ran in the task of the job before it (no Task of its own) ...
    assert tasks_of(first) == tasks_of(hung)
    assert ("cancelled", hung, *tasks_of(hung)) in EVENTS
    # ... its timeout stopped that run only: the next job ran, in a task of its own
    assert [e[0] for e in EVENTS if e[1] == after] == ["ran"]
    assert tasks_of(after).isdisjoint(tasks_of(hung))
    assert q.status(first) == q.status(after) == "done"
    job = q.get_job(hung)
    assert (job.state, job.fields["last_error_type"]) == ("dead", "JobTimeout")


def test_a_cancelled_run_in_a_slot_does_not_reach_the_next_job(redis_url: str, q: Queue) -> None:
    async def cancel_second(ids: list[str]) -> None:
        await _poll(lambda: ("ran", ids[1]) in [(e[0], e[1]) for e in EVENTS], "2nd job ran")
        await asyncio.to_thread(q.cancel, ids[1])

    (first, cancelled, after), tasks_of = _run_in_order(
        redis_url, q, ["quick", "swallow", "bounded"], during=cancel_second
    )
    assert tasks_of(first) == tasks_of(cancelled)
    whats = [e[0] for e in EVENTS if e[1] == cancelled]
    assert whats == ["ran", "cancelled", "returned"]
    # the next job's own asyncio.timeout still works: it did not inherit a cancellation
    assert [e[0] for e in EVENTS if e[1] == after] == ["ran", "timeout"]
    assert q.status(first) == q.status(after) == "done"
    assert q.status(cancelled) == "cancelled"


def test_handlers_that_never_suspend_still_let_the_loop_run_between_jobs() -> None:
    """A busy slot yields at least every _SLOT_YIELD_EVERY jobs (a Task per job yielded at
    every one): timers and the heartbeat are not held up for a whole backlog."""
    reg = Registry()
    ticks: list[int] = []

    @reg.task("instant")
    async def instant(payload: Any, ctx: JobContext) -> None:
        ticks.append(0)

    async def main() -> int:
        w = Worker(aredis.Redis(), reg, WorkerSettings(queues=("q",), concurrency=1))
        w._loop = loop = asyncio.get_running_loop()
        yields = 0

        def tick() -> None:
            nonlocal yields
            yields += 1
            if w.running or w._backlog:
                loop.call_soon(tick)

        n = 64
        raw = []
        for i in range(n):
            raw += [f"j{i}", f"{i + 1}-abc", "1", "5", "instant", "{}", "0", "", "0", "", ""]
        batch = claim_reply.parse_claim(["1", "-1", str(n), *raw])
        w._take("q", batch, time.monotonic())
        loop.call_soon(tick)
        while w.running or w._backlog:
            await asyncio.sleep(0)
        assert len(ticks) == n and not w._fails
        return yields

    yields = asyncio.run(main())
    assert yields >= 64 // dispatch._SLOT_YIELD_EVERY
