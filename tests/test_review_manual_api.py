"""Review of the "drive jobs yourself" API (docs/guide/manual.md, README "What it promises"):
claim / heartbeat / complete / fail / release on Queue, AsyncQueue and the partitioned queues,
checked against what the guide promises. Each xfail is one defect found by the review; the
tests assert the behaviour the guide describes (or, for a doc defect, accept a fixed doc)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import importlib
import multiprocessing
import pickle
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import redis

import scheduler
from scheduler import (
    AsyncQueue,
    BadArgument,
    CorruptKey,
    JobCancelled,
    JobDead,
    JobTimeout,
    LeaseExpired,
    LeaseRefused,
    NotDurable,
    PartitionedQueue,
    PartitionsNotReached,
    Queue,
    RunStopped,
    SchedulerError,
    StaleToken,
)
from tests.conftest import Clock

MANUAL = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "manual.md").read_text()
T0 = 1_000_000


def _row(status: str) -> str:
    """The line of manual.md's refusal table whose first cell is `status`."""
    return next(line for line in MANUAL.splitlines() if line.startswith(f"| `{status}`"))


# -- 1. claim on a partitioned queue's own name -----------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.pq(partitions=2)
def test_claim_on_a_partitioned_queues_own_name_is_refused_as_enqueue_is(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue, kind: str
) -> None:
    """The manual's example opens its queue with `Queue.from_url(url, name)`. On the name of a
    partitioned queue, enqueue (and pause, schedule, set_dead_retention) is refused with
    BadArgument ('a plain Queue would write where no worker looks', lib/util.lua
    partitioned_err), but claim answers an empty batch with next_ms -1, which the guide reads
    as "the queue is empty": a hand-written consumer loop sleeps for ever beside due jobs."""
    job_id = pq.enqueue("t", {"n": 1})
    plain = Queue(client, pq.name)
    with pytest.raises(BadArgument, match="partitioned"):
        plain.enqueue("t", 1)  # the guard every write has

    async def claim_async() -> Any:
        aq = AsyncQueue.from_url(redis_url, pq.name)
        try:
            return await aq.claim("w", limit=10)
        finally:
            await aq.aclose()

    try:
        batch = plain.claim("w", limit=10) if kind == "sync" else asyncio.run(claim_async())
    except BadArgument as exc:
        assert "partitioned" in str(exc)
        return
    assert batch.jobs, (
        f"claim answered no job and next_ms={batch.next_ms} (-1: 'the queue is empty') "
        f"while {job_id} is due in a partition ({pq.counts().due} due)"
    )


# -- 2. the lease refusals do not survive pickling ---------------------------------------------


def _stale_complete(url: str, name: str, job_id: str, token: str) -> None:
    """In a pool's child: the manual's advice (open the queue in the process that uses it)."""
    with Queue.from_url(url, name) as q:
        q.complete(job_id, token, "late")


def test_a_stale_token_raised_in_a_process_pool_reaches_the_caller(
    q: Queue, redis_url: str
) -> None:
    """manual.md 'Threads, forks and pickling': pass the URL and the queue's name to another
    process and open the queue there. A child that completes with a stale token raises
    StaleToken; pickled back to the parent it cannot be rebuilt (StaleToken(message) misses
    job_id and token), so concurrent.futures marks the whole pool broken and every pending
    future fails. RetryLater has a __reduce__ for exactly this (scheduler/worker/retry_later.py)."""
    q.enqueue("t", 1)
    old = q.claim("w1", limit=1).jobs[0]
    assert q.release([(old.id, old.token)]) == ["released"]
    new = q.claim("w2", limit=1).jobs[0]
    ctx = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        future = pool.submit(_stale_complete, redis_url, q.name, old.id, old.token)
        with pytest.raises(StaleToken) as info:
            future.result(timeout=30)
    assert (info.value.job_id, info.value.token) == (old.id, old.token)
    q.complete(new.id, new.token, "ok")  # the holder's result lands


