"""A worker that stops by itself, as after a SIGTERM, exit 0 (worker/self_stop.py): burst mode
(`WorkerSettings.burst`, `scheduler worker --burst`: runs what is claimable now) and the job
quota (`max_jobs`, `--max-jobs`: a process recycled after N jobs, restarted by the pool)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import fakeredis
import pytest
import redis

from scheduler import AsyncQueue, JobContext, Queue, Registry
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect_async
from scheduler.worker import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    SettingsError,
    Worker,
    WorkerSettings,
    self_stop,
)

LATER = Backoff(base_ms=600_000, factor=1.0, cap_ms=600_000, jitter=0.0)


def _registry(ran: list[str]) -> Registry:
    registry = Registry()

    @registry.task("ok")
    async def ok(payload: Any, ctx: JobContext) -> str:
        await asyncio.sleep(0.01)
        ran.append(ctx.job_id)
        return "ok"

    @registry.task("slow.sync")
    def slow(payload: Any, ctx: JobContext) -> None:
        import time

        time.sleep(0.3)
        ran.append(ctx.job_id)

    @registry.task("fails", max_attempts=3, backoff=LATER)
    async def fails(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        raise RuntimeError("not now")

    return registry


def _burst(
    url: str, registry: Registry, *queues: str, timeout_s: float = 30.0, **options: Any
) -> int:
    async def main() -> int:
        client = connect_async(url)
        options.setdefault("burst", True)
        settings = WorkerSettings(queues=queues, heartbeat_ms=100, lease_ms=2_000, **options)
        try:
            worker = Worker(client, registry, settings)
            return await asyncio.wait_for(worker.run(install_signals=False), timeout_s)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_burst_worker_runs_what_is_due_and_stops(redis_url: str, q: Queue) -> None:
    ran: list[str] = []
    due = [q.enqueue("ok", {"i": i}) for i in range(30)]
    slow = q.enqueue("slow.sync")  # still running when the claims find nothing more
    parent = q.enqueue("ok")
    child = q.enqueue("ok", after=[parent])  # released by its parent's complete, then run
    later = q.enqueue("ok", delay_ms=600_000)
    failing = q.enqueue("fails")
    assert _burst(redis_url, _registry(ran), q.name) == EXIT_OK
    assert sorted(ran) == sorted([*due, slow, parent, child, failing])
    assert all(q.status(i) == "done" for i in [*due, slow, parent, child])
    assert ran.index(child) > ran.index(parent)
    assert q.status(later) == "scheduled"  # due later: left for another worker
    job = q.get_job(failing)
    assert (job.state, job.attempts) == ("scheduled", 1)  # its retry is due in 10 min
    counts = q.counts()
    assert counts.leased == 0 and counts.dead == 0


def test_a_burst_worker_on_an_empty_queue_stops_at_once(redis_url: str, q: Queue) -> None:
    assert _burst(redis_url, _registry([]), q.name, timeout_s=10.0) == EXIT_OK
    assert q.counts().leased == 0


def test_a_burst_covers_every_queue(redis_url: str, q: Queue) -> None:
    """Several queues: one whose claim found nothing sits out the next rounds (a skip); jobs
    enqueued on it meanwhile must not be left because the last round did not ask it."""
    other = Queue.from_url(redis_url, q.name + "-b")
    try:
        ran: list[str] = []
        ids = [q.enqueue("ok") for _ in range(5)]
        ids += [other.enqueue("ok") for _ in range(5)]
        assert _burst(redis_url, _registry(ran), q.name, other.name) == EXIT_OK
        assert sorted(ran) == sorted(ids)
    finally:
        for key in other.client.scan_iter(match=other.keys.prefix + "*"):
            other.client.delete(key)


def test_burst_must_be_a_bool() -> None:
    with pytest.raises(SettingsError, match="burst"):
        WorkerSettings(burst="yes").check()  # type: ignore[arg-type]


def test_the_cli_burst_exits_0_once_drained(redis_url: str, q: Queue) -> None:
    ids = [q.enqueue("noop") for _ in range(20)]
    cmd = [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
           "--url", redis_url, "-q", q.name, "--burst"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "burst: nothing claimable is left" in proc.stderr
    assert all(q.status(i) == "done" for i in ids)


def test_the_cli_refuses_burst_with_processes(redis_url: str) -> None:
    cmd = [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
           "--url", redis_url, "--burst", "--processes", "2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_USAGE
    assert "--burst runs one process" in proc.stderr


def test_a_burst_worker_on_fakeredis() -> None:
    """What an app's own unit tests may use: no server at all."""
    server = fakeredis.FakeServer()
    ran: list[str] = []

    async def main() -> int:
        client = fakeredis.FakeAsyncRedis(server=server)
        q = AsyncQueue(client, "fake")
        ids = [await q.enqueue("ok", {"i": i}) for i in range(5)]
        code = await Worker(client, _registry(ran), WorkerSettings(
            queues=("fake",), burst=True)).run(install_signals=False)  # fmt: skip
        assert sorted(ran) == sorted(ids)
        assert [await q.status(i) for i in ids] == ["done"] * 5
        return code

    assert asyncio.run(asyncio.wait_for(main(), 30)) == EXIT_OK


