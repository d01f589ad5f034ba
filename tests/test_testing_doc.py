"""docs/guide/workers.md "Testing your handlers": its examples run as written (the unit test
needs no Redis; the integration ones run an embedded worker, one in burst mode, on this run's
Redis)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler import JobContext, Queue

GUIDE = Path(__file__).resolve().parent.parent / "docs/guide/workers.md"


def _blocks() -> list[str]:
    section = GUIDE.read_text().split("## Testing your handlers", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_testing_examples_run(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    unit, integration, burst = _blocks()
    monkeypatch.setenv("REDIS_URL", redis_url)
    ns: dict[str, object] = {"__name__": "testing_example"}
    exec(compile(unit, str(GUIDE), "exec"), ns)
    test_total = ns["test_total"]
    assert callable(test_total)
    test_total()  # the doc's own unit test
    exec(compile(integration, str(GUIDE), "exec"), ns)  # its assert checks the job's result
    assert Queue.from_url(redis_url, "reports-test").counts().leased == 0
    exec(compile(burst, str(GUIDE), "exec"), ns)  # a burst worker ran all three
    left = Queue.from_url(redis_url, "reports-burst").counts()
    assert (left.due, left.scheduled, left.leased) == (0, 0, 0)


def test_for_test_makes_a_context_a_handler_can_use() -> None:
    ctx = JobContext.for_test("t", attempt=2, max_attempts=3, fence=7)
    assert (ctx.task, ctx.attempt, ctx.max_attempts, ctx.fence) == ("t", 2, 3, 7)
    assert ctx.token.startswith("7-") and not ctx.should_stop()
    ctx.raise_if_stopped()  # not stopped: returns
