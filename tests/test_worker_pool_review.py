"""Review of `scheduler worker --processes N` as an operator drives it (the supervisor:
scheduler/cli/worker_pool*.py): stops, reloads, killed children, exit codes and the help
text. Real processes against private Redis servers; every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from scheduler import JobSpec, Queue
from scheduler.cli.main import main
from scheduler.cli.worker_pool_start import stop_deadline_s
from scheduler.core.exits import EXIT_FAILED
from tests.faults.test_security import PASSWORD
from tests.redis_server import RedisProcess
from tests.test_review_pool_reload import _end as stop_pool
from tests.test_worker_pool import alive, children, ledger_pids, spawn_pool, wait_started
from tests.test_worker_server_errors_audit import app_role
from tests.workers.basic import LEDGER
from tests.workers.procs import ROOT, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _end(pool: subprocess.Popen[bytes]) -> int:
    """One SIGTERM if the pool still runs, 60 s to stop (then SIGKILL). Its exit code."""
    return stop_pool(pool, wait_s=60)


def _holder(client: redis.Redis, q: Queue) -> int:
    """The pid of the process whose run of a job wrote the ledger's first line."""
    return int(str(client.lindex(f"{LEDGER}:{q.name}", 0)).split("|")[-1])


# -- the help text ---------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["stop", "quiet"])
def test_workers_stop_help_does_not_say_a_pool_child_is_replaced(verb: str) -> None:
    """`scheduler workers stop|quiet --help` (and docs/cli.md, made from it) ends with "A child
    of a `--processes` pool is replaced by its supervisor." The supervisor does the opposite:
    the slot is retired, never started again (worker_pool.py `_retire`; docs/guide/operating.md
    "is not replaced by its supervisor"; tests/test_pool_remote_stop.py). An operator who reads
    the help expects the process back and gets a smaller pool."""
    out = CliRunner().invoke(main, ["workers", verb, "--help"], terminal_width=400).output
    flat = " ".join(out.split())
    assert "is replaced by its supervisor" not in flat, flat


# -- a graceful stop gives back what it claimed ---------------------------------------------


