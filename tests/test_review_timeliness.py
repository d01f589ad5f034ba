"""Review of the "not long after its run-at time" promise beyond the claim loop's races covered by
tests/test_worker_retry_wake.py and tests/test_review_direct_pool_wake.py.

Each worker test here takes the idle safety nets out of the way (an hour), so a lost wake-up
shows as a job that does not run within a generous timeout instead of a late one. One private
redis-server per module."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import redis

from scheduler import JobSpec, Queue
from scheduler.core.connection import connect_async
from scheduler.core.models import ClaimBatch
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry
from tests.conftest import Clock
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess
from tests.test_worker_retry_wake import no_safety_nets

registry = Registry()


@registry.task(name="timely-ok")
async def ok(payload: object, ctx: Any) -> str:
    return "ok"


class Gate:
    """Holds the gated jobs until the test ends (made per event loop)."""

    release: asyncio.Event


@registry.task(name="timely-gated")
async def gated(payload: object, ctx: Any) -> str:
    await Gate.release.wait()
    return "ok"


def test_a_skipped_queues_next_due_time_bounds_the_sleep_of_a_round_without_it(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """Several queues. qa's claim takes nothing and answers next_ms (its delayed job's run_at):
    qa sits out until then. A wake-up of qb before that starts a round of qb alone (qa skipped),
    and that round's sleep was planned from qb's answer only (here its job's lease end, else
    the 30 s safety net): qa's job, due meanwhile, waited for it."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    qa, qb = Queue(admin, f"tl-skip-a-{tag}"), Queue(admin, f"tl-skip-b-{tag}")

    async def main() -> None:
        client = connect_async(module_server.url)
        settings = WorkerSettings(
            queues=(qa.name, qb.name), concurrency=4, grace_s=0, lease_ms=600_000
        )
        w = Worker(client, registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(w._idle.is_set, "the claim loop to wait")
            w._skip_until.clear()
            late = qa.enqueue("timely-ok", None, delay_ms=4_000)
            t_enqueued = time.monotonic()
            # qa's claim saw the job ahead: qa sits out until its run_at.
            await poll(
                lambda: w._skip_until.get(qa.name, 0.0) > time.monotonic() + 1, "qa to sit out"
            )
            await poll(w._idle.is_set, "the claim loop to wait")
            now_job = qb.enqueue("timely-ok", None)  # a round of qb alone
            await poll(lambda: qb.status(now_job) == "done", "qb's job to run")
            assert time.monotonic() - t_enqueued < 4.0, "the machine stalled: not the case"
            assert qa.status(late) == "scheduled"
            await poll(lambda: qa.status(late) == "done", "qa's job to run", timeout_s=15.0)
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())


def test_a_wake_up_popped_by_a_call_whose_reply_was_lost_still_wakes_the_worker(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """The waker's BLPOP ran on the server (the enqueue's token is gone) but its reply was lost
    (the connection dropped, the server was killed after the pop): the waker logged the error,
    backed off and popped again on an empty list, while the claim loop slept its old plan (the
    30 s safety net, an hour here): the job, due now, waited for it. The fault is injected
    into the worker's client: the real BLPOP runs, then its reply is replaced by the
    ConnectionError redis-py raises for a connection closed before the reply."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"tl-lost-pop-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        client = connect_async(module_server.url)
        w = Worker(client, registry, WorkerSettings(queues=(q.name,), concurrency=4, grace_s=0))
        real_blpop = client.blpop
        lost: list[object] = []

        async def blpop(*args: Any, **kwargs: Any) -> Any:
            got = await real_blpop(*args, **kwargs)
            if got is not None and not lost:
                lost.append(got)
                raise redis.ConnectionError("Connection closed by server.")
            return got

        monkeypatch.setattr(client, "blpop", blpop)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(w._idle.is_set, "the claim loop to wait")
            admin.delete(q.keys.wake)
            job = q.enqueue("timely-ok", None)
            await poll(lambda: bool(lost), "the wake-up pop whose reply is lost")
            await poll(lambda: q.status(job) == "done", "the job to run", timeout_s=10.0)
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())


def test_a_full_batch_passes_a_future_jobs_due_time_on_to_an_idle_worker(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """Two idle workers of one slot each. One enqueue call stores a job due now and one due
    shortly: one wake-up token. The worker that pops it claims the first job, a full batch
    (limit = its one free slot), and claim.lua passes the wake-up on only when more is due
    *now*: the other worker never learns the second job's run_at and sleeps its old plan (the
    30 s safety net, an hour here), while the first is busy. The job waited though a worker was
    idle."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"tl-full-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        Gate.release = asyncio.Event()
        settings = WorkerSettings(queues=(q.name,), concurrency=1, grace_s=0, lease_ms=600_000)
        clients = [connect_async(module_server.url) for _ in range(2)]
        workers = [Worker(c, registry, settings) for c in clients]
        tasks = [asyncio.create_task(w.run(install_signals=False)) for w in workers]
        try:
            for w in workers:
                await poll(w._idle.is_set, "the worker to wait")
            busy, later = q.enqueue_many(
                [JobSpec("timely-gated", None), JobSpec("timely-ok", None, delay_ms=2_000)]
            )
            await poll(lambda: q.status(busy) == "leased", "the first job to start")
            await poll(lambda: q.status(later) == "done", "the second job to run", timeout_s=12.0)
        finally:
            Gate.release.set()
            for w in workers:
                w.request_stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            for c in clients:
                await c.aclose()

    asyncio.run(main())


def test_a_replayed_claims_old_plan_does_not_set_the_sleep(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """A claim's answer was lost (the connection dropped after the server ran it) and the
    worker re-sent it with its nonce once Redis answered again. claim.lua replays the first
    call's reply: its jobs, and its now_ms / next_ms, from before the gap. The worker slept
    next_ms - now_ms from the replay, so a job that fell due during the gap waited that much
    longer (up to the 30 s safety net). The gap is made with the test clock: the server's time
    moves an hour on between the first send and its re-send."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"tl-replay-{uuid.uuid4().hex[:8]}", _clock="test")
    clock = Clock(admin, q)
    t0, hour_ms = 1_000_000_000, 3_600_000
    clock.set_ms(t0)

    async def main() -> None:
        client = connect_async(module_server.url)
        settings = WorkerSettings(queues=(q.name,), concurrency=4, grace_s=0, lease_ms=2 * hour_ms)
        w = Worker(client, registry, settings, _clock="test")
        aq = w._by_name[q.name].aq
        real_claim = aq.claim
        lost: list[ClaimBatch] = []

        async def claim(*args: Any, **kwargs: Any) -> ClaimBatch:
            batch = await real_claim(*args, **kwargs)
            if batch.jobs and not lost:
                lost.append(batch)
                clock.set_ms(t0 + hour_ms)  # the gap before the re-send: the later job is due
                raise redis.ConnectionError("Connection closed by server.")
            return batch

        monkeypatch.setattr(aq, "claim", claim)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(w._idle.is_set, "the claim loop to wait")
            first, later = q.enqueue_many(
                [JobSpec("timely-ok", None), JobSpec("timely-ok", None, delay_ms=hour_ms)]
            )
            await poll(lambda: bool(lost), "a claim whose answer is lost")
            assert lost[0].next_ms == t0 + hour_ms
            await poll(lambda: q.status(first) == "done", "the replayed job to run")
            await poll(lambda: q.status(later) == "done", "the job due since", timeout_s=10.0)
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())
