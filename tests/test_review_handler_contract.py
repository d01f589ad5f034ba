"""The handler contract as an app developer reads it (README "Workers", docs/guide/workers.md,
docs/api): what a handler is given (JobContext), what it may raise, and what the worker then
does, checked against the worker (scheduler/worker/). From a review; the strict xfails are the
defects found. In-process workers (and one `scheduler worker` process) on the module's private
redis-server, never a shared one."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduler import Backoff, JobContext, JobOutcome, Queue, Registry
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker import context as context_module
from tests.conftest import delete_queue, new_queue
from tests.embedded_worker import run_until
from tests.redis_server import RedisProcess, is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")

ROOT = Path(__file__).resolve().parent.parent
NOW = Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0)
SOON = Backoff(base_ms=300, factor=1.0, cap_ms=300, jitter=0.0)


@pytest.fixture
def hq(module_server: RedisProcess) -> Iterator[Queue]:
    q = new_queue(module_server.client(), "hc-")
    yield q
    delete_queue(q.client, q)


def _settings(q: Queue, **kw: Any) -> WorkerSettings:
    opts: dict[str, Any] = {"heartbeat_ms": 50, "lease_ms": 1_000, "grace_s": 0}
    return WorkerSettings(queues=(q.name,), **(opts | kw))


def _settled(q: Queue, *ids: str) -> Any:
    return lambda: all(q.status(i) in ("done", "dead") for i in ids)


# --- JobContext values: first run, a retry, the run after a lapsed lease ---------------------


def test_the_context_of_a_first_run_a_retry_and_a_run_after_a_lapse(
    module_server: RedisProcess, hq: Queue
) -> None:
    """ctx.attempt counts claims (the lapsed one too), ctx.fence grows with every claim,
    ctx.run_at_ms is the retry's time after a failure and is kept by a lapse, ctx.claimed_ms is
    this claim's; the job id is shared by every run."""
    registry = Registry()
    runs: list[JobContext] = []

    @registry.task("ctx")
    def record(payload: Any, ctx: JobContext) -> str:
        runs.append(ctx)
        if payload == "retry" and ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return "ok"

    retried = hq.enqueue("ctx", "retry", max_attempts=3, backoff=SOON)
    lapsed = hq.enqueue("ctx", "lapse", max_attempts=3)
    first = hq.claim("gone-worker", limit=10, lease_ms=100).jobs
    (gone,) = [j for j in first if j.id == lapsed]
    hq.release([(j.id, j.token) for j in first if j.id != lapsed])
    time.sleep(0.25)  # past the 100 ms lease of the worker that "died"
    assert run_until(module_server.url, registry, _settings(hq), _settled(hq, retried, lapsed))

    r1, r2 = (c for c in runs if c.job_id == retried)
    assert (r1.attempt, r1.max_attempts, r2.attempt, r2.max_attempts) == (1, 3, 2, 3)
    assert r2.fence > r1.fence and r1.token != r2.token
    assert r2.token.startswith(f"{r2.fence}-")
    assert r1.claimed_ms >= r1.run_at_ms
    assert r2.run_at_ms >= r1.claimed_ms + 300  # the retry's run time: the backoff's 300 ms
    assert r2.claimed_ms >= r2.run_at_ms
    (after,) = (c for c in runs if c.job_id == lapsed)
    assert after.attempt == 2 and after.fence == gone.fence + 1  # the lapsed claim counted
    assert after.run_at_ms == gone.run_at_ms  # a lapse keeps the run time
    assert after.claimed_ms > gone.claimed_ms
    assert hq.get_job(lapsed).result_json == '"ok"'


# --- BaseException from the handler itself: contained (docs/guide/workers.md) ----------------


class Own(BaseException):
    pass


RAISED: dict[str, Callable[[], BaseException]] = {
    "exit": lambda: SystemExit(0),
    "interrupt": KeyboardInterrupt,
    "generator_exit": GeneratorExit,
    "cancelled": lambda: asyncio.CancelledError("the handler's own"),
    "own": lambda: Own("mine"),
}


def _raising_registry() -> Registry:
    registry = Registry()

    @registry.task("raise_async")
    async def raise_async(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0)
        raise RAISED[payload]()

    @registry.task("raise_sync")
    def raise_sync(payload: Any, ctx: JobContext) -> None:
        raise RAISED[payload]()

    @registry.task("fine")
    async def fine(payload: Any, ctx: JobContext) -> int:
        return 1

    return registry


