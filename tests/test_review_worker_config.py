"""Review: how a worker is configured, end to end: `WorkerSettings` (scheduler/worker/settings.py),
the `scheduler worker` command's flags and REDIS_URL (scheduler/cli/worker.py, worker_start.py),
and the embedded `Worker.run` (scheduler/worker/runtime.py). Each test asserts what the docs
(README "Workers", docs/guide/workers.md, docs/cli.md, docs/limits.md) or a production user
expect; an xfail names what the code does instead.

Real `scheduler worker` processes run against this module's private server (never the shared
one), each bounded by a timeout; the cluster case uses the cluster fixture."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.core import exits
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.worker import SettingsError, Worker, WorkerSettings
from tests.workers.procs import ROOT, SCHEDULER, spawn_worker, stop_all, wait_for

BASIC = "tests.workers.basic:registry"


def _run(
    url: str, registry: str, *args: str, cwd: Path = ROOT, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`scheduler worker REGISTRY --url URL ARGS` run to its exit; its own cwd is importable
    (load_registry), so a registry written to tmp_path is found there."""
    env = dict(os.environ, TEST_REDIS_URL=url.split("?")[0], PYTHONPATH=f"{cwd}:{ROOT}")
    env.pop("REDIS_URL", None)
    env.pop("SCHEDULER_QUEUE", None)
    return subprocess.run(
        [SCHEDULER, "worker", registry, "--url", url, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _in_thread(make: Callable[[], Awaitable[Any]], timeout_s: float = 30.0) -> Any:
    """asyncio.run(make()) in a thread of its own (an app's background thread): its result, or
    the exception it raised."""
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(asyncio.run(make()))  # type: ignore[arg-type]
        except BaseException as exc:  # the test reads it
            out.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "the embedded worker's thread did not end"
    return out[0]


def _registry() -> tuple[Registry, list[Any]]:
    reg, ran = Registry(), []

    @reg.task("cfg.t")
    async def t(payload: Any, ctx: Any) -> None:
        ran.append(payload)

    return reg, ran


# -- the registry ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body", ["sys.exit('DATABASE_URL is not set')", "sys.exit(0)"], ids=["message", "zero"]
)
def test_a_registry_that_exits_while_imported_is_exit_4(
    module_server: RedisProcess, private: redis.Redis, tmp_path: Path, body: str
) -> None:
    """README: the worker 'refuses to start when ... the registry cannot be imported' (exit 4),
    which docs/guide/workers.md's unit keeps from restarting (RestartPreventExitStatus=2 4 5).
    A tasks module that stops its import with sys.exit (a missing setting, an argparse call at
    import) is a registry that cannot be imported: exit 1 is restarted for ever, exit 0 is a
    worker that 'stopped cleanly' having never run, with nothing said."""
    (tmp_path / "exiting_tasks.py").write_text(f"import sys\n{body}\n")
    proc = _run(module_server.url, "exiting_tasks:registry", "-q", "cfg-exit", "--burst",
                cwd=tmp_path)  # fmt: skip
    assert proc.returncode == exits.EXIT_IMPORT, proc.stderr
    assert "exiting_tasks" in proc.stderr
    assert private.dbsize() == 0


def test_a_registry_with_no_task_is_refused_before_any_job_is_claimed(
    module_server: RedisProcess, private: redis.Redis, tmp_path: Path
) -> None:
    """`scheduler worker tasks:registry` where the tasks are registered in modules the registry's
    module never imports (the classic 'unregistered task' slip) starts a worker that knows no
    task at all: every job of the queue is claimed and failed (`UnknownTask: ... it knows no
    task`), parked after its last attempt. A registry with nothing in it cannot be what the
    operator meant: refused at start (4, as a registry not importable), no job touched."""
    (tmp_path / "no_tasks.py").write_text("from scheduler import Registry\nregistry = Registry()\n")
    q = Queue(private, "cfg-empty")
    job_id = q.enqueue("noop", 1)
    proc = _run(module_server.url, "no_tasks:registry", "-q", "cfg-empty", "--burst",
                cwd=tmp_path)  # fmt: skip
    job = q.get_job(job_id)
    assert (proc.returncode, job.state, job.attempts or 0) == (exits.EXIT_IMPORT, "due", 0), (
        proc.stderr[-2000:]
    )


# -- the start's refusals ----------------------------------------------------------------------
def test_the_strict_refusal_names_a_fix_for_the_server_it_checked(
    module_server: RedisProcess, private: redis.Redis
) -> None:
    """admin/redis_cli.py: the lines shown to operators are made to reach the checked server
    (the warnings' `redis-cli -s <socket> CONFIG SET ...`). The refusal's `error:` line, the one
    left with --log-level ERROR, says `redis-cli CONFIG SET appendonly yes`: pasted, it
    reconfigures whatever answers on localhost:6379, not the server the worker refused."""
    proc = _run(module_server.url, BASIC, "-q", "cfg-strict", "--strict", "--burst",
                "--log-level", "ERROR")  # fmt: skip
    assert proc.returncode == exits.EXIT_FAILED, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "redis-cli" in line  # the persistence-off finding's fix
    assert f"redis-cli -s {module_server.socket} CONFIG SET appendonly yes" in line, line


def test_a_database_the_server_does_not_have_is_bad_settings_not_a_crash(
    module_server: RedisProcess, private: redis.Redis
) -> None:
    """`unix:///...?db=99` on a server of 16 databases: SELECT is refused on every connection,
    for good. The worker says `Redis refused the start: ResponseError: DB index is out of range
    (run scheduler doctor)` and exits 1, which systemd's Restart=on-failure retries for ever and
    doctor (same URL) cannot check. It is the URL that is wrong: exit 2, no doctor hint."""
    proc = _run(module_server.url + "?db=99", BASIC, "-q", "cfg-db", "--burst")
    assert proc.returncode == exits.EXIT_USAGE, proc.stderr
    assert "doctor" not in proc.stderr, proc.stderr


def test_a_plain_url_of_a_cluster_node_is_named_as_the_wrong_url_form(
    cluster_url: str, rc: Any
) -> None:
    """docs/cluster.md: a cluster is `redis+cluster://...` or `?cluster=1`. Given a plain
    `redis://node/0` of a cluster's primary, with a queue whose slot another primary serves, the
    start's first read is redirected (MOVED) and the worker exits 1 ('crash') telling the
    operator to run doctor. A restart cannot help and doctor says nothing of the URL: exit 2,
    naming the cluster URL form."""
    node = rc.get_primaries()[0]
    name = next(
        f"cfg-moved-{i}"
        for i in range(1000)
        if rc.get_node_from_key(QueueKeys(f"cfg-moved-{i}").due).name != node.name
    )
    proc = _run(f"redis://{node.host}:{node.port}/0", BASIC, "-q", name, "--burst")
    assert proc.returncode == exits.EXIT_USAGE, proc.stderr
    assert "redis+cluster://" in proc.stderr and "doctor" not in proc.stderr, proc.stderr


# -- URL options the worker cannot run with --------------------------------------------------
def test_a_url_pool_too_small_for_the_worker_is_refused_not_left_to_lapse_its_leases(
    module_server: RedisProcess, private: redis.Redis
) -> None:
    """docs/cluster.md lists `max_connections` (>= 1) among the URL options; the worker starts
    with one, logs `redis error during heartbeat: MaxConnectionsError` for every beat, and a job
    that runs a little over a lease is stopped as expired and parked (max_attempts=1) while the
    worker exits 0. Either the worker runs with it (the job done on its one attempt) or it
    refuses it at start (exit 2, naming the option, the job untouched)."""
    q = Queue(private, "cfg-pool")
    job_id = q.enqueue("sleep", {"s": 1.5}, max_attempts=1)
    proc = _run(module_server.url + "?max_connections=1", BASIC, "-q", "cfg-pool", "--burst",
                "--lease-ms", "900", "--heartbeat-ms", "300")  # fmt: skip
    state = str(q.status(job_id))
    if proc.returncode == exits.EXIT_USAGE:
        assert "max_connections" in proc.stderr and state == "due", proc.stderr
    else:
        assert (proc.returncode, state) == (exits.EXIT_OK, "done"), proc.stderr[-3000:]


def test_a_short_url_socket_timeout_does_not_turn_the_idle_wait_into_redis_errors(
    module_server: RedisProcess, private: redis.Redis, tmp_path: Path
) -> None:
    """docs/cluster.md: `socket_timeout` is any seconds > 0, and one REDIS_URL serves the app and
    the worker. An idle worker's wake-up pop blocks 1 s (settings._WAKE_BLOCK_S) on a connection
    read with that timeout: at 0.5 s each pop is a TimeoutError, logged as a Redis error,
    counted in scheduler_redis_errors_total (an alert's metric) and backed off, so wake-ups
    are late. The pop must fit the URL's timeout (or the start refuse it)."""
    log = tmp_path / "worker.log"
    w = spawn_worker(module_server.url + "?socket_timeout=0.5", "cfg-idle", log=str(log))
    try:
        wait_for(lambda: "started: queues=" in log.read_text() or w.poll() is not None,
                 30, "the worker's start")  # fmt: skip
        if w.poll() is not None:  # refused at start: fine, if it says why
            assert w.returncode == exits.EXIT_USAGE and "socket_timeout" in log.read_text()
            return

        def pops() -> int:
            return int(private.info("commandstats").get("cmdstat_blpop", {}).get("calls", 0))

        wait_for(lambda: pops() >= 3, 30, "three wake-up pops")  # two have ended meanwhile
        text = log.read_text()
    finally:
        stop_all([w])
    assert "during wake" not in text, text[-2000:]


# -- the embedded worker -----------------------------------------------------------------------
def test_an_embedded_worker_in_a_thread_runs_or_names_install_signals(
    module_server: RedisProcess, private: redis.Redis
) -> None:
    """An app that runs its worker on a background thread's loop and forgets
    `install_signals=False` (README: the embedded form passes it) gets asyncio's
    `RuntimeError: set_wakeup_fd only works in main thread of the main interpreter` out of
    `run()`. Either the worker runs there (no signals: the thread cannot have them) or the
    refusal is a BadArgument that names install_signals=False."""
    reg, _ = _registry()

    async def body() -> Any:
        async with AsyncQueue.from_url(module_server.url, "cfg-thread") as q:
            w = Worker(q.client, reg, WorkerSettings(queues=("cfg-thread",), burst=True))
            return await asyncio.wait_for(w.run(), 20)

    outcome = _in_thread(body)
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, BadArgument), repr(outcome)
        assert "install_signals" in str(outcome)
    else:
        assert outcome == exits.EXIT_OK


