"""An outcome hook's time (worker/outcomes.py). A hook runs on the worker's event loop (the
contract lets it use the loop: `get_running_loop().create_task`), so it gets no time limit:
Python cannot interrupt a synchronous call. A slow one is named in the log; one that never
returns is a stalled loop, which the `scheduler worker` process's stall watchdog ends after its
lease (exit 1), the outcome it was reporting already stored."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler import JobContext, JobOutcome, Queue, Registry
from scheduler.worker import WorkerSettings
from scheduler.worker.outcomes import SLOW_HOOK_S
from tests.embedded_worker import run_until
from tests.workers.procs import ROOT, SCHEDULER, wait_for


def test_a_slow_hook_is_named_in_the_log(
    redis_url: str, q: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a hook that held the loop (heartbeats, claims, timeouts all waiting) left no
    trace of itself. Now one that took SLOW_HOOK_S or more logs a warning naming it, capped as
    a hook's errors are."""
    registry = Registry()
    calls: list[str] = []

    @registry.task("ok")
    async def ok(payload: Any, ctx: JobContext) -> int:
        return 1

    @registry.on_outcome
    def sluggish(outcome: JobOutcome) -> None:
        calls.append(outcome.outcome)
        time.sleep(SLOW_HOOK_S * 1.2)

    job = q.enqueue("ok", {})
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=5_000, grace_s=0)
    with caplog.at_level(logging.WARNING, logger="scheduler"):
        assert run_until(redis_url, registry, settings, lambda: calls == ["done"])
    assert q.status(job) == "done"
    lines = [r.getMessage() for r in caplog.records if "held the worker's event loop" in
             r.getMessage()]  # fmt: skip
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert "sluggish" in lines[0] and "done" in lines[0] and job in lines[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the stall watchdog's test")
def test_a_hook_that_never_returns_ends_the_process_not_the_outcome(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """The bound a hanging hook has: the stall watchdog (its lease, at least 10 s), exit 1, the
    stack naming the hook; the job whose outcome it was given stays done."""
    log = tmp_path / "worker.log"
    env = dict(os.environ, TEST_REDIS_URL=redis_url, REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    job = q.enqueue("echo", 1)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [SCHEDULER, "worker", "tests.workers.hook_hang:registry", "--queue", q.name,
             "--lease-ms", "1000", "--heartbeat-ms", "300"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: q.status(job) == "done", what="the job done")
        code = proc.wait(120)  # a hang guard only
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "event loop has not turned" in text and "hook_hang.py" in text, text[-3000:]
    assert q.status(job) == "done"
