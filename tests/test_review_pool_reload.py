"""Review of `scheduler worker --processes N`'s reload (SIGHUP: Pool._reload in
scheduler/cli/worker_pool.py) and its stop: each test shows one defect and fails until it is
fixed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from scheduler.admin.workers import live_workers
from tests.test_worker_pool import (
    alive,
    children,
    spawn_pool,
    wait_started,
)
from tests.test_worker_pool_metrics import answering, free_port, in_flight, scrape
from tests.workers.procs import ROOT, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A registry whose import, while HUP_DIR/broken exists, says so (HUP_DIR/seen-<pid>), waits for
# HUP_DIR/release, then fails (exit 4): a broken deploy that takes a while to fail.
SLOW_BROKEN_REGISTRY = """
import os, time
from tests.workers.basic import registry
d = os.environ['HUP_DIR']
if os.path.exists(os.path.join(d, 'broken')):
    open(os.path.join(d, 'seen-%d' % os.getpid()), 'w').close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(d, 'release')) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise ImportError('a broken deploy')
"""


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _end(pool: subprocess.Popen[bytes], wait_s: float = 30) -> int:
    """Stop the pool: one SIGTERM if it still runs; SIGKILL it and its children if it does not
    stop within `wait_s`. Returns its exit code."""
    if pool.poll() is None:
        pool.send_signal(signal.SIGTERM)
    try:
        return pool.wait(wait_s)
    except subprocess.TimeoutExpired:
        for pid in children(pool.pid):
            os.kill(pid, signal.SIGKILL)
        pool.kill()
        pool.wait(10)
        raise AssertionError("pool did not stop") from None


def _replaced(pool: subprocess.Popen[bytes], old: list[int]) -> bool:
    now = children(pool.pid)
    return len(now) == len(old) and not set(now) & set(old)


def test_a_reload_with_a_fixed_metrics_port_replaces_the_children(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    """Defect (before the supervisor served the pool's metrics): with --metrics-port P, child i
    served P + i and a reload started child i's replacement beside the old one, which still held
    that port: the new process could not bind it and the reload ended at the first child. Now
    the supervisor holds P and each child a free loopback port: the reload replaces every child,
    and P answers every scrape throughout, with both slots once it is over."""
    port = free_port()
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--metrics-port", str(port),
                      log=pool_log)  # fmt: skip
    scrapes: list[set[str]] = []

    def replaced_while_scraped(old: list[int]) -> bool:
        scrapes.append(in_flight(scrape(port)))  # raises if the endpoint does not answer
        return "reload ended" in _text(pool_log) or _replaced(pool, old)

    try:
        wait_started(pool_log)
        wait_for(lambda: answering(port) == {"0", "1"}, what="both slots scraped")
        old = children(pool.pid)
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: replaced_while_scraped(old), timeout_s=30, what="the reload over")
        assert "reload ended" not in _text(pool_log), _text(pool_log)[-2000:]
        wait_for(lambda: not any(alive(pid) for pid in old), what="the old ones gone")
        assert in_flight(scrape(port)) == {"0", "1"}, _text(pool_log)[-2000:]
        assert scrapes and pool.poll() is None
    finally:
        code = _end(pool)
    assert code == 0, _text(pool_log)[-2000:]


def test_a_sighup_while_a_replacement_starts_is_not_lost_when_it_fails(
    redis_url: str, q: Queue, pool_log: Path, tmp_path: Path
) -> None:
    """Defect: a SIGHUP that arrives while a reload's new process is starting rebuilds the
    queue (Pool._reload: `self._queue = [...]`), but when that new process - started before
    this SIGHUP, with the code on disk then - fails, `self._incoming, self._queue = None, []`
    drops the new reload too. The operator's broken deploy, fixed and reloaded again, is never
    applied: the old processes run on and nothing says the second reload was dropped."""
    (tmp_path / "slow_broken.py").write_text(SLOW_BROKEN_REGISTRY)
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log,
                      registry="slow_broken:registry", pythonpath=f"{tmp_path}:{ROOT}",
                      extra_env={"HUP_DIR": str(tmp_path)})  # fmt: skip
    try:
        wait_started(pool_log)
        old = children(pool.pid)
        (tmp_path / "broken").touch()  # a broken deploy ...
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: any(p.name.startswith("seen-") for p in tmp_path.iterdir()),
                 what="the new process importing the broken code")  # fmt: skip
        (tmp_path / "broken").unlink()  # ... fixed, and reloaded again
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: _text(pool_log).count("reload: replacing") == 2, what="the second SIGHUP")
        (tmp_path / "release").touch()  # the first reload's new process fails now
        wait_for(lambda: "reload ended" in _text(pool_log), what="the first reload ended")
        assert children(pool.pid) == old
        try:
            wait_for(lambda: _replaced(pool, old), timeout_s=60,
                     what="the second reload's replacements")  # fmt: skip
        except AssertionError:
            raise AssertionError(
                "the second SIGHUP was dropped: " + _text(pool_log)[-2000:]
            ) from None
        wait_for(lambda: not any(alive(pid) for pid in old), what="the old ones gone")
    finally:
        code = _end(pool)
    assert code == 0, _text(pool_log)[-2000:]


def test_a_reload_leaves_the_pools_worker_ids_listed(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """Defect: with --worker-id, a replacement carries its predecessor's id (pw.1, ...:
    worker_pool_start.child_commands), and the predecessor's last act when it stops is to remove
    its presence (runtime.Worker._stop_sequence: worker_beat 'remove', ZREM + DEL of the id):
    that deletes the entry the new process wrote. After a reload `scheduler workers` lists
    none of the pool's processes until each new one's next heartbeat (here 20 s)."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--worker-id", "pw",
                      "--heartbeat-ms", "20000", "--lease-ms", "60000", log=pool_log)  # fmt: skip
    try:
        wait_started(pool_log)
        old = children(pool.pid)
        wait_for(lambda: len(live_workers(client, q.keys)[0]) == 2, what="both listed")
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: _replaced(pool, old), timeout_s=30, what="both replaced")
        wait_for(lambda: not any(alive(pid) for pid in old), what="the old ones gone")
        new = children(pool.pid)
        live, _ = live_workers(client, q.keys)
        listed = sorted((w.id, w.pid) for w in live)
        assert [i for i, _ in listed] == ["pw.1", "pw.2"], f"listed after the reload: {listed}"
        assert sorted(p for _, p in listed if p is not None) == new
    finally:
        code = _end(pool)
    assert code == 0, _text(pool_log)[-2000:]


