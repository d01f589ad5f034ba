"""A pool child killed by a signal of its own while the pool stops (the OOM killer's SIGKILL
during its grace period): the pool's exit code is one of the table's (1: a worker crashed),
not the shell's 128+N (scheduler/cli/worker_pool.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from scheduler.core.exits import EXIT_CODES, EXIT_FAILED
from tests.test_worker_pool import children, spawn_pool
from tests.workers.basic import LEDGER
from tests.workers.procs import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_child_killed_during_the_stop_makes_the_pool_exit_1(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """Before: the pool exited 137 (SIGKILL's 128+9), a code outside the table of exit codes
    a service manager's RestartPreventExitStatus / an operator reads. Now 1, as for any
    crashed worker, and the log names the signal."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "60", log=pool_log)
    try:
        wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
        job = q.enqueue("sleep", {"s": 3600})
        wait_for(lambda: client.llen(f"{LEDGER}:{q.name}") == 1, what="the job running")
        holder = int(str(client.lindex(f"{LEDGER}:{q.name}", 0)).split("|")[-1])
        pool.send_signal(signal.SIGTERM)  # the pool's graceful stop: the holder keeps its grace
        wait_for(lambda: children(pool.pid) == [holder], what="the idle child stopped")
        os.kill(holder, signal.SIGKILL)  # as the OOM killer would
        code = pool.wait(60)  # a hang guard only
    finally:
        if pool.poll() is None:
            pool.kill()
            pool.wait(10)
    text = pool_log.read_text(errors="replace")
    assert code == EXIT_FAILED, text[-3000:]
    assert code in {c for c, _ in EXIT_CODES}
    assert "SIGKILL" in text, text[-3000:]
    assert q.get_job(job).state == "leased"  # its lease lapses: run again, not lost
