"""A job never runs twice at once in one worker, and a run whose lease is gone stops before the
server can hand the job on (review of the worker): heartbeats that fail let the lease lapse,
this worker's own claim takes the job again and the old run is stopped first; a heartbeat call
that hangs does not hold back the local expiry; an async handler that swallows its
cancellation keeps a new run of its job waiting until it has ended. One private redis-server
per module; in-process workers with short leases."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.redis_server import RedisProcess

registry = Registry()
live: set[tuple[str, int]] = set()
overlaps: list[tuple[str, int, list[tuple[str, int]]]] = []
starts: list[tuple[float, str, int]] = []
ends: list[tuple[float, str, int, str]] = []


def _begin(ctx: JobContext) -> None:
    others = sorted(k for k in live if k[0] == ctx.job_id)
    if others:
        overlaps.append((ctx.job_id, ctx.attempt, others))
    live.add((ctx.job_id, ctx.attempt))
    starts.append((time.monotonic(), ctx.job_id, ctx.attempt))


def _done(ctx: JobContext, how: str) -> None:
    live.discard((ctx.job_id, ctx.attempt))
    ends.append((time.monotonic(), ctx.job_id, ctx.attempt, how))


@registry.task(name="loss-long")
async def long_job(payload: Any, ctx: JobContext) -> None:
    _begin(ctx)
    try:
        # Longer than any test runs it: each run ends by a stop (its lease, the shutdown), not
        # by returning (at 2 s a stalled process could see a run end on its own).
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _done(ctx, f"cancelled:{ctx.stop_reason}")
        raise
    _done(ctx, "returned")


@registry.task(name="loss-stubborn", timeout_s=0.2)
async def stubborn(payload: Any, ctx: JobContext) -> None:
    _begin(ctx)
    try:
        await asyncio.sleep(1.0)
    except asyncio.CancelledError:
        await asyncio.sleep(0.6)  # cleanup that awaits: the cancellation is swallowed
    finally:
        _done(ctx, "ended")


def _reset() -> None:
    live.clear()
    overlaps.clear()
    starts.clear()
    ends.clear()


def _worker(server: RedisProcess, name: str, concurrency: int = 4, **kw: Any) -> Worker:
    settings = WorkerSettings(queues=(name,), concurrency=concurrency, grace_s=0, **kw)
    return Worker(connect_async(server.url), registry, settings)


async def _run_for(w: Worker, seconds: float) -> None:
    task = asyncio.create_task(w.run(install_signals=False))
    await asyncio.sleep(seconds)
    w.request_stop()
    await task
    await w.client.aclose()


async def _run_until(w: Worker, done: Callable[[], bool], most_s: float = 30.0) -> None:
    """Run w until done() holds (a liveness bound of most_s, not a timing goal), then stop it."""
    task = asyncio.create_task(w.run(install_signals=False))
    deadline = time.monotonic() + most_s
    while not done() and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.01)
    w.request_stop()
    await task
    await w.client.aclose()


def test_failed_heartbeats_then_a_reclaim_never_overlap_the_old_run(
    module_server: RedisProcess,
) -> None:
    _reset()
    name = "loss-" + uuid.uuid4().hex[:8]
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    Queue(admin, name).enqueue("loss-long", None, job_id="j1")

    async def main() -> None:
        w = _worker(module_server, name, lease_ms=300, heartbeat_ms=100)
        real = w._heartbeat
        calls = 0

        async def failing() -> None:
            nonlocal calls
            calls += 1
            if calls >= 2:  # the first heartbeat answers, then each one fails
                await asyncio.sleep(0.02)
                raise RedisConnectionError("heartbeat lost")
            await real()

        w._heartbeat = failing  # type: ignore[method-assign]
        # Until the job was claimed a third time (a 30 s liveness bound), not for a fixed
        # 1.5 s: a process stalled under load left the run too little time for a reclaim.
        await _run_until(w, lambda: len([1 for _, j, _a in starts if j == "j1"]) >= 3)

    asyncio.run(main())
    attempts = [a for _, j, a in starts if j == "j1"]
    assert len(attempts) >= 3, starts  # the lease lapsed and the job was claimed again
    assert overlaps == []  # before: attempts 1, 2 and 4 ran at once in this worker
    # Every run but the last was stopped for its lease (not left running unseen).
    stopped = {a for _, j, a, how in ends if j == "j1" and how.startswith("cancelled")}
    assert set(attempts) <= stopped | {max(attempts)} and set(attempts[:-1]) <= stopped


@pytest.mark.parametrize("hang_presence", [False, True])
def test_a_hung_heartbeat_does_not_hold_back_the_expiry(
    module_server: RedisProcess, hang_presence: bool
) -> None:
    # Worker A's heartbeats (and, second case, its presence beats: a stalled connection hangs
    # every call) hang after the first; worker B claims the job once the server's lease ends.
    # A must have stopped its run by then (before: it ran on for a second).
    _reset()
    name = "loss-" + uuid.uuid4().hex[:8]
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    Queue(admin, name).enqueue("loss-long", None, job_id="j2")

    async def main() -> None:
        # One slot: A's run holds it until stopped, so the next run is B's (A's own claim
        # stopping its old run, a second safety net, took the job first now and then).
        a = _worker(module_server, name, concurrency=1, lease_ms=300, heartbeat_ms=100)
        real = a._heartbeat
        calls = 0

        async def hanging() -> None:
            nonlocal calls
            calls += 1
            if calls >= 2:
                await asyncio.sleep(60)
            await real()

        a._heartbeat = hanging  # type: ignore[method-assign]
        if hang_presence:
            real_beat = a._beat_workers
            beats = 0

            async def hanging_beat(*, remove: bool = False) -> None:
                nonlocal beats
                beats += 1
                if beats >= 2 and not remove:
                    await asyncio.sleep(60)
                await real_beat(remove=remove)

            a._beat_workers = hanging_beat  # type: ignore[method-assign]
        run_a = asyncio.create_task(a.run(install_signals=False))
        # B starts only once A's run began (a fixed sleep raced A's start under load).
        deadline = time.monotonic() + 10
        while not starts and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert starts, "worker A never started the job"
        b = _worker(module_server, name, lease_ms=5_000, heartbeat_ms=1_000)
        run_b = asyncio.create_task(b.run(install_signals=False))
        # Until the job's next run has started (a 30 s liveness bound), not for a fixed 1.2 s.
        deadline = time.monotonic() + 30
        while len([1 for _, j, _a in starts if j == "j2"]) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        # A first: B's shutdown gives its job back, which A would claim again.
        for w, run in ((a, run_a), (b, run_b)):
            w.request_stop()
            await run
            await w.client.aclose()

    asyncio.run(main())
    runs = [(t, at) for t, j, at in starts if j == "j2"]
    assert len(runs) >= 2, starts  # B took it over
    first_end = [t for t, j, at, _ in ends if j == "j2" and at == 1]
    assert first_end and first_end[0] <= runs[1][0], (ends, starts)
    # Stopped for its lease, not by the shutdown that follows the next run's start.
    assert [how for _, j, at, how in ends if j == "j2" and at == 1] == ["cancelled:expired"], ends
    assert overlaps == [], (starts, ends)


def test_an_async_handler_that_swallows_its_cancel_keeps_the_retry_waiting(
    module_server: RedisProcess,
) -> None:
    _reset()
    name = "loss-" + uuid.uuid4().hex[:8]
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    fast = Backoff(base_ms=1, factor=1, cap_ms=1, jitter=0)
    Queue(admin, name).enqueue("loss-stubborn", None, job_id="j3", backoff=fast)

    def retried() -> bool:
        return len([1 for _, j, _a in starts if j == "j3"]) >= 2

    async def main() -> None:
        # Until the retry has started (the start an overlap would show at), not for a fixed
        # 1.2 s: the first run ends ~0.8 s in, and a loop stalled past 0.4 s under load left
        # no time for the retry to start (1 start, not 2).
        await _run_until(_worker(module_server, name), retried)

    asyncio.run(main())
    assert overlaps == [], overlaps  # before: 5 runs in 0.85 s, four of them alive at once
    assert len([1 for _, j, _a in starts if j == "j3"]) >= 2  # it was retried, after the first


async def _loop_gaps(gaps: list[float]) -> None:
    """Record how long the event loop went without turning (a stalled or starved process)."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(0.01)
        gaps.append(time.monotonic() - t - 0.01)