def test_a_pool_stopped_while_draining_leaves_no_job_leased(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """SIGTERM to a busy pool of short jobs (the children claim in batches and ahead): every
    job claimed and never started is given back (release) and every running one finishes
    within --grace, so once the pool exits 0 no job is left leased until its lease lapses,
    none is lost and none ran twice."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--concurrency", "4", "--grace",
                      "30", "--lease-ms", "600000", log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: _text(pool_log).count("concurrency=4") == 2, what="two started")
        # One bulk call, more than the pool drains while the test waits and signals: 3,000
        # enqueued one by one were all done before the stop on a loaded machine (a flaky CI).
        ids = q.enqueue_many([JobSpec("echo", {"n": i}) for i in range(10_000)])
        wait_for(lambda: client.llen(f"{LEDGER}:{q.name}") >= 200, timeout_s=60,
                 what="the pool busy")  # fmt: skip
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    assert code == 0, _text(pool_log)[-3000:]
    states: dict[str, int] = {}
    for i in ids:
        s = q.status(i) or "missing"
        states[s] = states.get(s, 0) + 1
    assert "leased" not in states and "missing" not in states, states
    assert states.get("done", 0) < len(ids), states  # the stop came while jobs were waiting
    starts = [str(e).split("|")[0] for e in client.lrange(f"{LEDGER}:{q.name}", 0, -1)]
    assert len(starts) == len(set(starts)), "a job ran twice"


# -- a reload's replaced process, during the pool's stop ------------------------------------


def _reloaded_then_stopped(
    pool: subprocess.Popen[bytes], client: redis.Redis, q: Queue, pool_log: Path
) -> tuple[str, int]:
    """A long job running in one child; SIGHUP swaps both slots (the idle old child exits, the
    busy one is asked to stop and finishes within --grace); then SIGTERM: the new children
    stop, the old one still runs its job. The job and the old child's pid."""
    wait_started(pool_log, 2)
    job = q.enqueue("sleep", {"s": 3600})
    wait_for(lambda: client.llen(f"{LEDGER}:{q.name}") == 1, what="the job running")
    old = _holder(client, q)
    pool.send_signal(signal.SIGHUP)
    wait_for(lambda: _text(pool_log).count("stop asked by the pool") == 2, timeout_s=60,
             what="both slots swapped, the old ones asked to stop")  # fmt: skip
    wait_for(lambda: len(children(pool.pid)) == 3, what="the idle old one gone")
    assert alive(old)  # still within its grace: its job runs
    pool.send_signal(signal.SIGTERM)
    wait_for(lambda: children(pool.pid) == [old], timeout_s=60, what="the new ones stopped")
    return job, old


def test_a_replaced_child_killed_during_the_stop_makes_the_pool_exit_1(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """A reload (SIGHUP) swapped new processes in; the old one that holds a long job is
    finishing it within its --grace. Then the pool is stopped (SIGTERM) and that old one is
    killed by a signal of its own (the OOM killer's SIGKILL), its job left leased until the
    lease lapses. For a child that is not a reload's replaced one the pool exits 1 and names
    the signal (tests/test_pool_child_killed_at_stop.py; README: 1 crash). Here the supervisor
    drops the replaced process from `_retiring` without looking at how it ended
    (worker_pool_reload.py, `_reload`'s first loop): the pool exits 0, a clean stop, and
    logs nothing of the kill."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "120", log=pool_log)
    try:
        job, old = _reloaded_then_stopped(pool, client, q, pool_log)
        os.kill(old, signal.SIGKILL)
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    text = _text(pool_log)
    assert q.get_job(job).state == "leased"  # its lease lapses: run again, not lost
    assert code == EXIT_FAILED, f"exit {code}: " + text[-3000:]
    assert "SIGKILL" in text, text[-3000:]


# -- a reload as the pool starts, a stop as it reloads ---------------------------------------


def test_a_sighup_while_the_children_start_still_leaves_a_working_pool(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """A reload asked while the first children are still starting (not ready): the pool
    neither stops nor fails; it ends with two working children and stops cleanly."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log)
    try:
        wait_for(lambda: "worker process 2 started" in _text(pool_log), what="children forked")
        first = set(children(pool.pid))
        assert _text(pool_log).count("concurrency=16") < 2  # still starting
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload: replacing 2" in _text(pool_log), what="the reload begun")

        def replaced() -> bool:
            now = set(children(pool.pid))
            return len(now) == 2 and not now & first

        wait_for(replaced, timeout_s=60, what="both slots replaced")
        assert pool.poll() is None
        ids = [q.enqueue("echo", {"n": i}) for i in range(20)]
        wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=60, what="all done")
    finally:
        code = _end(pool)
    assert code == 0, _text(pool_log)[-3000:]


def test_a_stop_right_after_a_sighup_is_graceful_and_the_running_job_finishes(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path, tmp_path: Path
) -> None:
    """SIGHUP then SIGTERM at once (a reload cut short by a deploy's stop): the hangup is no
    signal of the count (README), so the SIGTERM is the first one: the running job finishes
    within --grace (done, one attempt) and the pool exits 0, not 130."""
    gate = tmp_path / "go"
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "60", log=pool_log)
    try:
        wait_started(pool_log, 2)
        job = q.enqueue("sync_sleep", {"s": 120, "until": str(gate)})
        wait_for(lambda: client.llen(f"{LEDGER}:{q.name}") == 1, what="the job running")
        holder = _holder(client, q)
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload: replacing" in _text(pool_log), what="the reload begun")
        pool.send_signal(signal.SIGTERM)
        wait_for(lambda: "stopping" in _text(pool_log), what="the stop begun")
        assert alive(holder)  # within its grace
        gate.touch()
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    text = _text(pool_log)
    assert code == 0, text[-3000:]
    assert "second signal" not in text, text[-3000:]
    got = q.get_job(job)
    assert got.state == "done" and got.attempts == 1, got
    assert children(pool.pid) == []


# -- refused at start, as one worker is ---------------------------------------------------------


