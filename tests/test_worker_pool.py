"""`scheduler worker --processes N` against a real Redis: the supervisor, its children, and what
happens when either dies (scheduler/cli/worker_pool.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.workers import live_workers
from scheduler.cli.main import main
from scheduler.cli.worker_pool_child import READY_FD_ENV
from scheduler.cli.worker_pool_proc import exit_code
from scheduler.cli.worker_pool_start import child_commands
from tests.fixtures.pools import SUPERVISORS
from tests.workers.basic import LEDGER
from tests.workers.procs import ROOT, SCHEDULER, wait_for

FAST_LEASE = ("--lease-ms", "1200", "--heartbeat-ms", "300")


def spawn_pool(
    url: str,
    queue: str,
    *args: str,
    log: Path,
    registry: str = "tests.workers.basic:registry",
    pythonpath: str = str(ROOT),
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """The supervisor, with the URL in the environment (as a pool passes it on)."""
    env = dict(os.environ, TEST_REDIS_URL=url, REDIS_URL=url, PYTHONPATH=pythonpath)
    env.update(extra_env or {})
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [SCHEDULER, "worker", registry, "--queue", queue, *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    SUPERVISORS.add(proc.pid)
    return proc


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (zombies, dead and unreaped, left out)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return sorted(out)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_started(log: Path, n: int = 2) -> None:
    """Until n worker processes of the pool logging to `log` have started (each logs its
    settings once running)."""
    wait_for(lambda: log.read_text(errors="replace").count("concurrency=16") == n,
             what=f"{n} worker processes started")  # fmt: skip


def ledger_pids(client: redis.Redis, q: Queue) -> list[int]:
    entries: list[str] = client.lrange(f"{LEDGER}:{q.name}", 0, -1)  # type: ignore[assignment]
    return [int(e.split("|")[4]) for e in entries]


def stop(pool: subprocess.Popen[bytes], log: Path) -> int:
    if pool.poll() is None:
        pool.send_signal(signal.SIGTERM)
    try:
        return pool.wait(30)
    except subprocess.TimeoutExpired:
        pool.kill()
        raise AssertionError(
            "pool did not stop: " + log.read_text(errors="replace")[-3000:]
        ) from None


def test_two_processes_share_the_work_and_stop_together(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--worker-id", "pw", "--batch", "5",
                      "--concurrency", "2", log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
        kids = children(pool.pid)
        # The URL never reaches a child's argv (`ps` shows it to every user).
        for pid in kids:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert redis_url not in cmdline and "--url" not in cmdline, cmdline
        # Both claiming before the jobs come (a CI at load ~15 once had one child still
        # starting while the other ran all 40): live, as `scheduler workers` lists them.
        wait_for(lambda: len(live_workers(client, q.keys)[0]) == 2, what="both workers live")
        ids = [q.enqueue("sync_sleep", {"s": 0.05}) for _ in range(40)]
        wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=60, what="all done")
        ran = set(ledger_pids(client, q))
        assert ran <= set(kids)
        assert ran == set(kids), f"only {ran} of {kids} ran jobs"
        live, _ = live_workers(client, q.keys)
        assert {(w.id, w.pid) for w in live} == {("pw.1", kids[0]), ("pw.2", kids[1])}
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-2000:]
    assert not any(alive(pid) for pid in kids)


def test_a_killed_child_is_restarted_and_its_job_still_completes(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", *FAST_LEASE, log=pool_log)
    try:
        wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
        before = children(pool.pid)
        job = q.enqueue("sleep", {"s": 1.0})
        wait_for(lambda: len(ledger_pids(client, q)) == 1, what="the job started")
        holder = ledger_pids(client, q)[0]
        assert holder in before
        os.kill(holder, signal.SIGKILL)  # mid-job
        wait_for(lambda: q.status(job) == "done", timeout_s=30, what="the job done elsewhere")
        wait_for(lambda: len(children(pool.pid)) == 2 and holder not in children(pool.pid),
                 timeout_s=15, what="the killed child replaced")  # fmt: skip
        assert pool.poll() is None
        assert q.get_job(job).attempts == 2
        log = pool_log.read_text()
        assert f"(pid {holder}) exited with code 137; restarting" in log, log[-2000:]
    finally:
        code = stop(pool, pool_log)
    assert code == 0


def test_first_start_failure_stops_the_pool_with_its_code(tmp_path: Path, pool_log: Path) -> None:
    missing = f"unix://{tmp_path}/no-such.sock"
    pool = spawn_pool(missing, "pq", "--processes", "3", log=pool_log)
    code = pool.wait(60)
    assert code == 3, pool_log.read_text()  # EXIT_UNREACHABLE, as one process would
    log = pool_log.read_text()
    assert "failed to start (exit 3): stopping the others" in log
    assert "restarting" not in log
    assert children(pool.pid) == []


def test_supervisor_killed_takes_its_children_with_it(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log)
    wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
    kids = children(pool.pid)
    wait_started(pool_log)
    pool.kill()
    pool.wait(10)
    # PR_SET_PDEATHSIG: each child gets SIGTERM and stops gracefully (no orphan claiming).
    wait_for(lambda: not any(alive(pid) for pid in kids), timeout_s=30, what="children gone")
    assert pool_log.read_text().count(" stopped") == 2, pool_log.read_text()


def test_second_signal_forces_the_children(redis_url: str, q: Queue, pool_log: Path) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "60", *FAST_LEASE,
                      log=pool_log)  # fmt: skip
    try:
        wait_started(pool_log)
        job = q.enqueue("sync_sleep", {"s": 30})
        wait_for(lambda: q.status(job) == "leased", what="the job running")
        pool.send_signal(signal.SIGTERM)
        wait_for(lambda: pool_log.read_text().count("stopping (grace") == 2, what="first signal")
        assert pool.poll() is None  # the grace period: the running job may finish
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(30) == 130
    finally:
        if pool.poll() is None:
            pool.kill()


def test_bad_settings_are_refused_and_a_bad_registry_fails_the_first_start(
    redis_url: str,
) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["worker", "tests.workers.basic:registry", "--url", redis_url,
                               "--processes", "2", "--worker-id", "x" * 199])  # fmt: skip
    assert res.exit_code == 2 and "invalid --worker-id" in res.output  # 'x...x.2' is 201 bytes
    # The supervisor imports none of the user's code: each child fails to (exit 4), so does the
    # pool, as one worker would.
    res = runner.invoke(main, ["worker", "no_such_module:registry", "--url", redis_url,
                               "--processes", "2"])  # fmt: skip
    assert res.exit_code == 4
    res = runner.invoke(main, ["worker", "tests.workers.basic:registry", "--processes", "-1"])
    assert res.exit_code == 2


def test_child_commands_pass_every_option_but_the_url() -> None:
    argv, env = child_commands(
        3, ["--queue", "a", "--queue", "b", "--json-logs"], url="redis://:pw@h:1/0",
        registry="m:r", metrics_port=9100, worker_id="w",
    )  # fmt: skip
    # The supervisor serves --metrics-port; each child a free loopback port it reports.
    assert [a[a.index("--metrics-port") + 1] for a in argv] == ["0", "0", "0"]
    assert [a[a.index("--worker-id") + 1] for a in argv] == ["w.1", "w.2", "w.3"]
    assert all("redis://:pw@h:1/0" not in " ".join(a) for a in argv)
    assert all(e["REDIS_URL"] == "redis://:pw@h:1/0" for e in env)
    assert argv[0][1:7] == ["-m", "scheduler", "worker", "m:r", "--queue", "a"]
    argv, _ = child_commands(2, [], url="u", registry="m:r", metrics_port=0, worker_id=None)
    assert [a[a.index("--metrics-port") + 1] for a in argv] == ["0", "0"]
    assert all("--worker-id" not in a for a in argv)
    argv, _ = child_commands(2, [], url="u", registry="m:r", metrics_port=None, worker_id=None)
    assert all("--metrics-port" not in a for a in argv)
    assert READY_FD_ENV not in env[0]
    assert (exit_code(-9), exit_code(3), exit_code(0)) == (137, 3, 0)


def test_a_stop_while_children_start_is_a_clean_stop(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log)
    wait_for(lambda: len(children(pool.pid)) == 2, what="two children")
    kids = children(pool.pid)
    pool.send_signal(signal.SIGTERM)  # most likely before a child handles signals
    assert pool.wait(30) == 0, pool_log.read_text()  # one signal: nothing more sent
    assert not any(alive(pid) for pid in kids)


def test_a_service_manager_signalling_every_process_still_gives_the_grace(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    """systemd's default KillMode (control-group) sends SIGTERM to the supervisor and to every
    child at once: a child must not take the supervisor's stop as a second signal."""
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "30", *FAST_LEASE,
                      log=pool_log)  # fmt: skip
    try:
        wait_started(pool_log)
        job = q.enqueue("sync_sleep", {"s": 2})
        wait_for(lambda: q.status(job) == "leased", what="the job running")
        for pid in [pool.pid, *children(pool.pid)]:
            os.kill(pid, signal.SIGTERM)
        code = pool.wait(30)  # one signal each: nothing more sent
        assert code == 0, f"exit {code}\n" + pool_log.read_text()[-3000:]
        assert q.status(job) == "done"  # finished within the grace
        assert "second signal" not in pool_log.read_text()
    finally:
        if pool.poll() is None:
            pool.kill()