def _stalled(gaps: list[float], calls: list[float]) -> bool:
    """The loop stalled past half a 100 ms interval, or a good node's call (its 40 ms delay
    included) took most of one: either can lapse a 300 ms lease (its end is 50 ms early, so
    only two beats fit in it) with the fix. Without it the good calls that lapse the lease
    are cut before their ~41 ms answer, and its rounds do not stall so on a quiet machine
    (measured: loop gaps of 1-4 ms, calls of at most 44 ms)."""
    return max(gaps, default=0.0) > 0.05 or max(calls, default=0.0) >= 0.09


@pytest.mark.parametrize(("good_delay_s", "bad_hangs"), [(0.0, False), (0.04, False), (0.0, True)])
def test_on_a_cluster_a_node_that_fails_heartbeats_only_its_own_queues(
    module_server: RedisProcess,
    monkeypatch: pytest.MonkeyPatch,
    good_delay_s: float,
    bad_hangs: bool,
) -> None:
    # Two queues, as on two cluster nodes (one server here, the cluster path forced): the
    # heartbeats of queue "bad" fail; the job of queue "good" keeps its lease (one run),
    # the other's lapses and is run again. Before: one failing node failed every heartbeat.
    # Second case, the good node answers in 40 ms (a loaded machine; CI failed on it): its
    # call was cut at the bad lease's end, the earliest of all, so the good lease lapsed too.
    # Third, the bad node hangs: its heartbeat and presence calls each wait their bound.
    # A 300 ms lease: the second case's cut lapses the good lease only at a few beats a lease
    # (at 600 ms it did not fail without 78eb982). A process stalled past half an interval
    # (or a good node's answer that slow) can lapse a good lease too (CI at load ~15), which
    # is the load, not the code: a round that stalled so (_stalled) and whose good job ran
    # twice is run again (up to 10 rounds); one that did not must show one run. Each round runs
    # until the bad job's lease has lapsed 3 times (as in the fixed 1.8 s before), a 30 s
    # liveness bound; then only the good job is held, given back at the stop (this test's
    # releases are not per node).
    from scheduler.worker import heartbeat as heartbeat_module

    monkeypatch.setattr(heartbeat_module, "is_cluster", lambda client: True, raising=False)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    stalled: list[tuple[float, float]] = []

    def one_round() -> tuple[list[float], list[float]]:
        """The scenario once: how long its loop did not turn, how long the good calls took."""
        _reset()
        tag = uuid.uuid4().hex[:8]
        good, bad = f"loss-good-{tag}", f"loss-bad-{tag}"
        Queue(admin, good).enqueue("loss-long", None, job_id="g1")
        Queue(admin, bad).enqueue("loss-long", None, job_id="b1")
        gaps: list[float] = []
        calls: list[float] = []

        async def main() -> None:
            settings = WorkerSettings(
                queues=(good, bad), concurrency=4, grace_s=0, lease_ms=300, heartbeat_ms=100
            )
            w = Worker(connect_async(module_server.url), registry, settings)
            real = w._pipe.run
            bad_keys = w._by_name[bad].script_keys

            async def run(items: Any) -> list[Any]:
                if any(keys == bad_keys for keys, _ in items):
                    if bad_hangs:
                        await asyncio.sleep(60)
                    raise RedisConnectionError("node of the bad queue is down")
                t = time.monotonic()
                try:
                    await asyncio.sleep(good_delay_s)
                    return await real(items)
                finally:  # answered or cut
                    calls.append(time.monotonic() - t)

            monkeypatch.setattr(w._pipe, "run", run)
            watch = asyncio.create_task(_loop_gaps(gaps))
            try:
                await _run_until(w, lambda: len([1 for _, j, _a, _h in ends if j == "b1"]) >= 3)
            finally:
                watch.cancel()

        asyncio.run(main())
        return gaps, calls

    for _ in range(10):
        gaps, calls = one_round()
        if [a for _, j, a in starts if j == "g1"] == [1] or not _stalled(gaps, calls):
            break
        stalled.append((max(gaps, default=0.0), max(calls, default=0.0)))
    last = (max(gaps, default=0.0), max(calls, default=0.0))
    assert [a for _, j, a in starts if j == "g1"] == [1], (starts, "stalled:", stalled, last)
    assert len([a for _, j, a in starts if j == "b1"]) >= 3, starts
    assert overlaps == []