def test_the_stop_log_counts_the_processes_a_reload_left_running(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    """Defect (a log line that lies): `_terminate` logs "stopping %d worker processes" with
    len(self.children), but sends the stop to _everyone() - the children, a reload's new
    process and the replaced ones still finishing their jobs - and waits for all of them. A
    stop right after a reload says 2 while it waits for 3 (one still in its grace)."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "30", log=pool_log)
    gate = pool_log.parent / "job-may-end"  # the job runs until the stop is sent (not 8 s)
    try:
        wait_started(pool_log)
        job = q.enqueue("sync_sleep", {"s": 120, "until": str(gate)})
        wait_for(lambda: q.status(job) == "leased", what="the job running")
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: _text(pool_log).count("concurrency=16") == 4
                 and _text(pool_log).count("stop asked by the pool") == 2,
                 timeout_s=30, what="both replaced")  # fmt: skip
        # The idle old process exits at once; the busy one finishes its job first.
        wait_for(lambda: len(children(pool.pid)) == 3, what="the idle old one gone")
        running = children(pool.pid)
        assert q.status(job) == "leased", running  # one old still busy
        pool.send_signal(signal.SIGTERM)
        gate.touch()
        code = pool.wait(30)
        # done, not released: the pool waited for the busy one before exiting
        assert code == 0 and q.status(job) == "done", _text(pool_log)[-2000:]
        said = re.findall(r"stopping (\d+) worker process", _text(pool_log))
        assert said == ["3"], f"the stop went to {len(running)} processes; the log says {said}"
    finally:
        _end(pool)
