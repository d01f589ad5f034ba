"""Handler middleware (`@registry.middleware`, worker/middleware.py): around every run of every
task of its kind, registered before or after the task, outermost first; what it returns or
raises is the run's outcome; a sync one runs in the handler's thread, an async one on the loop.
Through a real worker on a real Redis."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest

from scheduler import BadArgument, JobContext, JobDead, Queue, Registry
from scheduler.core.backoff import Backoff
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until

NOW = Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0)
Call = Callable[[Any, JobContext], Any]


def _settings(q: Queue) -> WorkerSettings:
    return WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=1_000, grace_s=0)


def _done(q: Queue, *ids: str) -> Callable[[], bool]:
    return lambda: all(q.status(i) in ("done", "dead") for i in ids)


def test_each_kind_wraps_its_own_handlers_outermost_first(redis_url: str, q: Queue) -> None:
    calls: list[tuple[str, str, str]] = []  # (layer, task, thread name)
    registry = Registry()

    @registry.middleware
    def outer(call_next: Call, payload: Any, ctx: JobContext) -> Any:
        calls.append(("outer", ctx.task, threading.current_thread().name))
        return {"outer": call_next(payload, ctx)}

    @registry.task("sync")  # registered between two middleware: both wrap it
    def sync_task(payload: Any, ctx: JobContext) -> Any:
        calls.append(("handler", ctx.task, threading.current_thread().name))
        return payload["n"] + 1

    @registry.task("async")
    async def async_task(payload: Any, ctx: JobContext) -> Any:
        calls.append(("handler", ctx.task, threading.current_thread().name))
        return payload["n"] * 10

    @registry.middleware
    def inner(call_next: Call, payload: Any, ctx: JobContext) -> Any:
        calls.append(("inner", ctx.task, threading.current_thread().name))
        return {"inner": call_next({"n": payload["n"] * 2}, ctx)}

    @registry.middleware
    async def around_async(call_next: Call, payload: Any, ctx: JobContext) -> Any:
        calls.append(("async", ctx.task, threading.current_thread().name))
        return [await call_next(payload, ctx), ctx.job_id]

    s, a = q.enqueue("sync", {"n": 1}), q.enqueue("async", {"n": 2})
    assert run_until(redis_url, registry, _settings(q), _done(q, s, a))
    assert q.result(s, timeout_s=5) == {"outer": {"inner": 3}}  # inner doubled n: 2 + 1
    assert q.result(a, timeout_s=5) == [20, a]
    sync_calls = [c for c in calls if c[1] == "sync"]
    assert [c[0] for c in sync_calls] == ["outer", "inner", "handler"]
    assert len({c[2] for c in sync_calls}) == 1  # all in the handler's thread
    assert sync_calls[0][2] != threading.main_thread().name
    async_calls = [c for c in calls if c[1] == "async"]
    assert [c[0] for c in async_calls] == ["async", "handler"]
    assert {c[2] for c in async_calls} == {threading.main_thread().name}  # on the loop
    # The handle still calls the bare function (a unit test of the handler).
    assert sync_task({"n": 5}, JobContext.for_test()) == 6


def test_what_a_middleware_raises_is_the_runs_failure(redis_url: str, q: Queue) -> None:
    registry = Registry()
    seen: list[int] = []

    @registry.task("work", max_attempts=2, backoff=NOW, non_retryable=(PermissionError,))
    async def work(payload: Any, ctx: JobContext) -> str:
        seen.append(ctx.attempt)
        return "ran"

    @registry.middleware
    async def gate(call_next: Call, payload: Any, ctx: JobContext) -> Any:
        if payload.get("deny"):
            raise PermissionError("denied before the handler")
        if ctx.attempt == 1 and payload.get("flaky"):
            raise ConnectionError("session not ready")
        return await call_next(payload, ctx)

    denied = q.enqueue("work", {"deny": True}, max_attempts=2, backoff=NOW)
    flaky = q.enqueue("work", {"flaky": True}, max_attempts=2, backoff=NOW)
    assert run_until(redis_url, registry, _settings(q), _done(q, denied, flaky))
    # non_retryable applies to what the middleware raised: parked at its first attempt
    with pytest.raises(JobDead) as dead:
        q.result(denied, timeout_s=5)
    assert dead.value.error_type == "PermissionError" and q.get_job(denied).attempts == 1
    assert q.status(flaky) == "done" and q.result(flaky, timeout_s=5) == "ran"
    assert seen == [2]  # the handler ran once: on the retry the middleware let through


class AsyncCallable:
    """A middleware object whose __call__ is a coroutine function: async."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, call_next: Call, payload: Any, ctx: JobContext) -> Any:
        self.calls += 1
        return await call_next(payload, ctx)


