"""A `scheduler worker` whose every thread is frozen (a sync handler holding the GIL: a C call
that never releases it) ends itself, as one whose event loop alone is held does
(scheduler/cli/stall_watchdog.py): the stall watchdog's own thread needs the GIL too, so its
backstop is a timer of faulthandler's, which does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from scheduler.cli.stall_watchdog import FROZEN_MARGIN_S, STALL_MIN_S
from tests.workers.procs import ROOT, SCHEDULER, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc via ctypes")


def test_a_worker_frozen_by_a_handler_holding_the_gil_ends_itself(
    redis_url: str, client: redis.Redis, q: Queue, tmp_path: Path
) -> None:
    """Before: the process stayed up for as long as the handler held the GIL (an hour here):
    no heartbeat, no signal handling, and the stall watchdog, a Python thread, never ran; its
    leases lapsed and the process held its slot doing nothing. Now it exits 1 after its stall
    limit plus FROZEN_MARGIN_S, with every thread's stack on stderr; the job, lapsed, runs
    again (and is parked after its last attempt, as for a held loop)."""
    log = tmp_path / "worker.log"
    env = dict(os.environ, TEST_REDIS_URL=redis_url, REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    job = q.enqueue("hold_gil", 3600)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [SCHEDULER, "worker", "tests.workers.stuck:registry", "--queue", q.name,
             "--lease-ms", "1000", "--heartbeat-ms", "300"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: client.exists(f"{job}:holder") == 1, what="the handler holds the GIL")
        code = proc.wait(STALL_MIN_S + FROZEN_MARGIN_S + 60)  # a hang guard only
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "hold_gil" in text and "stuck.py" in text, text[-3000:]  # the frozen stack
    assert q.get_job(job).state in ("leased", "due"), q.get_job(job)  # not lost
