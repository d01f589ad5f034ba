"""A pool child's handling of its supervisor's stop signal (STOP_SIGNAL, SIGUSR1) kept in place
against a handler that changes it, as its SIGTERM/SIGINT handling is (signal_guard.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from tests.test_worker_pool import alive, children, spawn_pool, stop
from tests.workers.procs import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.parametrize("how", ["ignore", "remove"])
def test_a_handler_that_changes_the_stop_signal_does_not_cut_the_pools_stop(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path, how: str
) -> None:
    """A handler in a pool child sets SIGUSR1 to SIG_IGN or removes the loop's handler of it.
    Before: the pool's graceful stop (SIGTERM to the supervisor,
    which sends SIGUSR1 on) never reached that child (ignored: the pool never stopped) or
    killed it at once (removed: exit 0 all the same, the running job cut and left to its
    lease). Now the worker puts its handler back, as for SIGTERM, and the job finishes."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "30",
                      registry="tests.workers.pool_stop:registry", log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
        kids = children(pool.pid)
        job = q.enqueue("change_stop_signal", how)
        wait_for(lambda: client.exists(f"{job}:changed") == 1, what="the handler changed it")
        holder = int(client.get(f"{job}:changed"))  # type: ignore[arg-type]
        assert holder in kids
        pool.send_signal(15)  # the pool's graceful stop: SIGUSR1 to each child
        wait_for(lambda: "stop asked by the pool's supervisor" in pool_log.read_text(),
                 what="a child asked to stop")  # fmt: skip
        assert alive(holder)  # finishing its job within --grace
        client.set(f"{job}:go", 1)
        code = pool.wait(30)  # no second signal: that would force the children
    finally:
        if pool.poll() is None:
            stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-3000:]
    assert q.get_job(job).state == "done", pool_log.read_text()[-3000:]
