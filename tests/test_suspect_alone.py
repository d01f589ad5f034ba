"""A suspect on its last attempt runs alone (lua/claim.lua, scheduler/worker/alone.py): a crash of
its worker parks it, so it is leased only to a worker that says it holds nothing, as the only
job of its call; a worker holding one is leased nothing; a busy worker that meets one is told to
drain (one worker at a time), and back with nothing held it gets that suspect first, ahead of
older due jobs. Under the test clock (the scripts read no TIME), and an embedded worker."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, Queue
from scheduler.core.claim_reply import claim_args
from scheduler.core.connection import connect_async
from scheduler.core.errors import BadArgument
from scheduler.core.models import ClaimBatch
from scheduler.operations.requests import Op, Script
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.holding_claim import HoldingClaim
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import Clock
from tests.fixtures.suspects import last_attempt_suspect

T0 = 1_000_000
LEASE_MS = 1000
EARLIER = datetime.fromtimestamp(T0 / 1000, tz=UTC)  # due before the reaped suspect


def _claim(q: Queue, worker: str, limit: int = 10, **kw: object) -> ClaimBatch:
    """Queue.claim's operation with the worker's `holding` / `drained_for` (the worker's path)."""
    return q._run(q.ops.claim(worker, limit=limit, lease_ms=LEASE_MS, **kw))  # type: ignore[arg-type]


def _last_attempt_suspect(q: Queue, clock: Clock) -> str:
    """A job whose lease lapsed once with one attempt left (max_attempts=2): a suspect whose
    next lease is its last attempt. Due again at T0 + LEASE_MS + 1."""
    clock.set_ms(T0)
    job = q.enqueue("t", max_attempts=2)
    (first,) = _claim(q, "crashed").jobs  # its worker is killed
    assert first.id == job
    clock.set_ms(T0 + LEASE_MS + 1)
    _claim(q, "reaper", limit=0)  # reaped: due again, lapses 1
    assert q.status(job) == "due"
    return job


def test_a_busy_worker_is_not_leased_it_and_is_told_to_drain(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    suspect = _last_attempt_suspect(q, clock)
    got = _claim(q, "busy", holding=3)
    assert [j.id for j in got.jobs] == [] and got.drain == suspect
    assert q.status(suspect) == "due"
    # A second busy worker is not told too (one drains at a time), nor leased it.
    other = _claim(q, "busy2", holding=1)
    assert other.jobs == [] and other.drain is None
    # The drainer mark lapses with the first one's lease length: then another may drain.
    clock.set_ms(T0 + 2 * LEASE_MS + 2)
    assert _claim(q, "busy2", holding=1).drain == suspect
    assert client.hget(q.keys.job(suspect), "drainer") is not None


def test_the_drainer_back_with_nothing_held_gets_it_first_and_alone(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    suspect = _last_attempt_suspect(q, clock)
    assert _claim(q, "w", holding=2).drain == suspect
    plain_before = [q.enqueue("t", {}, run_at=EARLIER) for _ in range(3)]  # due ahead of it
    got = _claim(q, "w", holding=0, drained_for=suspect)
    assert [j.id for j in got.jobs] == [suspect] and got.suspect == suspect
    assert got.jobs[0].attempts == got.jobs[0].max_attempts == 2
    assert all(q.status(j) == "due" for j in plain_before)
    # While it runs, this worker is leased nothing, and not told to come back at once.
    again = _claim(q, "w", holding=1)
    assert again.jobs == [] and again.next_ms > again.now_ms
    # Another worker takes the plain jobs meanwhile.
    assert sorted(j.id for j in _claim(q, "w2", holding=0).jobs) == sorted(plain_before)


def test_an_idle_worker_takes_it_only_as_the_first_job_of_its_call(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    suspect = _last_attempt_suspect(q, clock)
    later = [q.enqueue("t", {}) for _ in range(3)]  # due after the suspect
    got = _claim(q, "idle", holding=0)
    assert [j.id for j in got.jobs] == [suspect]  # alone: the rest left due
    assert all(q.status(j) == "due" for j in later)
    assert _claim(q, "idle", holding=1).jobs == []  # holding it: nothing more
    # Its lease gone (settled), the worker is leased again.
    (job,) = got.jobs
    q.complete(job.id, job.token, None)
    assert len(_claim(q, "idle", holding=0).jobs) == 3


def test_a_call_that_took_jobs_skips_it_and_leaves_it_due(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    suspect = _last_attempt_suspect(q, clock)
    older = [q.enqueue("t", {}, run_at=EARLIER) for _ in range(2)]
    got = _claim(q, "idle", holding=0)
    assert sorted(j.id for j in got.jobs) == sorted(older) and got.suspect is None
    assert got.drain == suspect and q.status(suspect) == "due"


def test_a_client_that_does_not_say_what_it_holds_takes_it_alone(tq: tuple[Queue, Clock]) -> None:
    """Queue.claim (no `holding`): the suspect is leased as the only job of the call."""
    q, clock = tq
    suspect = _last_attempt_suspect(q, clock)
    later = q.enqueue("t", {})
    got = q.claim("manual", limit=10, lease_ms=LEASE_MS)
    assert [j.id for j in got.jobs] == [suspect] and got.drain is None
    assert q.status(later) == "due"


@pytest.mark.parametrize(
    ("holding", "drained_for"),
    [(-1, None), (1001, None), (True, None), (None, "j1"), (0, "bad id!")],
)
def test_bad_holding_or_drained_for_is_refused_before_any_call(
    holding: object, drained_for: object
) -> None:
    with pytest.raises(BadArgument):
        claim_args("w", 10, 1000, "n1", 0, holding, drained_for)  # type: ignore[arg-type]


def _raw_claim(args: list[str]) -> Op[Any]:
    reply = yield Script("claim", args)
    return reply


@pytest.mark.parametrize("holding", ["-1", "x", "1001", "1.5"])
def test_the_script_refuses_a_holding_text_that_is_not_a_count(
    tq: tuple[Queue, Clock], holding: str
) -> None:
    q, _ = tq
    job = q.enqueue("t", {})
    with pytest.raises(BadArgument, match="holding"):
        q._run(_raw_claim(["w", "10", "1000", "n1", "0", holding]))
    assert q.status(job) == "due"  # nothing leased
    assert q.claim("w", limit=10).jobs[0].id == job


# -- the worker: it drains, then runs the suspect alone --------------------------------------------

_events: list[tuple[str, str, frozenset[str]]] = []  # (what, job id, jobs running then)
_running: set[str] = set()
_gate: asyncio.Event | None = None
alone_registry = Registry()


@alone_registry.task(name="sa-long")
async def _long(payload: Any, ctx: JobContext) -> None:
    _events.append(("start", ctx.job_id, frozenset(_running)))
    _running.add(ctx.job_id)
    assert _gate is not None
    await _gate.wait()
    _running.discard(ctx.job_id)


@alone_registry.task(name="sa-quick")
async def _quick(payload: Any, ctx: JobContext) -> None:
    _events.append(("start", ctx.job_id, frozenset(_running)))


def test_a_busy_worker_drains_then_runs_the_last_attempt_suspect_alone(
    redis_url: str, queue_name: str, client: redis.Redis
) -> None:
    global _gate
    _events.clear()
    _running.clear()
    q = Queue(client, queue_name)
    suspect = last_attempt_suspect(q, "sa-quick")
    long = q.enqueue("sa-long", {}, run_at=EARLIER)  # ahead of it in due

    async def main() -> None:
        global _gate
        _gate = asyncio.Event()
        aclient = connect_async(redis_url)
        settings = WorkerSettings(queues=(queue_name,), concurrency=4, lease_ms=5000,
                                  heartbeat_ms=500, grace_s=5)  # fmt: skip
        worker = Worker(aclient, alone_registry, settings)
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            end = time.monotonic() + 20
            while not _running:  # the long job runs; the suspect was skipped (a drain)
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
            later = [
                await AsyncQueue(aclient, queue_name).enqueue("sa-quick", {}) for _ in range(3)
            ]
            # Draining: however many claims it makes meanwhile, nothing new is leased.
            for _ in range(20):
                await asyncio.sleep(0.02)
                assert q.status(suspect) == "due" and all(q.status(j) == "due" for j in later)
            _gate.set()
            while any(q.status(j) != "done" for j in [long, suspect, *later]):
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 30)
            await aclient.aclose()

    asyncio.run(main())
    starts = [job for what, job, _ in _events if what == "start"]
    assert starts[:2] == [long, suspect]  # the suspect first once the worker held nothing
    (alone,) = [running for what, job, running in _events if job == suspect]
    assert alone == frozenset()  # nothing else ran beside it


def test_a_worker_of_two_queues_drains_and_claims_the_suspects_queue_first(
    redis_url: str, queue_name: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Draining, it claims only the suspect's queue (renewing its mark, nothing taken); once it
    holds nothing, that queue first, not the other queue's plain jobs, even while an empty
    claim of it has it sitting out the round's wait."""
    global _gate
    _events.clear()
    _running.clear()
    qa, qb = Queue(client, queue_name), Queue(client, queue_name + "-b")
    suspect = last_attempt_suspect(qa, "sa-quick")
    long = qa.enqueue("sa-long", {}, run_at=EARLIER)
    renewals: list[str] = []  # queue names of the drain claims that took nothing
    real = HoldingClaim.claim

    async def spy(self: HoldingClaim, *args: Any, **kwargs: Any) -> ClaimBatch:
        batch = await real(self, *args, **kwargs)
        if kwargs.get("drained_for") and not batch.jobs and batch.drain:
            renewals.append(self.name)
        return batch

    monkeypatch.setattr(HoldingClaim, "claim", spy)

    async def main() -> None:
        global _gate
        _gate = asyncio.Event()
        aclient = connect_async(redis_url)
        settings = WorkerSettings(queues=(qa.name, qb.name), concurrency=4, lease_ms=1000,
                                  heartbeat_ms=200, grace_s=5)  # fmt: skip
        worker = Worker(aclient, alone_registry, settings)
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            end = time.monotonic() + 20
            while not renewals:  # draining: a renewal claim of qa took nothing
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.01)
            await AsyncQueue(aclient, qb.name).enqueue("sa-quick", {})
            _gate.set()  # it holds nothing now, qa sitting out its wait
            while qa.status(suspect) != "done":
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 30)
            await aclient.aclose()

    try:
        asyncio.run(main())
    finally:
        qb.client.delete(*qb.client.keys(qb.keys.pattern()) or ["-"])
    starts = [job for what, job, _ in _events if what == "start"]
    assert starts[:2] == [long, suspect], starts
    (alone,) = [running for what, job, running in _events if job == suspect]
    assert alone == frozenset()