def test_a_job_ending_while_the_last_claim_is_out_is_not_the_end(redis_url: str, q: Queue) -> None:
    """The round's claim was sent before the parent's complete landed, its answer (nothing)
    read after: the child that complete released must still run."""
    ran: list[str] = []
    registry = _registry(ran)

    @registry.task("parent")
    async def parent(payload: Any, ctx: JobContext) -> None:
        client = connect_async(redis_url)
        try:
            await client.lpush(q.keys.wake, "1")  # starts a round while this job runs
        finally:
            await client.aclose()
        await asyncio.sleep(0.05)
        ran.append(ctx.job_id)

    first = q.enqueue("parent")
    child = q.enqueue("ok", after=[first])

    async def main() -> int:
        client = connect_async(redis_url)
        settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=2_000, burst=True)
        worker = Worker(client, registry, settings)
        claim_call = worker._claim_call

        async def late_answer(call: Any) -> Any:
            batch = await claim_call(call)
            await asyncio.sleep(0.3)  # the parent ends and its complete lands meanwhile
            return batch

        worker._claim_call = late_answer  # type: ignore[method-assign]
        try:
            return await asyncio.wait_for(worker.run(install_signals=False), 30)
        finally:
            await client.aclose()

    assert asyncio.run(main()) == EXIT_OK
    assert ran == [first, child]
    assert q.status(child) == "done"


def test_a_round_that_left_out_a_queue_is_followed_by_a_full_one() -> None:
    """A queue whose last claim took nothing sits rounds out (its skip); a job may have come
    to it since without a wake-up reaching this worker (another worker popped it)."""
    worker = Worker(fakeredis.FakeAsyncRedis(), _registry([]),
                    WorkerSettings(queues=("a", "b"), burst=True))  # fmt: skip
    worker._skip_until["b"] = float("inf")
    assert worker._burst_next(rounded=False) is True
    assert worker._skip_until == {} and not worker._stop_claiming.is_set()
    assert worker._burst_next(rounded=True) is True  # nothing held, nothing woke: stop
    assert worker._stop_claiming.is_set()


def test_max_jobs_claims_that_many_and_stops(redis_url: str, q: Queue) -> None:
    ran: list[str] = []
    ids = [q.enqueue("ok") for _ in range(12)]
    code = _burst(redis_url, _registry(ran), q.name, burst=False, max_jobs=5)
    assert code == EXIT_OK
    assert len(ran) == 5 and set(ran) <= set(ids)  # never more than its quota, prefetch or not
    assert sum(q.status(i) == "done" for i in ids) == 5
    counts = q.counts()
    assert (counts.due, counts.leased) == (7, 0)


def test_max_jobs_lets_the_last_jobs_finish_whatever_the_grace(redis_url: str, q: Queue) -> None:
    """A planned stop has no hurry for a job with a timeout: the job running when the quota
    is met ends as it would, within its timeout (grace 0 would have released it at a SIGTERM)."""
    ran: list[str] = []
    slow = q.enqueue("slow.sync", timeout_ms=30_000)
    code = _burst(redis_url, _registry(ran), q.name, burst=False, max_jobs=1, grace_s=0)
    assert code == EXIT_OK and ran == [slow]
    job = q.get_job(slow)
    assert (job.state, job.attempts) == ("done", 1)


def test_max_jobs_must_be_a_positive_int() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(SettingsError, match="max_jobs"):
            WorkerSettings(max_jobs=bad).check()  # type: ignore[arg-type]


