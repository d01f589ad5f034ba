"""A retry's wake-up is not lost to a claim in flight.

fail.lua pushes no wake-up: the worker re-plans its sleep around the retry's run_at by setting
its local wake flag when the fail's answer arrives. A claim sent before that fail, and answered
after it, saw no due job; the claim loop then cleared the flag on its way into the idle wait and
slept the 30 s safety net, so the retry ran ~30 s late (a CI flake of
test_retries_with_backoff_then_dead on Valkey). The race is forced here: the handler raises
only once a claim has been answered by the server, and that claim's answer is handed to the
claim loop only after the fail's answer was read. One private redis-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from scheduler import Backoff, Queue
from scheduler.core.connection import connect_async
from scheduler.core.models import ClaimBatch
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker import claiming as claiming_module
from scheduler.worker import settings as settings_module
from scheduler.worker.context import JobContext
from scheduler.worker.registry import Registry
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess

registry = Registry()


class Gate:
    """The first attempt's events, made afresh in each test's event loop (an asyncio.Event is
    bound to the loop it was first awaited in)."""

    handler_waiting: asyncio.Event
    release: asyncio.Event

    @classmethod
    def reset(cls) -> None:
        cls.handler_waiting, cls.release = asyncio.Event(), asyncio.Event()


@registry.task(name="retry-wake-flaky", backoff=Backoff(100, 2.0, 1000, 0.0), max_attempts=3)
async def flaky(payload: object, ctx: JobContext) -> str:
    if ctx.attempt == 1:
        Gate.handler_waiting.set()
        await Gate.release.wait()
        raise RuntimeError("first attempt fails")
    return "ok"


def no_safety_nets(monkeypatch: Any) -> None:
    """The worker's idle safety nets out of the way (an hour): a lost wake-up shows as a job
    that does not run within a test's timeout, not as a late one."""
    monkeypatch.setattr(claiming_module, "_MAX_IDLE_SLEEP_S", 3600.0)
    monkeypatch.setattr(settings_module, "_MAX_IDLE_SLEEP_S", 3600.0)
    monkeypatch.setattr(claiming_module, "_SKIP_MAX_S", 3600.0)


def run_worker(
    url: str,
    queues: tuple[str, ...],
    prepare: Callable[[Worker], None],
    steps: Callable[[Worker], Awaitable[None]],
) -> None:
    """A worker on `queues` (patched by `prepare` before it runs) while `steps` run, once its
    job's first attempt has started and waits on Gate.release; then stopped."""

    async def main() -> None:
        Gate.reset()
        client = connect_async(url)
        w = Worker(client, registry, WorkerSettings(queues=queues, concurrency=4, grace_s=0))
        prepare(w)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(Gate.handler_waiting.is_set, "the first attempt to start")
            await steps(w)
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())


def race_claim_with_fail(w: Worker, queue: str, monkeypatch: Any, raced: list[ClaimBatch]) -> None:
    """Patch w so that the first claim of `queue` sent while the first attempt waits is run by
    the server, then the attempt fails, and that claim's answer (it saw nothing due) reaches
    the claim loop only after the fail's answer was read; the answer is put in `raced`."""
    aq = w._by_name[queue].aq
    real_claim, real_failed = aq.claim, w._failed
    failed: list[str] = []

    def seen_failed(r: Any, *args: Any) -> Any:
        out = real_failed(r, *args)
        failed.append(r.job.id)
        return out

    async def claim(*args: Any, **kwargs: Any) -> ClaimBatch:
        batch = await real_claim(*args, **kwargs)  # executed by the server: no due job
        if Gate.handler_waiting.is_set() and not Gate.release.is_set():
            Gate.release.set()  # the handler raises; its fail runs after this claim
            await poll(lambda: bool(failed), "the fail's answer")
            raced.append(batch)
        return batch

    monkeypatch.setattr(w, "_failed", seen_failed)
    monkeypatch.setattr(aq, "claim", claim)


def test_a_retry_answered_during_a_claim_is_claimed_at_its_run_at(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    no_safety_nets(monkeypatch)  # a lost wake-up would sleep an hour, not 30 s
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, "wake-" + uuid.uuid4().hex[:8])
    job = q.enqueue("retry-wake-flaky", None)
    admin.delete(q.keys.wake)  # no stray wake-up: only the one below makes the racing claim

    def prepare(w: Worker) -> None:
        race_claim_with_fail(w, q.name, monkeypatch, raced)

    async def steps(w: Worker) -> None:
        await poll(w._idle.is_set, "the claim loop to wait")
        w._wake.set()  # as the waker does: a claim while the first attempt waits
        await poll(lambda: bool(raced), "a claim answered across the fail")
        assert raced[0].jobs == []
        await poll(lambda: q.status(job) == "done", "the retry to run")

    raced: list[ClaimBatch] = []
    run_worker(module_server.url, (q.name,), prepare, steps)
    assert q.get_job(job).attempts == 2


def test_a_retry_ends_its_queues_skip_on_a_worker_of_several_queues(
    module_server: RedisProcess, monkeypatch: Any
) -> None:
    """Several queues: a queue whose claim took nothing sits out until its next due time (here
    the running job's lease end) or _SKIP_MAX_S. A retry of one of its jobs ends that skip, as
    its own wake-up token would (fail.lua pushes none)."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    qa, qb = Queue(admin, f"wake-a-{tag}"), Queue(admin, f"wake-b-{tag}")
    job = qa.enqueue("retry-wake-flaky", None)
    admin.delete(qa.keys.wake)

    async def steps(w: Worker) -> None:
        await poll(w._idle.is_set, "the claim loop to wait")
        w._skip_until.pop(qa.name, None)
        w._wake.set()  # a round while the job runs: its queue's claim takes nothing
        await poll(lambda: qa.name in w._skip_until, "the job's queue to sit out")
        Gate.release.set()
        await poll(lambda: qa.status(job) == "done", "the retry to run")

    run_worker(module_server.url, (qa.name, qb.name), lambda w: None, steps)
    assert qa.get_job(job).attempts == 2
