"""A report whose call cannot be built (its arguments refused by the client's own checks,
BadArgument: never sent) is that report's problem alone. The worker's Pipeline sends the
others of the round; the refused one is logged and forgotten, so its lease lapses and the job
runs again (at-least-once), while the worker goes on. Before, the exception aborted the whole
round: it was put back and sent again for ever, and every other outcome of the worker waited
behind it (a complete's, or the worker exited as if Redis had refused it)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scheduler import JobContext, Queue, Registry
from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until


def _settings(q: Queue) -> WorkerSettings:
    # A lease long enough that the refused job is still held when the test looks.
    return WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=60_000, grace_s=0)


def _registry() -> Registry:
    registry = Registry()

    @registry.task("boom")
    async def boom(payload: Any, ctx: JobContext) -> None:
        raise RuntimeError("no")

    @registry.task("fine")
    async def fine(payload: Any, ctx: JobContext) -> str:
        return "ok"

    return registry


def test_a_fail_that_cannot_be_built_holds_no_other_outcome(
    redis_url: str, q: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bad = q.enqueue("boom", None)
    real = codec.fail_args

    def fail_args(job_id: str, *args: Any, **kwargs: Any) -> list[str]:
        if job_id == bad:
            raise BadArgument("a refused argument (test)")
        return real(job_id, *args, **kwargs)

    monkeypatch.setattr(codec, "fail_args", fail_args)
    goods = [q.enqueue("fine", i) for i in range(3)]
    done = lambda: all(q.status(g) == "done" for g in goods)  # noqa: E731
    with caplog.at_level(logging.ERROR, logger="scheduler"):
        assert run_until(redis_url, _registry(), _settings(q), done, timeout_s=30)
    # Not lost: still leased, so its lease lapses and it runs again.
    assert q.status(bad) == "leased"
    assert any(f"fail of job {bad} errored" in r.getMessage() for r in caplog.records)


def test_a_complete_that_cannot_be_built_holds_no_fail_and_stops_no_worker(
    redis_url: str, q: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def complete_args(*args: Any, **kwargs: Any) -> list[str]:
        raise BadArgument("a refused argument (test)")

    monkeypatch.setattr(codec, "complete_args", complete_args)
    done_job = q.enqueue("fine", None)
    failing = q.enqueue("boom", None, max_attempts=1)
    with caplog.at_level(logging.ERROR, logger="scheduler"):
        assert run_until(
            redis_url, _registry(), _settings(q), lambda: q.status(failing) == "dead", timeout_s=30
        )
    assert q.status(done_job) == "leased"  # its complete was never sent: it runs again later
    assert any("complete refused" in r.getMessage() for r in caplog.records)