def test_max_memory_mb_stops_claiming_once_over(
    redis_url: str, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resident memory is read before each claim (here made to grow past the limit once
    three jobs ran): the worker claims no more, lets what it holds end, exits 0."""
    ran: list[str] = []
    ids = [q.enqueue("ok") for _ in range(10)]
    monkeypatch.setattr(self_stop, "rss_mb", lambda: 500.0 if len(ran) >= 3 else 50.0)
    code = _burst(redis_url, _registry(ran), q.name, burst=False, max_memory_mb=100,
                  concurrency=1, prefetch=0)  # fmt: skip
    assert code == EXIT_OK
    assert len(ran) == 3, ran  # one job per claim: the claim after the third is not sent
    assert sum(q.status(i) == "done" for i in ids) == 3
    assert (q.counts().due, q.counts().leased) == (7, 0)


def test_rss_mb_reads_this_process() -> None:
    before = self_stop.rss_mb()
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touched: resident
    after = self_stop.rss_mb()
    assert before is not None and after is not None
    assert after - before > 50, (before, after)
    del block


def test_max_memory_mb_below_the_start_is_refused_before_any_job(
    redis_url: str, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the limit before its first job, every replacement would stop at once too (a
    pool restarting it in a loop): exit 2, nothing claimed."""
    ran: list[str] = []
    ids = [q.enqueue("ok") for _ in range(3)]
    monkeypatch.setattr(self_stop, "rss_mb", lambda: 500.0)
    code = _burst(redis_url, _registry(ran), q.name, burst=False, max_memory_mb=100)
    assert code == EXIT_USAGE and ran == []
    assert all(q.status(i) == "due" for i in ids)


def test_the_cli_refuses_a_max_memory_below_the_start_before_ready(
    redis_url: str, q: Queue
) -> None:
    """A pool's first start then fails (exit 2) instead of restarting children in a loop."""
    cmd = [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
           "--url", redis_url, "-q", q.name, "--max-memory-mb", "1",
           "--processes", "2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "--max-memory-mb 1 is below this process's memory" in proc.stderr
    assert (
        proc.stderr.count("worker process 1 started")
        + proc.stderr.count("worker process 2 started")
        <= 2
    )  # no restarts


def test_a_burst_worker_whose_claims_keep_failing_stops_with_exit_1(
    redis_url: str, client: redis.Redis, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It would never find that queue empty, so never end: after BURST_FAILING_S of failed
    claims of a queue (its due key edited into a string by hand) it stops, exit 1, the other
    queue's jobs run."""
    monkeypatch.setattr(self_stop, "BURST_FAILING_S", 0.5)
    broken = Queue.from_url(redis_url, q.name + "-broken")
    client.set(broken.keys.due, "edited by hand")
    try:
        ran: list[str] = []
        ids = [q.enqueue("ok") for _ in range(3)]
        assert _burst(redis_url, _registry(ran), q.name, broken.name) == EXIT_ERROR
        assert sorted(ran) == sorted(ids)
    finally:
        client.delete(broken.keys.due)


def test_max_jobs_with_a_job_that_never_ends_stops_within_the_grace(
    redis_url: str, q: Queue
) -> None:
    """The quota stop of a job with no timeout is a SIGTERM stop: --grace, then the job is
    released to re-run elsewhere (it kept the process, and the pool's slot, for ever)."""
    stuck = q.enqueue("sleep", {"s": 3600})
    cmd = [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
           "--url", redis_url, "-q", q.name, "--max-jobs", "1", "--grace", "0.5"]  # fmt: skip
    env = {**os.environ, "TEST_REDIS_URL": redis_url}
    # Before, the process never ended: the 60 s here only bounds the failure.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == EXIT_OK, proc.stderr
    job = q.get_job(stuck)
    assert (job.state, job.attempts) == ("due", 0), proc.stderr  # released, not lost
    assert "job released" in proc.stderr


def test_max_jobs_stops_for_an_untimed_job_that_starts_after_the_quota(
    redis_url: str, q: Queue
) -> None:
    """The quota is met while a job with a timeout runs and one with none waits behind it
    (prefetched): when that one starts, the stop is a SIGTERM stop too (grace, then released).
    Before, only the jobs running when the quota was met were looked at: the process waited
    for the untimed job for ever."""
    ran: list[str] = []
    registry = Registry()

    @registry.task("quick")
    async def quick(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(payload["s"])
        ran.append(ctx.job_id)

    @registry.task("stuck")
    async def stuck(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        await asyncio.sleep(3600)

    first = q.enqueue("quick", {"s": 0}, timeout_ms=10_000)  # its run makes the jobs "short"
    time.sleep(0.01)
    timed = q.enqueue("quick", {"s": 0.3}, timeout_ms=10_000)
    time.sleep(0.01)
    untimed = q.enqueue("stuck")
    code = _burst(redis_url, registry, q.name, burst=False, max_jobs=3, concurrency=1, grace_s=0.3)
    assert code == EXIT_OK and ran == [first, timed, untimed]
    assert [q.status(i) for i in (first, timed)] == ["done", "done"]
    job = q.get_job(untimed)
    assert (job.state, job.attempts) == ("due", 0)  # released, not lost