def test_a_refused_embedded_run_leaves_the_apps_loop_as_it_found_it(
    module_server: RedisProcess, private: redis.Redis
) -> None:
    """README: 'run() routes asyncio's own error reports to the worker's log only on a loop that
    has no exception handler ... an app's handler stays in charge', and no loop outlives run().
    When run() fails at its start (here: signals on a non-main thread), the app's loop keeps the
    worker's `_on_loop_exception` for good: every later asyncio report of the app goes to the
    worker's log, and a handler the app sets afterwards is compared against a stale one."""
    reg, _ = _registry()

    async def body() -> Any:
        async with AsyncQueue.from_url(module_server.url, "cfg-thread2") as q:
            w = Worker(q.client, reg, WorkerSettings(queues=("cfg-thread2",), burst=True))
            with contextlib.suppress(Exception):  # the refusal itself: the test above
                await asyncio.wait_for(w.run(), 20)
            return asyncio.get_running_loop().get_exception_handler()

    assert _in_thread(body) is None


def test_a_second_run_of_an_embedded_worker_runs_or_is_refused(
    module_server: RedisProcess, private: redis.Redis
) -> None:
    """An app that drains a queue now and then with one burst Worker (or restarts its worker
    after run() returned) calls run() again: it returns 0, the exit code of a clean stop, and
    the job enqueued meanwhile is still due. Either it runs that job or it says a Worker runs
    once (a typed error)."""
    reg, ran = _registry()

    async def body() -> Any:
        async with AsyncQueue.from_url(module_server.url, "cfg-twice") as q:
            w = Worker(q.client, reg, WorkerSettings(queues=("cfg-twice",), burst=True))
            await q.enqueue("cfg.t", 1)
            first = await asyncio.wait_for(w.run(install_signals=False), 20)
            job_id = await q.enqueue("cfg.t", 2)
            try:
                second: Any = await asyncio.wait_for(w.run(install_signals=False), 20)
            except BadArgument as exc:
                second = exc
            return first, second, str(await q.status(job_id))

    first, second, state = _in_thread(body)
    assert first == exits.EXIT_OK and ran[:1] == [1]
    if isinstance(second, BadArgument):
        assert state == "due"
    else:
        assert (second, state, ran) == (exits.EXIT_OK, "done", [1, 2])


# -- WorkerSettings.check() --------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"grace_s": 10**400}, id="grace too large an int"),
        pytest.param({"queues": ("no spaces",)}, id="invalid queue name"),
    ],
)
def test_every_refusal_of_worker_settings_is_a_settings_error(kwargs: dict[str, Any]) -> None:
    """WorkerSettings.check(): 'Raise SettingsError (a BadArgument) on values the worker must not
    start with'. An app that builds its settings from its own config and catches SettingsError
    around Worker(...) gets an OverflowError out of a grace of 10**400 (the CLI's FLOAT reads it
    as inf and refuses it), and a plain BadArgument for a bad queue name."""
    with pytest.raises(SettingsError):
        WorkerSettings(**kwargs).check()