def test_an_object_with_an_async_call_wraps_the_async_handlers(redis_url: str, q: Queue) -> None:
    registry = Registry()
    mw = AsyncCallable()
    registry.middleware(mw)

    @registry.task("a")
    async def a(payload: Any, ctx: JobContext) -> str:
        return "a"

    @registry.task("s")
    def s(payload: Any, ctx: JobContext) -> str:
        return "s"

    ids = q.enqueue("a", None), q.enqueue("s", None)
    assert run_until(redis_url, registry, _settings(q), _done(q, *ids))
    assert [q.result(i, timeout_s=5) for i in ids] == ["a", "s"]
    assert mw.calls == 1  # the async task's run only


def test_a_handler_or_hook_object_with_an_async_call_is_taken_for_async(
    redis_url: str, q: Queue
) -> None:
    """The same rule for what a Registry takes elsewhere: a handler object whose __call__ is a
    coroutine function is run on the loop and awaited (it was run in a thread, its coroutine
    the 'result'), and such an outcome hook is refused like a coroutine function."""
    registry = Registry()

    class Handler:
        async def __call__(self, payload: Any, ctx: JobContext) -> int:
            return 7

    class Hook:
        async def __call__(self, outcome: Any) -> None:
            pass

    registry.task("obj")(Handler())
    assert registry.get("obj").is_async
    with pytest.raises(BadArgument, match="plain function"):
        registry.on_outcome(Hook())
    job = q.enqueue("obj", None)
    assert run_until(redis_url, registry, _settings(q), _done(q, job))
    assert q.result(job, timeout_s=5) == 7


@dataclasses.dataclass
class Order:
    sku: str
    qty: int


def test_a_typed_task_decodes_inside_the_middleware(redis_url: str, q: Queue) -> None:
    registry = Registry()
    seen: list[Any] = []

    @registry.middleware
    async def look(call_next: Call, payload: Any, ctx: JobContext) -> Any:
        seen.append(payload)
        return await call_next(payload, ctx)

    @registry.task("order", payload_type=Order)
    async def order(payload: Order, ctx: JobContext) -> int:
        return payload.qty * 2

    job = order.enqueue(q, Order("a1", 3))
    assert run_until(redis_url, registry, _settings(q), _done(q, job))
    assert q.result(job, timeout_s=5) == 6
    assert seen == [{"sku": "a1", "qty": 3}]  # the JSON, whatever the task's type


def _yields(call_next: Call, payload: Any, ctx: JobContext) -> Any:
    yield call_next(payload, ctx)


async def _async_yields(call_next: Call, payload: Any, ctx: JobContext) -> Any:
    yield await call_next(payload, ctx)


@pytest.mark.parametrize(
    "bad",
    [
        "not callable",
        lambda call_next, payload: None,  # no ctx: every run would fail
        type("Klass", (), {}),
        _yields,  # contextmanager-shaped: its generator was every run's result (parked)
        _async_yields,
    ],
)
def test_a_middleware_that_cannot_be_called_so_is_refused(bad: Any) -> None:
    registry = Registry()

    @registry.task("t")
    def t(payload: Any, ctx: JobContext) -> None:
        return None

    before = registry.get("t")
    with pytest.raises(BadArgument, match="middleware"):
        registry.middleware(bad)
    assert registry.get("t") is before  # nothing wrapped
