"""What an app developer uses around handlers, as docs/guide/workers.md describes it ("Outcome
hooks", "Middleware", "Reporting progress", "Testing your handlers"), checked against the code
(scheduler/worker/outcomes.py, middleware.py, context.py, self_stop.py, registry.py,
task_handle.py). From a review: the strict xfails are the defects found, each asserting what
the docs (or the registry's own rule for handlers and middleware) say. In-process workers on
the run's private redis-server (conftest's redis_url), never the shared one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler import BadArgument, JobContext, JobOutcome, Queue, Registry
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect_async
from scheduler.worker import EXIT_OK, Worker, WorkerSettings

FIVE_MS = Backoff(base_ms=5, factor=1.0, cap_ms=5, jitter=0.0)


def _burst(url: str, registry: Registry, q: Queue, bound_s: float = 30.0) -> int:
    """A burst worker on q, run until it returns by itself (bounded: a hang fails)."""

    async def main() -> int:
        client = connect_async(url)
        settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=2_000, burst=True)
        try:
            worker = Worker(client, registry, settings)
            return await asyncio.wait_for(worker.run(install_signals=False), bound_s)
        finally:
            await client.aclose()

    return asyncio.run(main())


# --- the burst worker: "A job not yet due at its last round is left as it is" -----------------

# Longer than _burst's bound: a retry of this backoff cannot come due while the worker runs.
A_MINUTE = Backoff(base_ms=60_000, factor=1.0, cap_ms=60_000, jitter=0.0)


@pytest.mark.parametrize(
    ("max_attempts", "backoff", "left"),
    [(3, A_MINUTE, ("scheduled", 1)), (1, FIVE_MS, ("dead", 1))],
    ids=["backoff-longer-than-the-run", "max-attempts-1"],
)
def test_a_burst_worker_leaves_a_retry_not_due_and_returns(
    redis_url: str, q: Queue, max_attempts: int, backoff: Backoff, left: tuple[str, int]
) -> None:
    """docs/guide/workers.md, Testing your handlers: 'To see exactly one attempt in a test,
    register the task with max_attempts=1 (the job is parked), or with a backoff longer than
    the test's runs and hooks take (... the retry is then left, scheduled)'. Before, the guide
    said a retry whose backoff is 5 ms is left: the round after a fail's answer (sent once the
    fail's hooks ran) claimed it whenever the backoff had passed by then, here an error
    tracker's capture of 20 ms, and on fakeredis at random. An outcome hook as slow is here
    too: neither way depends on it."""
    registry = Registry()

    @registry.task("fails", max_attempts=max_attempts, backoff=backoff)
    def fails(payload: Any, ctx: JobContext) -> None:
        raise ValueError("not now")

    @registry.on_outcome
    def capture(outcome: JobOutcome) -> None:
        if outcome.outcome in ("retry", "dead"):
            time.sleep(0.02)  # what an error tracker's capture_exception may take

    job = fails.enqueue(q, {})
    assert _burst(redis_url, registry, q) == EXIT_OK
    got = q.get_job(job)
    assert (got.state, got.attempts) == left


def test_a_burst_worker_runs_what_a_run_enqueues_and_its_dependants(
    redis_url: str, q: Queue
) -> None:
    """The guide: 'so a job a run releases or enqueues is claimed' (a child enqueued by a
    handler, a dependant its complete releases), and an outcome hook sees each once."""
    registry = Registry()
    seen: list[tuple[str, str]] = []

    @registry.task("child")
    async def child(payload: Any, ctx: JobContext) -> int:
        return int(payload["n"]) * 2

    @registry.task("parent")
    def parent(payload: Any, ctx: JobContext) -> str:
        return child.enqueue(Queue.from_url(redis_url, ctx.queue), {"n": 21})

    @registry.on_outcome
    def record(outcome: JobOutcome) -> None:
        seen.append((outcome.ctx.task, outcome.outcome))

    first = parent.enqueue(q, {})
    after = child.enqueue(q, {"n": 1}, after=[first])
    assert _burst(redis_url, registry, q) == EXIT_OK
    spawned = q.result(first, timeout_s=5)
    assert q.result(spawned, timeout_s=5) == 42 and q.result(after, timeout_s=5) == 2
    assert sorted(seen) == [("child", "done"), ("child", "done"), ("parent", "done")]


# --- "its task handle is still callable as that function" --------------------------------------


def test_an_async_tasks_handle_registered_under_a_second_name_runs_as_async(
    redis_url: str, q: Queue
) -> None:
    """`@registry.task` returns a TaskHandle 'still callable as that function' (the guide), so
    stacking two registrations (a task renamed while old jobs drain, or the same handler in a
    second registry) passes registration. Before: is_async_callable read the handle's sync
    __call__, and every job of the outer name was parked as InvalidResult ('the handler
    returned a coroutine, never awaited') at its first attempt. Now the registry takes the
    handle's function, and the outer handle still calls it. (inspect.iscoroutinefunction(handle)
    is still False on Python 3.11: inspect.markcoroutinefunction is 3.12's.)"""
    registry = Registry()

    @registry.task("report.new")
    @registry.task("report.old")
    async def report(payload: Any, ctx: JobContext) -> int:
        return 5

    ids = [q.enqueue(name, {}, max_attempts=1) for name in ("report.old", "report.new")]
    assert _burst(redis_url, registry, q) == EXIT_OK
    got = {i: (q.status(i), q.get_job(i).fields.get("last_error_type")) for i in ids}
    assert got == {i: ("done", None) for i in ids}
    assert [q.result(i, timeout_s=5) for i in ids] == [5, 5]
    assert asyncio.run(report({}, JobContext.for_test())) == 5  # the handle, still the function


# --- outcome hooks: refused at registration like handlers and middleware ----------------------


def _generator_hook(outcome: JobOutcome) -> Iterator[None]:
    yield None  # a hook written as a generator: its body never runs


@pytest.mark.parametrize(
    "hook",
    [
        _generator_hook,
        lambda outcome, ctx: None,  # the middleware's shape by mistake
        lambda: None,
    ],
    ids=["generator", "two-args", "no-args"],
)
def test_an_outcome_hook_that_cannot_run_is_refused_at_registration(
    hook: Callable[..., Any],
) -> None:
    registry = Registry()
    with pytest.raises(BadArgument):
        registry.on_outcome(hook)
    assert registry.outcome_hooks == []


# --- middleware ------------------------------------------------------------------------------


def test_a_middleware_that_forgets_await_is_named_in_the_jobs_error(
    redis_url: str, q: Queue
) -> None:
    """The guide: a middleware 'must return what call_next(payload, ctx) returns ... awaiting
    it when it is async'. Forgetting the await returns the handler's coroutine as the run's
    result: the job is parked (non-retryable) at its first attempt, the handler never ran.
    Before, the recorded error told the developer to register the async function itself or
    await it in the handler, both already so, and did not name the middleware, the one at
    fault; the outermost layer now says the handler or a middleware returned it."""
    registry = Registry()
    ran: list[str] = []

    @registry.middleware
    async def scoped(call_next: Any, payload: Any, ctx: JobContext) -> Any:
        return call_next(payload, ctx)  # the missing await

    @registry.task("work")
    async def work(payload: Any, ctx: JobContext) -> int:
        ran.append(ctx.job_id)
        return 1

    job = work.enqueue(q, {})
    assert _burst(redis_url, registry, q) == EXIT_OK
    got = q.get_job(job)
    assert got.state == "dead" and ran == []
    assert "middleware" in (got.fields.get("last_error") or ""), got.fields.get("last_error")


# --- progress and for_test ---------------------------------------------------------------------


def test_a_for_test_context_reads_back_progress_and_refuses_what_a_run_refuses() -> None:
    """JobContext.for_test: set_progress checks as a real run's does (4,096 bytes of JSON
    text), a refused value leaves the last one, and progress reads it back."""
    ctx = JobContext.for_test("t")
    ctx.set_progress({"done": 1})
    with pytest.raises(Exception, match="4096"):
        ctx.set_progress("x" * 4095)  # 4,097 bytes with its quotes
    assert ctx.progress == {"done": 1}
    ctx.set_progress("x" * 4094)  # exactly 4,096
    assert ctx.progress == "x" * 4094