def test_sighup_replaces_every_child_and_no_running_job_is_cut(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--grace", "30", *FAST_LEASE,
                      log=pool_log)  # fmt: skip
    try:
        wait_started(pool_log)
        old = children(pool.pid)
        job = q.enqueue("sync_sleep", {"s": 2})
        wait_for(lambda: q.status(job) == "leased", what="the job running")
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: len(children(pool.pid)) == 2 and not set(children(pool.pid)) & set(old),
                 timeout_s=40, what="both children replaced")  # fmt: skip
        wait_for(lambda: not any(alive(pid) for pid in old), timeout_s=30, what="old ones gone")
        assert q.status(job) == "done" and q.get_job(job).attempts == 1  # finished, not re-run
        assert pool_log.read_text().count("concurrency=16") == 4
        assert "second signal" not in pool_log.read_text() and pool.poll() is None
        after = q.enqueue("echo", {"n": 1})
        wait_for(lambda: q.status(after) == "done", what="the new ones working")
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-3000:]


def test_a_reload_whose_new_process_cannot_start_leaves_the_old_ones(
    redis_url: str, q: Queue, pool_log: Path, tmp_path: Path
) -> None:
    """A deploy that breaks the registry: the reload ends at the first new process, the old
    ones keep working."""
    flag = tmp_path / "broken"
    (tmp_path / "hup_registry.py").write_text(
        "import os\n"
        "from tests.workers.basic import registry\n"
        "if os.path.exists(os.environ['HUP_FLAG']):\n"
        "    raise ImportError('a broken deploy')\n"
    )
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log,
                      registry="hup_registry:registry", pythonpath=f"{tmp_path}:{ROOT}",
                      extra_env={"HUP_FLAG": str(flag)})  # fmt: skip
    try:
        wait_started(pool_log)
        old = children(pool.pid)
        flag.touch()
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload ended: the new worker process 1 failed to start (exit 4)"
                 in pool_log.read_text(), timeout_s=30, what="the reload refused")  # fmt: skip
        assert children(pool.pid) == old and pool.poll() is None
        job = q.enqueue("echo", {"n": 1})
        wait_for(lambda: q.status(job) == "done", what="the old ones still working")
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-3000:]