def test_a_base_exception_the_handler_raises_fails_its_job_retried_then_parked(
    module_server: RedisProcess, hq: Queue
) -> None:
    """'Raising anything (SystemExit, KeyboardInterrupt, GeneratorExit, a BaseException of its
    own), sync or async: that job fails with it and is retried by its backoff, parked after its
    last attempt; the worker runs on.' A CancelledError it raises itself is its failure too."""
    ids = {
        (task, kind): hq.enqueue(task, kind, max_attempts=2, backoff=NOW)
        for task in ("raise_async", "raise_sync")
        for kind in RAISED
    }
    after = hq.enqueue("fine", None)
    registry = _raising_registry()
    assert run_until(module_server.url, registry, _settings(hq), _settled(hq, after, *ids.values()))
    for (task, kind), job_id in ids.items():
        job = hq.get_job(job_id)
        assert job is not None
        want = {"exit": "SystemExit", "interrupt": "KeyboardInterrupt"}.get(kind)
        want = want or {"generator_exit": "GeneratorExit", "cancelled": "CancelledError"}.get(kind)
        assert (job.state, job.attempts, job.fields["last_error_type"]) == (
            "dead",
            2,
            want or "Own",
        ), (task, kind)
    assert hq.status(after) == "done"


# --- Findings ---------------------------------------------------------------------------------

_EXIT_IN_A_SUBTASK = """
import asyncio
import sys

from scheduler import Registry

registry = Registry()


async def part(n):
    await asyncio.sleep(0)
    if n == 1:
        sys.exit(0)  # a CLI helper reused in a handler; click's ctx.exit() does the same
    return n


@registry.task("fan_out")
async def fan_out(payload, ctx):
    return await asyncio.gather(part(0), part(1))  # gather runs each part as a Task
"""