@pytest.mark.parametrize(
    "error",
    [
        StaleToken("j1", "3-abc", "stale token: another claim holds this job"),
        LeaseExpired("j1", "3-abc", "lease expired"),
        JobCancelled("j1", "3-abc", "job was cancelled"),
        JobDead("j1", "attempts exhausted", "ValueError", "boom"),
        PartitionsNotReached("heartbeat", ["q.p0"], ["q.p1"], ["down"], partial=(1, {})),
        NotDurable(["j1"], 0, 1),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_typed_error_of_the_lease_api_pickles(error: Exception) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert vars(back) == vars(error)


def _every_scheduler_error() -> list[type[SchedulerError]]:
    """Every SchedulerError class of the package, each module imported (a class is known to
    __subclasses__ once its module is)."""
    for mod in pkgutil.walk_packages(scheduler.__path__, "scheduler."):
        if not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)
    seen: list[type[SchedulerError]] = []
    todo = [SchedulerError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(c for c in cls.__subclasses__() if c.__module__.startswith("scheduler."))
    return seen


def test_every_typed_error_of_the_package_pickles_with_its_attributes() -> None:
    """Not only the lease API's: each class the package raises (its own __init__ or not, an app
    catching it in a process pool's parent), as made where it is raised, with an attribute set
    later (PartitionsNotReached's written_ids) and redis-py's status_code kept."""
    from scheduler.admin.health import Finding
    from scheduler.admin.startup import UnsafeServer
    from scheduler.worker.retry_later import RetryLater

    built: dict[type[Exception], Exception] = {
        RetryLater: RetryLater(5_000, "rate limited"),
        UnsafeServer: UnsafeServer([Finding("eviction-policy", "error", "evicts", "CONFIG SET")]),
    }
    for error in [StaleToken("j1", "3-abc", "stale"), LeaseExpired("j1", "", "lease expired"),
                  JobCancelled("j1", "3-abc", "job was cancelled"), JobDead("j1", None, None, None),
                  PartitionsNotReached("counts", ["q.p0"], ["q.p1"], ["down"]),
                  NotDurable(["j1", "j2"], 1, 2), JobTimeout("j1", "3-abc", "the run timed out"),
                  RunStopped("j1", "3-abc", "the worker is shutting down")]:  # fmt: skip
        built[type(error)] = error
    built[LeaseRefused] = LeaseRefused("j1", "3-abc", "refused")
    built[CorruptKey] = CorruptKey("CORRUPT due is not a zset", status_code="CORRUPT")
    setattr(built[PartitionsNotReached], "written_ids", ["j9"])  # noqa: B010 - as raised
    classes = _every_scheduler_error()
    assert len(classes) > 20, [c.__name__ for c in classes]
    for cls in classes:
        made: Exception = built.get(cls) or cls(f"a {cls.__name__} refusal")
        back = pickle.loads(pickle.dumps(made))
        assert type(back) is cls and str(back) == str(made), cls
        assert vars(back) == vars(made) and back.args == made.args, cls


# -- 3. 'expired': "a complete still lands if nobody claimed it since" --------------------------


def test_an_expired_lease_completes_while_nobody_claimed_the_job(
    tq: tuple[Queue, Clock],
) -> None:
    """The row says what to do on 'expired': stop, yet 'a complete still lands if nobody
    claimed it since'. Nobody claims the job here: one claim of limit 0 runs (a loop's next
    poll, or any worker's claim of another job), whose reaper puts the job back in due; the
    complete is then refused as stale and the job runs again. Either the complete lands, or
    the row says that any claim ends the window (its reaper)."""
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", 1)
    job = q.claim("w1", limit=1, lease_ms=1_000).jobs[0]
    clock.set_ms(T0 + 5_000)
    _, st = q.heartbeat([(job.id, job.token)])
    assert st == {job_id: "expired"}
    assert q.claim("w1", limit=0).jobs == []  # claims nothing
    assert q.status(job_id) == "due"  # nobody holds or claimed it
    try:
        q.complete(job.id, job.token, "late but fine")
        landed = True
    except StaleToken:
        landed = False
    assert landed or "if nobody claimed it since" not in _row("expired"), (
        "the doc promises this complete lands; it was refused StaleToken"
    )


# -- 4. next_ms -1 on a paused queue ------------------------------------------------------------


def test_next_ms_is_minus_one_only_for_an_empty_queue(q: Queue) -> None:
    q.enqueue("t", 1)
    q.pause()
    batch = q.claim("w", limit=10)
    assert batch.jobs == [] and q.counts().due == 1
    bullet = next(line for line in MANUAL.splitlines() if line.startswith("- `next_ms`"))
    assert batch.next_ms != -1 or "paus" in bullet, (
        "next_ms -1 ('the queue is empty') for a paused queue holding a due job"
    )


# -- 5. heartbeat 'missing' for a job another claim holds ---------------------------------------


def test_heartbeat_of_an_old_token_of_a_job_held_by_another_is_stale(q: Queue) -> None:
    """manual.md: 'stale' = another claim holds the job; 'missing' = heartbeat 'also answers it
    for a job no longer leased to anyone (released, retried, done)'. Here the job is leased to
    w2, and w1's heartbeat (a background heartbeat racing its own fail) hears 'missing'."""
    job_id = q.enqueue("t", 1)
    old = q.claim("w1", limit=1).jobs[0]
    assert q.fail(old.id, old.token, ValueError("x"), delay_ms=0).status == "retry"
    new = q.claim("w2", limit=1).jobs[0]
    assert new.id == job_id and q.get_job(job_id).worker == "w2"
    _, st = q.heartbeat([(old.id, old.token)])
    assert st[job_id] == "stale" or "no longer leased to anyone" not in _row("missing"), (
        f"heartbeat answered {st[job_id]!r} while w2 holds the job"
    )
    with pytest.raises(StaleToken):
        q.complete(old.id, old.token, "late")  # the fencing itself holds


# -- what the review checked and found as documented (kept: cheap guards) ----------------------


def test_a_stale_token_is_refused_after_each_way_the_job_moved_on(tq: tuple[Queue, Clock]) -> None:
    """The fencing rule after a lapse reclaimed by another claimer, a retry, a dead requeue and
    a cancel: the old token changes nothing, every call, and the fence grows."""
    q, clock = tq
    clock.set_ms(T0)

    def refused(job: Any, expect: type[Exception], status: str) -> None:
        before = q.get_job(job.id).fields
        with pytest.raises(expect):
            q.complete(job.id, job.token, "late")
        assert q.complete_many([(job.id, job.token, "late")]) == [status]
        assert q.release([(job.id, job.token)]) == [status]
        assert q.heartbeat([(job.id, job.token)])[1][job.id] in (status, "missing")
        after = q.get_job(job.id).fields
        assert {k: v for k, v in after.items() if k != "progress_ms"} == before

    # a lapse reclaimed by another claimer
    q.enqueue("t", 1)
    a = q.claim("A", limit=1, lease_ms=1_000).jobs[0]
    clock.set_ms(T0 + 2_000)
    b = q.claim("B", limit=1).jobs[0]
    assert b.id == a.id and b.fence > a.fence
    refused(a, StaleToken, "stale")
    with pytest.raises(StaleToken):
        q.fail(a.id, a.token, ValueError("late"))
    # a dead requeue, claimed again
    assert q.fail(b.id, b.token, ValueError("x"), retryable=False).status == "dead"
    assert q.requeue_dead([b.id]) == 1
    c = q.claim("C", limit=1).jobs[0]
    assert c.id == b.id and c.fence > b.fence
    refused(a, StaleToken, "stale")
    refused(b, StaleToken, "stale")
    # a cancel while C holds it
    q.cancel(c.id)
    refused(c, JobCancelled, "cancelled")
    with pytest.raises(JobCancelled):
        q.fail(c.id, c.token, ValueError("late"))
