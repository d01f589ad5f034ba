"""Outcome hooks (`@registry.on_outcome`, worker/outcomes.py): called once per outcome the worker
counts, with the metrics' word, after the server answered; the handler's own exception on the
`retry`/`dead` it led to; a hook that raises changes no job's outcome."""

from __future__ import annotations

import gc
import inspect
import logging
import weakref
from typing import Any

import pytest

from scheduler import BadArgument, JobContext, JobOutcome, Queue, Registry
from scheduler.core.backoff import Backoff
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until

NOW = Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0)


class Boom(Exception):
    pass


def _registry(seen: list[JobOutcome]) -> Registry:
    registry = Registry()

    @registry.task("ok")
    async def ok(payload: Any, ctx: JobContext) -> int:
        return 1

    @registry.task("flaky", max_attempts=2, backoff=NOW)
    def flaky(payload: Any, ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise Boom("first try")

    @registry.task("broken", max_attempts=2, backoff=NOW)
    async def broken(payload: Any, ctx: JobContext) -> None:
        raise Boom(f"attempt {ctx.attempt}")

    @registry.on_outcome
    def record(outcome: JobOutcome) -> None:
        seen.append(outcome)

    return registry


def _settings(q: Queue) -> WorkerSettings:
    return WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=1_000, grace_s=0)


def test_each_outcome_reaches_the_hook_with_its_word_and_error(redis_url: str, q: Queue) -> None:
    seen: list[JobOutcome] = []
    registry = _registry(seen)
    # By name, so the task's defaults do not apply: given here.
    ok, flaky, broken = (
        q.enqueue(t, {}, max_attempts=2, backoff=NOW) for t in ("ok", "flaky", "broken")
    )
    gone = q.enqueue("nobody.handles", {}, max_attempts=1)

    def settled() -> bool:
        return {q.status(i) for i in (ok, flaky)} == {"done"} and {
            q.status(i) for i in (broken, gone)
        } == {"dead"}

    assert run_until(redis_url, registry, _settings(q), settled)
    by_job: dict[str, list[str]] = {}
    for o in seen:
        by_job.setdefault(o.ctx.job_id, []).append(o.outcome)
    assert by_job == {
        ok: ["done"],
        flaky: ["retry", "done"],
        broken: ["retry", "dead"],
        gone: ["dead"],
    }
    retry = next(o for o in seen if o.ctx.job_id == flaky and o.outcome == "retry")
    assert isinstance(retry.error, Boom) and str(retry.error) == "first try"
    assert retry.error.__traceback__ is not None  # what an error tracker needs
    assert retry.error_type == "Boom" and retry.retry_at_ms is not None
    assert retry.ctx.attempt == 1 and retry.ctx.task == "flaky" and retry.ctx.queue == q.name
    dead = next(o for o in seen if o.ctx.job_id == broken and o.outcome == "dead")
    assert isinstance(dead.error, Boom) and str(dead.error) == "attempt 2"
    assert dead.dead_reason and dead.ctx.attempt == 2
    unknown = next(o for o in seen if o.ctx.job_id == gone)
    assert unknown.error is None and unknown.error_type == "UnknownTask"  # the worker's own
    done = next(o for o in seen if o.ctx.job_id == ok)
    assert done.error is None and done.error_type is None and done.retry_at_ms is None