def test_sys_exit_in_a_task_an_async_handler_awaits_fails_the_job_not_the_worker(
    module_server: RedisProcess, hq: Queue, tmp_path: Path
) -> None:
    """docs/guide/workers.md: 'Raising anything (SystemExit, sys.exit(), ...), sync or async:
    that job fails with it and is retried by its backoff, parked after its last attempt; the
    worker runs on.' Raised in the handler's own coroutine it is; raised in a Task the handler
    awaits (asyncio.gather, create_task), asyncio re-raises it out of the loop: the process
    ends with the code given (0, which Restart=on-failure takes for a clean stop), the job is
    released with its attempt given back, so it never reaches max_attempts and is never
    parked: every worker that claims it exits (a pool's supervisor restarts them for ever)."""
    (tmp_path / "hc_exit_registry.py").write_text(_EXIT_IN_A_SUBTASK)
    job = hq.enqueue("fan_out", None, max_attempts=1)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    scheduler = str(Path(sys.executable).parent / "scheduler")
    args = ["worker", "hc_exit_registry:registry", "--url", module_server.url, "--queue", hq.name]
    done = subprocess.run(
        [scheduler, *args, "--burst", "--grace", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    got = hq.get_job(job)
    assert got is not None
    # Today: exit 0, the job 'due' again with 0 attempts (released), nothing recorded.
    assert (got.state, got.attempts) == ("dead", 1), (done.returncode, done.stderr[-800:])
    assert done.returncode == 0


def test_a_handlers_tasks_are_wrapped_only_while_the_worker_runs(
    module_server: RedisProcess, hq: Queue
) -> None:
    """The fix above (scheduler/worker/task_exits.py): a task the handler starts and cancels
    before its first step ends its coroutine, not left "never awaited" (a RuntimeWarning); a
    task the worker itself starts is not wrapped; run() takes its task factory off the loop at
    its exit (an embedded worker's app keeps its loop)."""
    registry = Registry()
    coros: dict[str, str] = {}

    @registry.task("spawn")
    async def spawn(payload: Any, ctx: JobContext) -> str:
        early = asyncio.create_task(asyncio.sleep(10))
        early.cancel()  # before its first step
        with contextlib.suppress(asyncio.CancelledError):
            await early
        coros["handler's"] = type(early.get_coro()).__name__
        return "ok"

    job = hq.enqueue("spawn", None)

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        w = Worker(connect_async(module_server.url), registry, _settings(hq))
        run = asyncio.create_task(w.run(install_signals=False))
        while hq.status(job) != "done":
            await asyncio.sleep(0.02)
        coros["worker's"] = type(w._loops["claim"].get_coro()).__name__
        w.request_stop()
        await run
        await w.client.aclose()
        return loop.get_task_factory()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        left = asyncio.run(main())
        gc.collect()
    assert [str(c.message) for c in caught if c.category is RuntimeWarning] == []
    assert coros == {"handler's": "_Contained", "worker's": "coroutine"}
    assert left is None


def test_a_handler_cancelled_by_its_own_code_does_not_hold_its_job_and_slot_for_ever(
    module_server: RedisProcess, hq: Queue
) -> None:
    """README: 'a CancelledError the handler raises itself ... is its failure like any other;
    only a cancellation aimed at the worker's own task ends the run'. A handler that cancels the
    task it runs on (a home-made time limit, `loop.call_later(t, asyncio.current_task().cancel)`,
    an app's 'abort' that cancels the job's task) lets CancelledError out while the task is
    cancelling: _run_async re-raises it and its task ends, but the run is never finished. The
    job is heartbeated as held for as long as the worker lives (never failed, never run
    again), and its concurrency slot is never freed: a worker of concurrency 1 runs nothing
    more (a burst worker never returns; a stop waits its whole grace, then releases it)."""
    registry = Registry()

    @registry.task("abort_self")
    async def abort_self(payload: Any, ctx: JobContext) -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.05, task.cancel)  # a home-made time limit
        await asyncio.sleep(30)

    @registry.task("next")
    async def next_job(payload: Any, ctx: JobContext) -> str:
        return "ran"

    stuck = hq.enqueue("abort_self", None, max_attempts=1)
    time.sleep(0.002)  # claimed first (same run time otherwise: order by id)
    after = hq.enqueue("next", None)
    settings = _settings(hq, concurrency=1, lease_ms=500, heartbeat_ms=50)
    states: list[str] = []

    def after_done() -> bool:
        states.append(str(hq.status(stuck)))
        return hq.status(after) == "done"

    ran = run_until(module_server.url, registry, settings, after_done, timeout_s=3)
    # Today: 'next' never runs, and the first job is 'leased' the whole time (6 leases).
    assert ran, f"the next job never ran; the first one was {states[-1]!r} throughout"
    assert hq.status(stuck) != "leased"


@dataclass
class Order:
    n: int


def test_a_payload_the_task_type_refuses_gives_the_hooks_no_handler_error(
    module_server: RedisProcess, hq: Queue
) -> None:
    """docs/guide/workers.md, Outcome hooks: `error` is 'the handler's own exception ... None
    when the failure was the worker's: a timeout, an unknown task, an unreadable payload'. A
    stored payload the task's payload_type refuses is the worker's decode failure, recorded as
    InvalidPayload (README), and a non-JSON payload gives None; but the hook gets the worker's
    internal PayloadMisfit (scheduler.worker.payloads) with a traceback into the scheduler, and
    its class name disagrees with outcome.error_type: the doc's Sentry recipe reports it as an
    app error of a class the app never sees."""
    registry = Registry()
    seen: list[JobOutcome] = []

    @registry.task("typed", payload_type=Order)
    def typed(payload: Order, ctx: JobContext) -> int:
        return payload.n

    @registry.on_outcome
    def record(outcome: JobOutcome) -> None:
        seen.append(outcome)

    misfit = hq.enqueue("typed", {"n": "not a number"}, max_attempts=3)
    assert run_until(module_server.url, registry, _settings(hq), _settled(hq, misfit))
    got = hq.get_job(misfit)
    assert got is not None and got.state == "dead" and got.attempts == 1
    (dead,) = [o for o in seen if o.ctx.job_id == misfit]
    assert dead.outcome == "dead" and dead.error_type == "InvalidPayload"
    assert dead.error is None, f"outcome.error is a {type(dead.error).__name__}"


def test_ctx_stopped_first_used_by_two_threads_at_once_is_one_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JobContext.stopped: 'wait on it from a thread (made on first use)'. A sync handler that
    fans out to helper threads, each waiting on ctx.stopped, races the first use: one thread
    checks `_event is None`, is switched out while it builds its Event, another builds and
    stores its own and returns it, the first then stores its Event over it. The worker's stop
    sets the stored one; the other thread waits on an Event nobody sets, for ever. The thread
    switch is forced here by an Event whose construction waits for the second thread."""
    ctx = JobContext.for_test()
    second_done = threading.Event()
    made: list[threading.Event] = []

    class SwitchedOut(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)
            if len(made) == 1:  # the first thread is switched out mid-construction
                second_done.wait(5)

    monkeypatch.setattr(context_module, "threading", types.SimpleNamespace(Event=SwitchedOut))
    got: dict[str, threading.Event] = {}

    def first() -> None:
        got["first"] = ctx.stopped

    t = threading.Thread(target=first)
    t.start()
    while not made:  # the first thread is inside its Event's construction
        time.sleep(0.001)
    got["second"] = ctx.stopped
    second_done.set()
    t.join(5)
    ctx._stop("timeout")  # what the worker does on a timeout, a lapse, a cancel
    assert got["first"].is_set() and got["second"].is_set()