def test_a_claim_re_sent_after_an_outage_is_not_stopped_as_expired(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim's first sends fail for longer than a lease; the re-sent call (same nonce)
    # takes the job. Its lease counts from the first send, long past: the local lease end must
    # wait for a heartbeat instead of stopping the run at once (review of 9ccf166).
    # A 3 s lease and a 4 s outage (at 300 ms and 0.6 s, a process stalled past the lease
    # under load lapsed the run's lease after the claim: a second run); then the run is
    # watched over 10 heartbeats answered (a 30 s liveness bound), not for a fixed 0.7 s.
    _reset()
    name = "loss-" + uuid.uuid4().hex[:8]
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    Queue(admin, name).enqueue("loss-long", None, job_id="j5")
    beats = 0

    async def main() -> None:
        nonlocal beats
        w = _worker(module_server, name, lease_ms=3_000, heartbeat_ms=100)
        aq = w._by_name[name].aq
        real = aq.claim
        until = time.monotonic() + 4.0

        async def down_then_up(*args: Any, **kwargs: Any) -> Any:
            if time.monotonic() < until:
                raise RedisConnectionError("server away")
            return await real(*args, **kwargs)

        real_beat = w._heartbeat

        async def counted() -> None:
            nonlocal beats
            await real_beat()
            if starts:
                beats += 1

        monkeypatch.setattr(aq, "claim", down_then_up)
        w._heartbeat = counted  # type: ignore[method-assign]
        await _run_until(w, lambda: beats >= 10 or len(starts) > 1)

    asyncio.run(main())
    assert beats >= 10, (beats, starts, ends)
    assert [a for _, j, a in starts if j == "j5"] == [1], (starts, ends)
    assert [how for _, j, _a, how in ends if j == "j5"] == ["cancelled:shutdown"], ends
