"""SIGHUP to a lone `scheduler worker` (a terminal's hangup: an ssh session that drops, a
`kill -HUP`): the SIGTERM stop, not a death (scheduler/cli/worker_start.py)."""

from __future__ import annotations

import signal
import sys

import pytest

from scheduler import Queue
from tests.workers.procs import spawn_worker, stop_all, wait_for

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def test_a_hangup_stops_a_lone_worker_gracefully(redis_url: str, q: Queue) -> None:
    """Before: Python's default for SIGHUP killed the worker on the spot (exit -1, 129 in a
    shell): its running job was neither finished nor released, its lease left to lapse (an
    attempt spent), its presence entry left behind. Now it is a stop request, as SIGTERM is:
    --grace for the running job, then it is released (its attempt given back), exit 0."""
    worker = spawn_worker(redis_url, q.name, "--grace", "0.2")
    try:
        job = q.enqueue("sleep", {"s": 3600})
        wait_for(lambda: q.status(job) == "leased", what="the job running")
        worker.send_signal(signal.SIGHUP)
        code = worker.wait(60)  # a hang guard only
    finally:
        stop_all([worker])
    assert code == 0
    got = q.get_job(job)
    assert got.state == "due" and got.attempts == 0, got  # released, its attempt given back
