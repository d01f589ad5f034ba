"""The pool's stop deadline (scheduler/cli/worker_pool.py): a child asked to stop that is still
running well past the point where its own bounds (--grace, the shutdown's steps, the stall and
exit watchdogs) would have ended it is killed by the supervisor, so one stuck process cannot
keep the pool up for ever."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from scheduler.cli.worker_pool_start import stop_deadline_s
from tests.test_worker_pool import alive, children, spawn_pool
from tests.workers.procs import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_child_that_cannot_stop_is_killed_at_the_pools_deadline(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """A child running a job is frozen (SIGSTOP: its signal handling and every watchdog of its
    own with it), so the stop the supervisor sends on never takes effect. Before: the pool
    waited for that child for ever after its SIGTERM (only a second signal ended it). Now the
    supervisor kills it once the stop deadline has passed, the other child stops cleanly, and
    the pool exits 1 (a worker crashed: the stuck job's lease lapses, and it runs again)."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "0", "--lease-ms",
                      "1000", "--heartbeat-ms", "300", registry="tests.workers.stuck:registry",
                      log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
        job = q.enqueue("hold_gil", 3600)
        wait_for(lambda: client.exists(f"{job}:holder") == 1, what="the handler holds the GIL")
        holder = int(client.get(f"{job}:holder"))  # type: ignore[arg-type]
        os.kill(holder, signal.SIGSTOP)
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(stop_deadline_s(0, 1000) + 60)  # a hang guard only
    finally:
        if pool.poll() is None:
            pool.kill()
    log = pool_log.read_text()
    assert code == 1, log[-3000:]
    assert not alive(holder)
    assert "did not stop within" in log and "killed" in log, log[-3000:]
    assert q.get_job(job).state in ("leased", "due"), q.get_job(job)  # not lost: it runs again


def test_the_deadline_covers_the_childs_own_bounds() -> None:
    """The deadline is never sooner than the child's own: its grace, the stall watchdog (the
    lease, at least 10 s, and 15 s more for a held GIL) and the exit watchdog's two waits."""
    assert stop_deadline_s(25, 30_000) >= 25 + 30 + 15 + 20
    assert stop_deadline_s(0, 1) >= 10 + 15 + 20
    assert stop_deadline_s(100, 1) > stop_deadline_s(0, 1)