def test_a_pool_whose_metrics_port_is_taken_exits_1_and_starts_no_child(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    """--metrics-port already bound by another program: one line and exit 1 (docs/cli.md's
    table), as for one worker, before any child starts (so no job is claimed)."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pool = spawn_pool(redis_url, q.name, "--processes", "2", "--metrics-port", str(port),
                          log=pool_log)  # fmt: skip
        try:
            code = pool.wait(60)
        finally:
            if pool.poll() is None:
                _end(pool)
    text = _text(pool_log)
    assert code == EXIT_FAILED, text[-3000:]
    assert f"cannot serve metrics on port {port}" in text, text[-3000:]
    assert "worker process 1 started" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_a_pool_over_its_max_memory_at_start_exits_2_not_a_restart_loop(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    """README: a --max-memory-mb the process is over before its first job is refused at start
    (exit 2), not met again by every replacement. In a pool each child is over it: the first
    start fails, the pool stops with the child's code 2 (not a restart every second)."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--max-memory-mb", "1",
                      log=pool_log)  # fmt: skip
    try:
        code = pool.wait(90)
    finally:
        if pool.poll() is None:
            _end(pool)
    text = _text(pool_log)
    assert code == 2, text[-3000:]
    assert "restarting in" not in text, text[-3000:]


def test_a_reloads_new_process_refused_for_good_stops_the_pool_with_5(
    module_server: RedisProcess, pool_log: Path
) -> None:
    """README: "a child that exits 5 at any time (an ACL permission removed mid-run, a password
    rotated: every child is the same Redis user) stops the others gracefully and the pool exits
    5 too". The password is rotated while the pool runs, then a deploy's reload (SIGHUP)
    starts a new process, which is refused (exit 5): the reload ends there, and the running
    children, refused at their next new connection, stop the pool with 5 (held)."""
    admin = module_server.client()
    user = "pr" + uuid.uuid4().hex[:6]
    app_role(admin, user)
    url = f"unix://{user}:{PASSWORD}@{module_server.socket}"
    pool = spawn_pool(url, "p5-" + uuid.uuid4().hex[:6], "--processes", "2", log=pool_log)
    try:
        wait_started(pool_log, 2)
        admin.execute_command("ACL", "SETUSER", user, "resetpass", ">rotated-" + PASSWORD)  # type: ignore[no-untyped-call]
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload ended" in _text(pool_log) or pool.poll() is not None,
                 timeout_s=60, what="the new process refused")  # fmt: skip
        try:
            code = pool.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        text = _text(pool_log)
        assert code == 5, f"exit {code}: " + text[-3000:]
    finally:
        _end(pool)
        admin.acl_deluser(user)


