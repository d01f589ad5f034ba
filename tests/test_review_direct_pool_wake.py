"""Review of the claim loop's wake-ups (401b30d, fc1b2a0). The direct pool path
(direct_pool.take/give, ba64db0) was stress-tested against redis-py's own get_connection /
release and showed no defect, so it has no test here.

Each test here failed on the code under review. One private redis-server per
module; the worker tests take the idle safety nets out of the way (an hour), so a lost wake-up
shows as a job that does not run within a generous timeout instead of a late one."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import redis

from scheduler import Queue
from scheduler.core.connection import connect_async
from scheduler.core.models import ClaimBatch
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess
from tests.test_worker_retry_wake import no_safety_nets, race_claim_with_fail, run_worker


def test_a_retry_answered_during_its_own_queues_claim_ends_that_queues_skip(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """Several queues. WorkerCore._due_soon(qa) pops qa's skip and sets the wake flag, but when
    the fail's answer arrives while a claim *of qa* is in flight (sent before the fail ran on the
    server: it saw nothing due), the claim loop then writes qa's skip back from that stale
    answer (claiming.py: `skips[q.name] = now_s + wait_s` for n == 0, after the await). The
    wake flag only buys one more round, which skips qa: the retry waits out the skip (the old
    lease head, or _SKIP_MAX_S = 1 s in production) instead of its own run_at."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    qa, qb = Queue(admin, f"rv-wake-a-{tag}"), Queue(admin, f"rv-wake-b-{tag}")
    job = qa.enqueue("retry-wake-flaky", None)  # tests.test_worker_retry_wake's registry task
    admin.delete(qa.keys.wake, qb.keys.wake)
    raced: list[ClaimBatch] = []

    def prepare(w: Worker) -> None:
        # The skip a stale answer writes back is the running job's lease head: make it far.
        w.settings = dataclasses.replace(w.settings, lease_ms=600_000)
        race_claim_with_fail(w, qa.name, monkeypatch, raced)

    async def steps(w: Worker) -> None:
        await poll(w._idle.is_set, "the claim loop to wait")
        w._skip_until.clear()
        w._wake.set()  # a round while the first attempt runs: qa's claim races its fail
        await poll(lambda: bool(raced), "qa's claim answered across the fail")
        assert raced[0].jobs == []
        await poll(lambda: qa.status(job) == "done", "the retry to run", timeout_s=15.0)

    run_worker(module_server.url, (qa.name, qb.name), prepare, steps)
    assert qa.get_job(job).attempts == 2


deps = Registry()


class DepGate:
    """The parent ends only once the claim loop sleeps (made per event loop)."""

    release: asyncio.Event


@deps.task(name="review-dep-task")
async def dep_task(payload: object, ctx: Any) -> str:
    if payload == "parent":
        await DepGate.release.wait()
    return "ok"


def test_a_child_made_due_by_its_parents_complete_is_claimed_without_a_safety_net(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """complete.lua's flow_parent_done moves a waiting child into due (lib/flow.lua) and pushes
    no wake-up token, and the worker sets no wake flag after a complete (only a retry's fail
    does, WorkerCore._due_soon). The worker that ran the parent planned its idle sleep around
    the parent's own lease end (claim's next_ms = head of leased): the child starts only when
    that lease would have ended or at the 30 s safety net (measured: ~31 s with defaults)."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, "rv-dep-" + uuid.uuid4().hex[:8])
    parent = q.enqueue("review-dep-task", "parent")
    child = q.enqueue("review-dep-task", "child", after=[parent])
    admin.delete(q.keys.wake)  # the parent's enqueue token: no stray wake-up

    async def main() -> None:
        DepGate.release = asyncio.Event()
        client = connect_async(module_server.url)
        settings = WorkerSettings(queues=(q.name,), concurrency=4, grace_s=0, lease_ms=600_000)
        w = Worker(client, deps, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: q.status(parent) == "leased", "the parent to start")
            await poll(w._idle.is_set, "the claim loop to sleep")
            DepGate.release.set()
            await poll(lambda: q.status(parent) == "done", "the parent to complete")
            await poll(lambda: q.status(child) == "done", "the child to run", timeout_s=15.0)
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())