def test_a_stop_while_a_crashed_child_waits_for_its_restart_is_clean(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    pool = spawn_pool(redis_url, q.name, "--processes", "2", log=pool_log)
    try:
        wait_started(pool_log)
        os.kill(children(pool.pid)[0], signal.SIGKILL)
        wait_for(lambda: "exited with code 137; restarting" in pool_log.read_text(),
                 what="the crash seen")  # fmt: skip
        pool.send_signal(signal.SIGTERM)  # before the 1 s restart
        assert pool.wait(30) == 0, pool_log.read_text()[-3000:]  # the stop itself was clean
    finally:
        if pool.poll() is None:
            pool.kill()


def test_a_child_that_used_up_its_max_jobs_is_replaced_at_once(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """--max-jobs recycles a process: each child exits 0 after its job and the supervisor
    starts another, no sooner than 1 s after the last one's start, without the crash backoff
    (which doubled to 30 s: --max-jobs 1 ran a job per process per 30 s)."""
    ids = [q.enqueue("echo", i) for i in range(8)]
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--max-jobs", "1",
                      "--concurrency", "1", log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=90,
                 what="every job done")  # fmt: skip
        assert stop(pool, pool_log) == 0
    finally:
        if pool.poll() is None:
            pool.kill()
    text = pool_log.read_text(errors="replace")
    recycled = "stopped cleanly (--max-jobs/-memory-mb); starting another"
    assert text.count(recycled) >= 6, text[-3000:]
    assert "restarting in" not in text  # not taken for a crash
    pids = ledger_pids(client, q)
    assert len(pids) == 8 and len(set(pids)) == 8  # one job per process
