"""A task the worker does not know, and registrations that could never run.

A rolling deploy: producers with the new code enqueue a new task while a worker of the old
code still claims. That worker used to park the job at once (non-retryable); it is now retried
by the job's backoff, so a worker with the handler takes it on a later attempt. And mistakes a
registry can see are refused when the task is registered, not at the first enqueue or attempt:
a task name that cannot be enqueued, a handler that cannot be called as fn(payload, ctx)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import Backoff, BadArgument, JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until


def test_a_job_an_old_worker_does_not_know_is_run_by_a_new_one(
    module_server: RedisProcess,
) -> None:
    q = Queue.from_url(module_server.url, "deploy")
    old, new = Registry(), Registry()

    @old.task("invoice.build")
    def build(payload: Any, ctx: JobContext) -> None: ...

    @new.task("report.mail")
    def mail(payload: Any, ctx: JobContext) -> str:
        return f"mailed {payload['to']}"

    job = q.enqueue("report.mail", {"to": "a"}, max_attempts=3, backoff=Backoff(200, 1.0, 200, 0))
    settings = WorkerSettings(queues=("deploy",), grace_s=0)
    assert run_until(module_server.url, old, settings, lambda: q.get_job(job).attempts == 1)
    first = q.get_job(job)
    assert first.state in ("due", "scheduled")  # waiting out its backoff, not dead
    assert first.fields["last_error_type"] == "UnknownTask"
    assert "'report.mail'" in first.fields["last_error"]
    assert "it knows invoice.build" in first.fields["last_error"]
    assert run_until(module_server.url, new, settings, lambda: q.status(job) == "done")
    assert q.result(job, timeout_s=1) == "mailed a"
    assert q.get_job(job).attempts == 2


@pytest.mark.parametrize(
    ("name", "why"),
    [("send reminder!", "invalid task name 'send reminder!'"), ("", "invalid task name ''")],
)
def test_a_name_that_cannot_be_enqueued_is_refused_at_registration(name: str, why: str) -> None:
    registry = Registry()
    with pytest.raises(BadArgument, match=why):
        registry.task(name)(lambda payload, ctx: None)
    assert registry.names() == []


def test_the_default_name_of_a_nested_function_is_refused_with_a_hint() -> None:
    def make() -> Any:
        def handler(payload: Any, ctx: JobContext) -> None: ...

        return handler

    with pytest.raises(BadArgument, match=r"<locals>.*give name="):
        Registry().task()(make())
    registry = Registry()
    registry.task("nested.ok")(make())
    assert registry.names() == ["nested.ok"]


def one_arg(payload: Any) -> None: ...
def three_args(payload: Any, ctx: Any, extra: Any) -> None: ...
def keyword_only(*, payload: Any, ctx: Any) -> None: ...
def with_default(payload: Any, ctx: Any, extra: Any = None) -> None: ...
def varargs(*args: Any) -> None: ...
async def async_two(payload: Any, ctx: Any) -> None: ...


@pytest.mark.parametrize("fn", [one_arg, three_args, keyword_only])
def test_a_handler_that_cannot_take_payload_and_ctx_is_refused(fn: Any) -> None:
    registry = Registry()
    with pytest.raises(BadArgument, match=r"must accept \(payload, ctx\)"):
        registry.task("t")(fn)
    assert "t" not in registry


def yields(payload: Any, ctx: Any) -> Any:
    yield payload


async def async_yields(payload: Any, ctx: Any) -> Any:
    yield payload


class _YieldingCall:
    def __call__(self, payload: Any, ctx: Any) -> Any:
        yield payload


@pytest.mark.parametrize("fn", [yields, async_yields, _YieldingCall()])
def test_a_generator_handler_is_refused(fn: Any) -> None:
    """Its generator is no result: every job of the task was parked as InvalidResult at its
    first attempt (the middleware's twin: tests/test_middleware.py)."""
    registry = Registry()
    with pytest.raises(BadArgument, match="generator function"):
        registry.task("t")(fn)
    assert "t" not in registry


def test_a_bare_decorator_is_refused_not_a_silent_no_op() -> None:
    """`@registry.task` without a call passed the function as the name: it came back as the
    decorator itself, nothing was registered, and every job of the task failed UnknownTask."""
    registry = Registry()
    with pytest.raises(BadArgument, match=r"registry\.task\('name'\)"):
        registry.task(one_arg)  # type: ignore[arg-type]
    assert registry.names() == []


@pytest.mark.parametrize("fn", [with_default, varargs, async_two])
def test_handlers_that_can_take_payload_and_ctx_are_registered(fn: Any) -> None:
    registry = Registry()
    registry.task("t")(fn)
    assert "t" in registry


def test_unknown_task_names_share_one_metrics_series(module_server: RedisProcess) -> None:
    """Each distinct unknown name was a series of its own, kept for the worker's life: 1,000
    such jobs grew /metrics from 28 lines to 20,038."""
    from prometheus_client import generate_latest

    from scheduler.worker.metrics import UNKNOWN_TASK, WorkerMetrics

    q = Queue.from_url(module_server.url, "unknown-metrics")
    reg = Registry()

    @reg.task("known")
    def known(payload: Any, ctx: JobContext) -> None: ...

    ids = [q.enqueue(f"nobody.{i}", i, max_attempts=1) for i in range(20)]
    ids.append(q.enqueue("known", 0))
    seen: list[WorkerMetrics] = []
    settings = WorkerSettings(queues=(q.name,), grace_s=0)
    finished = ("dead", "done")
    assert run_until(
        module_server.url,
        reg,
        settings,
        lambda: all(q.status(i) in finished for i in ids),
        setup=lambda w: seen.append(w.metrics),
    )
    text = generate_latest(seen[0].registry).decode()
    assert "nobody." not in text
    assert f'task="{UNKNOWN_TASK}"' in text and 'task="known"' in text