def test_a_pool_stop_past_the_grace_releases_the_running_jobs_with_their_attempt(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """SIGTERM to a pool whose children each run a job that outlives --grace: after the grace
    each job is released (state due, its attempt given back: README's shutdown order) rather
    than left leased until its lease lapses, and the pool exits 0."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--concurrency", "1", "--grace",
                      "1", "--lease-ms", "600000", log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: _text(pool_log).count("concurrency=1 ") == 2, what="two started")
        jobs = [q.enqueue("sleep", {"s": 3600}) for _ in range(2)]
        wait_for(lambda: all(q.status(j) == "leased" for j in jobs), what="both running")
        wait_for(lambda: client.llen(f"{LEDGER}:{q.name}") == 2, what="both started")
        assert len(set(ledger_pids(client, q))) == 2  # one in each child
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    assert code == 0, _text(pool_log)[-3000:]
    for j in jobs:
        got = q.get_job(j)
        assert got.state == "due" and got.attempts == 0, got


def _processes_of(queue: str) -> list[int]:
    """Live processes whose command line names `queue` (a pool's supervisor or child)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if queue.encode() in cmd and alive(int(entry)):
                out.append(int(entry))
    return out


@pytest.mark.parametrize("delay_s", [0.05, 0.4, 1.0, 2.0])
def test_a_stop_at_any_point_of_the_pools_start_exits_0_and_leaves_no_process(
    redis_url: str, q: Queue, pool_log: Path, delay_s: float
) -> None:
    """SIGTERM to the supervisor at a point of its start (its imports, the children forked,
    the children importing or connecting): exit 0 (README: a stop while starting), and no
    child is left running without its supervisor."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log)
    try:
        time.sleep(delay_s)  # the point of the start the stop comes at: not a synchronisation
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    wait_for(lambda: _processes_of(q.name) == [], what="no process of the pool left")
    assert code in (0, -signal.SIGTERM), _text(pool_log)[-3000:]


def test_a_second_signal_after_a_reload_kills_the_replaced_process_too(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """After a reload, a replaced process still finishing its job within --grace; then SIGTERM
    and a second one: every process of the pool is killed, the replaced one too (none keeps
    claiming without its supervisor), exit 130, and the job is left to its lease (not lost)."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "120", log=pool_log)
    try:
        job, old = _reloaded_then_stopped(pool, client, q, pool_log)
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    wait_for(lambda: not alive(old), what="the replaced process killed")
    assert code == 130, _text(pool_log)[-3000:]
    assert q.get_job(job).state == "leased"


# A registry whose import, while HUP_DIR/slow exists, says so (HUP_DIR/seen-<pid>) and waits
# (at most 120 s) for HUP_DIR/release: a reload's new process that is still starting.
SLOW_REGISTRY = """
import os, time
from tests.workers.basic import registry
d = os.environ['HUP_DIR']
if os.path.exists(os.path.join(d, 'slow')):
    open(os.path.join(d, 'seen-%d' % os.getpid()), 'w').close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(d, 'release')) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_a_reloads_new_process_killed_during_the_stop_makes_the_pool_exit_1(
    redis_url: str, q: Queue, pool_log: Path, tmp_path: Path
) -> None:
    """The same for a reload's new process, still starting when the pool is stopped and
    killed by a signal of its own before it could stop: a first-start child killed so makes
    the pool exit 1 (`_reap`: "killed by SIGKILL while stopping"); the reload's one is seen
    only by `_incoming_step` (worker_pool_reload.py), which records no exit: the pool exits
    0 and logs nothing of it."""
    (tmp_path / "slow_registry.py").write_text(SLOW_REGISTRY)
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log,
                      registry="slow_registry:registry", pythonpath=f"{tmp_path}:{ROOT}",
                      extra_env={"HUP_DIR": str(tmp_path)})  # fmt: skip
    try:
        wait_started(pool_log, 2)
        old = set(children(pool.pid))
        (tmp_path / "slow").touch()
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: any(p.name.startswith("seen-") for p in tmp_path.iterdir()),
                 what="the new process starting")  # fmt: skip
        (new,) = set(children(pool.pid)) - old
        os.kill(new, signal.SIGSTOP)  # it cannot act on the stop: killed before it does
        pool.send_signal(signal.SIGTERM)
        wait_for(lambda: children(pool.pid) == [new], timeout_s=60, what="the old ones stopped")
        os.kill(new, signal.SIGKILL)
        code = pool.wait(60)
    finally:
        if pool.poll() is None:
            _end(pool)
    text = _text(pool_log)
    assert code == EXIT_FAILED, f"exit {code}: " + text[-3000:]
    assert "SIGKILL" in text, text[-3000:]


def test_a_replaced_child_killed_at_the_stop_deadline_makes_the_pool_exit_1(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """docs/guide/workers.md: a process still running --grace + the lease + 50 s after it was
    asked to stop "(by the pool's stop or a reload)" is killed: "its leases lapse, and a
    stopping pool exits 1". A reload's replaced process frozen (SIGSTOP) while it holds a job,
    then the pool stopped: the supervisor kills it at the deadline (logged), but
    `killed_at_deadline` is read only by `_reap`, which never sees a replaced process: the
    pool exits 0."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "0", "--lease-ms",
                      "1000", "--heartbeat-ms", "300", log=pool_log)  # fmt: skip
    old = 0
    try:
        wait_for(lambda: _text(pool_log).count("started: queues") == 2, what="two started")
        job = q.enqueue("sleep", {"s": 3600})
        wait_for(lambda: client.llen(f"{LEDGER}:{q.name}") == 1, what="the job running")
        old = _holder(client, q)
        os.kill(old, signal.SIGSTOP)
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: _text(pool_log).count("started: queues") == 4, timeout_s=60,
                 what="both slots' new processes")  # fmt: skip
        wait_for(lambda: len(children(pool.pid)) == 3, timeout_s=60, what="the idle old gone")
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(stop_deadline_s(0, 1000) + 60)  # a hang guard only
    finally:
        if old and alive(old):
            os.kill(old, signal.SIGKILL)
        if pool.poll() is None:
            _end(pool)
    text = _text(pool_log)
    assert "did not stop within" in text, text[-3000:]
    assert q.get_job(job).state in ("leased", "due")  # not lost: its lease lapses
    assert code == EXIT_FAILED, f"exit {code}: " + text[-3000:]
