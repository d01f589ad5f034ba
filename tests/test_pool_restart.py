"""The restart plan of a `--processes` pool's child (worker_pool.py, Pool._reap), driven with
the stand-in children of tests/test_pool_retire.py: each exits with the code the test writes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from tests.faults.test_security import PASSWORD
from tests.fixtures.pools import SUPERVISORS
from tests.redis_server import RedisProcess
from tests.test_pool_retire import Stand
from tests.test_worker_pool import (
    alive,
    ledger_pids,
    spawn_pool,
    stop,
    wait_started,
)
from tests.test_worker_server_errors_audit import app_role
from tests.workers.procs import ROOT, SCHEDULER, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    p = Stand(tmp_path, 1)
    yield p
    p.end()


def _line_of(p: Stand, pid: int) -> str:
    """The supervisor's log line about pid's exit."""
    wait_for(lambda: f"(pid {pid}) " in p.text(), what=f"the exit of {pid} logged")
    return next(line for line in p.text().splitlines() if f"(pid {pid}) " in line)


def test_a_restarted_child_that_exits_0_before_it_is_ready_backs_off(stand: Stand) -> None:
    """A restarted child that exits 0 without ever saying ready (its registry's import calls
    sys.exit(), say) did not stop for --max-jobs / --max-memory-mb, which only a ready worker
    reaches. Before: logged as 'stopped cleanly (--max-jobs/-memory-mb)' and started again
    after 1 s, for ever, with no backoff (a first start exiting so already failed the pool).
    Now it is a failed start: restarted with the crash backoff, doubling."""
    p = stand
    first = p.pid(0, 0)
    p.flag("hold-0")  # the processes started from now on never say ready
    p.exit_with(first, 1)  # a crash once ready: restarted in 1 s, then 2 s
    assert "exited with code 1; restarting in 1.0 s" in _line_of(p, first)
    second = p.pid(0, 1)
    p.exit_with(second, 0)
    line = _line_of(p, second)
    assert "exited with code 0; restarting in 2.0 s" in line, p.text()
    third = p.pid(0, 2)
    p.exit_with(third, 0)
    assert "exited with code 0; restarting in 4.0 s" in _line_of(p, third), p.text()
    assert p.sup.poll() is None  # a restart, not the pool's failure


def test_processes_0_on_one_core_is_still_a_pool_that_reloads(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """`--processes 0` (one per core) on a machine or container with one core, with the unit
    of docs/guide/workers.md (ExecReload=kill -HUP). Before: one core made it a lone worker,
    which SIGHUP killed at once (exit by signal, which systemd's Restart=on-failure takes for
    a clean stop): its running job cut and left to its lease, the service down. Now it is a
    pool of one: the reload replaces the process and the old one finishes its job."""
    env = dict(os.environ, TEST_REDIS_URL=redis_url, REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    with open(pool_log, "ab") as out:
        pool = subprocess.Popen(
            [SCHEDULER, "worker", "tests.workers.basic:registry", "--queue", q.name,
             "--processes", "0", "--grace", "30"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        )  # fmt: skip
    SUPERVISORS.add(pool.pid)
    try:
        wait_for(lambda: "concurrency=16" in pool_log.read_text(), what="the worker started")
        job = q.enqueue("sleep", {"s": 2.0})
        wait_for(lambda: len(ledger_pids(client, q)) == 1, what="the job started")
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: q.status(job) == "done" or pool.poll() is not None,
                 what="the job done or the worker gone")  # fmt: skip
        assert pool.poll() is None, pool_log.read_text()[-2000:]
        assert q.status(job) == "done"
        assert q.get_job(job).attempts == 1
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-2000:]


def test_a_child_that_exits_5_once_ready_stops_the_pool_with_5(tmp_path: Path) -> None:
    """Exit 5 (Redis refused for good: an ACL permission removed mid-run, a password rotated)
    cannot be helped by a restart, and every child is the same Redis user. Before: restarted
    with the crash backoff, for ever, the pool never exiting (systemd's RestartPreventExitStatus
    never saw it). Now the pool stops the others gracefully and exits 5, as a first start's
    failure stops it."""
    p = Stand(tmp_path, 2)
    try:
        victim, other = p.pid(0, 0), p.pid(1, 0)
        p.exit_with(victim, 5)
        code = p.exits()
        text = p.text()
        assert code == 5, text
        assert f"(pid {victim}) exited with code 5: Redis refused it for good" in text, text
        assert (p.dir / f"stopped-{other}").exists(), text  # asked to stop gracefully
        assert len(p.pids(0)) == 1 and len(p.pids(1)) == 1, text  # nothing restarted
        assert "restarting in" not in text, text
    finally:
        p.end()


def test_a_permission_removed_from_a_running_pool_stops_it_with_5(
    module_server: RedisProcess, tmp_path: Path, pool_log: Path
) -> None:
    """Real children: the pool's Redis user loses every command while the pool runs. Each child
    stops with exit 5; before, the supervisor restarted them (each new one refused at its start,
    exit 5 again) for ever."""
    admin = module_server.client()
    user = "pw" + uuid.uuid4().hex[:6]
    app_role(admin, user)
    url = f"unix://{user}:{PASSWORD}@{module_server.socket}"
    pool = spawn_pool(url, "p5-" + uuid.uuid4().hex[:6], "--processes", "2", log=pool_log)
    try:
        wait_started(pool_log, 2)
        admin.acl_setuser(user, enabled=True, commands=["-@all"])
        try:
            code = pool.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the pool ran on: " + pool_log.read_text()[-3000:]) from None
        text = pool_log.read_text(errors="replace")
        assert code == 5, text[-3000:]
        assert "Redis refused it for good" in text, text[-3000:]
        assert "restarting in" not in text, text[-3000:]
        started = re.findall(r"started \(pid (\d+)\)", text)
        assert len(started) == 2, text[-3000:]  # none restarted, and none left running
        assert not any(alive(int(pid)) for pid in started), text[-3000:]
    finally:
        stop(pool, pool_log)
        admin.acl_deluser(user)