def test_a_hook_that_raises_changes_no_outcome(
    redis_url: str, q: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[JobOutcome] = []
    registry = _registry(seen)

    @registry.on_outcome
    def bad(outcome: JobOutcome) -> None:
        raise RuntimeError("hook bug")

    ids = [q.enqueue("ok", {}) for _ in range(10)]
    with caplog.at_level(logging.ERROR, logger="scheduler"):
        assert run_until(
            redis_url, registry, _settings(q), lambda: all(q.status(i) == "done" for i in ids)
        )
    assert sorted(o.ctx.job_id for o in seen) == sorted(ids)  # the hook before it still ran
    assert all(q.get_job(i).result_json == "1" for i in ids)
    lines = [r for r in caplog.records if "outcome hook" in r.getMessage()]
    assert 1 <= len(lines) <= 3  # logged, a few lines a window, not one per job
    assert "RuntimeError" in lines[0].getMessage()


def test_only_a_plain_callable_is_taken() -> None:
    registry = Registry()

    async def coro(outcome: JobOutcome) -> None:
        pass

    with pytest.raises(BadArgument, match="plain function"):
        registry.on_outcome(coro)
    with pytest.raises(BadArgument):
        registry.on_outcome(42)  # type: ignore[type-var]
    assert registry.outcome_hooks == []


def test_a_hook_that_exits_does_not_stop_the_worker(redis_url: str, q: Queue) -> None:
    seen: list[JobOutcome] = []
    registry = _registry(seen)

    @registry.on_outcome
    def leave(outcome: JobOutcome) -> None:
        raise SystemExit(3)

    ids = [q.enqueue("ok", {}) for _ in range(5)]
    assert run_until(
        redis_url, registry, _settings(q), lambda: all(q.status(i) == "done" for i in ids)
    )
    assert sorted(o.ctx.job_id for o in seen) == sorted(ids)


class _Big:
    pass


def test_without_hooks_a_handler_s_exception_is_not_kept(redis_url: str, q: Queue) -> None:
    """r.error (for the hooks) kept the exception, its traceback and the handler's frames alive
    after the job was reported; an idle handler thread kept its last job's closure too."""
    refs: list[weakref.ref[_Big]] = []
    registry = Registry()

    @registry.task("raises")
    def raises(payload: Any, ctx: JobContext) -> None:
        big = _Big()
        refs.append(weakref.ref(big))
        raise ValueError("boom")

    ids = [q.enqueue("raises", {}, max_attempts=1) for _ in range(5)]

    def released() -> bool:
        if not all(q.status(i) == "dead" for i in ids):
            return False
        gc.collect()
        return len(refs) == 5 and all(r() is None for r in refs)

    assert run_until(redis_url, registry, _settings(q), released, timeout_s=5)


class _Nameless(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name")


class _OddError(Exception, metaclass=_Nameless):
    pass


class _HookObject:
    def __call__(self, outcome: JobOutcome) -> None:
        raise ValueError("hook bug")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_hook_error_that_cannot_be_named_does_not_stop_the_worker(
    redis_url: str, q: Queue
) -> None:
    """Logging a hook's exception read type(exc).__name__ (a metaclass's may raise) and the
    hook object's repr (its own code): what they raised left emit and stopped the worker
    ("loop reporter died", exit 1) at the first outcome."""
    seen: list[JobOutcome] = []
    registry = _registry(seen)

    @registry.on_outcome
    def odd(outcome: JobOutcome) -> None:
        raise _OddError("x")

    registry.on_outcome(_HookObject())
    ids = [q.enqueue("ok", {}) for _ in range(5)]
    assert run_until(
        redis_url, registry, _settings(q), lambda: all(q.status(i) == "done" for i in ids)
    )
    assert sorted(o.ctx.job_id for o in seen) == sorted(ids)


def test_a_hook_that_returns_a_coroutine_is_logged_not_dropped(
    redis_url: str, q: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync wrapper around an async def (a lambda, a decorator) passes registration; its
    coroutine was never run nor closed, with no word but a "never awaited" warning later."""
    registry = _registry([])
    made: list[Any] = []

    async def notify(outcome: JobOutcome) -> None:
        pass

    @registry.on_outcome
    def wrapper(outcome: JobOutcome) -> Any:  # what a sync decorator around notify returns
        made.append(notify(outcome))
        return made[-1]

    ids = [q.enqueue("ok", {}) for _ in range(3)]
    with caplog.at_level(logging.ERROR, logger="scheduler"):
        assert run_until(redis_url, registry, _settings(q), lambda: len(made) == 3)
    assert all(inspect.getcoroutinestate(c) == inspect.CORO_CLOSED for c in made)
    assert all(q.status(i) == "done" for i in ids)
    lines = [r for r in caplog.records if "outcome hook" in r.getMessage()]
    assert lines and "never awaited" in str(lines[0].exc_info and lines[0].exc_info[1])
