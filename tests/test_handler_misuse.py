"""Handlers that misuse their worker's process, from an audit of contained failure (each test
failed before its fix): one that changed the worker's SIGTERM handling left a worker SIGTERM
could not stop (or killed it without its shutdown); a process it forked and did not end with
os._exit ran the worker's own loops on the parent's connections (the parent hung) or lingered
in its thread pool; `loop.stop()` crashed the worker (exit 1, no shutdown); a stdout of its
own turned a clean stop's exit 0 into 120. Real `scheduler worker` processes (uvloop)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import Queue
from scheduler.core.exits import EXIT_FAILED
from scheduler.worker import EXIT_OK
from tests.workers.procs import spawn_worker, stop_all, wait_for

REG = "tests.workers.misuse:registry"


def _run_among_others(q: Queue, w: subprocess.Popen[bytes], task: str, payload: object) -> str:
    """Runs one `task` job, then others; asserts they all ran and the worker lives on."""
    wait_for(lambda: q.client.zcard(q.keys.workers) == 1, timeout_s=30, what="the worker up")
    job = q.enqueue(task, payload, max_attempts=1)
    wait_for(lambda: q.get_job(job).state in ("done", "dead"), timeout_s=20, what="the job")
    later = [q.enqueue("noop") for _ in range(5)]
    wait_for(lambda: all(q.get_job(i).state == "done" for i in later), 20, "the later jobs")
    assert w.poll() is None, "the worker stopped"
    return job


def _stops_on_sigterm(w: subprocess.Popen[bytes], log: Path) -> None:
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=20) == EXIT_OK
    assert "signal 15: stopping" in log.read_text()


@pytest.mark.parametrize("how", ["ignore", "loop_handler", "loop_remove"])
def test_a_handler_that_changes_the_signal_handling_leaves_sigterm_to_the_worker(
    redis_url: str, q: Queue, tmp_path: Path, how: str
) -> None:
    """Before: SIG_IGN or a loop handler of its own: SIGTERM did nothing (only SIGKILL ended
    the worker, its leases left to lapse); the loop's handler removed: SIGTERM killed it (-15)
    with no shutdown. Now the worker's own are put back within signal_guard.CHECK_S."""
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, q.name, "--grace", "5", registry=REG, log=str(log))
    try:
        job = _run_among_others(q, w, "change_signals", how)
        assert q.get_job(job).state == "done"
        wait_for(lambda: "handling: restored" in log.read_text(), 10, "the handlers restored")
        _stops_on_sigterm(w, log)
    finally:
        stop_all([w])


@pytest.mark.parametrize("task", ["fork_async", "fork_sync"])
def test_a_forked_child_that_comes_back_to_the_worker_exits(
    redis_url: str, q: Queue, tmp_path: Path, task: str
) -> None:
    """The handler forks; its child does not end with os._exit. Before, async: the child ran
    the worker's loops on the parent's connections (the parent waited for it for good, the
    later jobs never ran, SIGTERM hung); sync: it lingered in the thread pool (30 s). Now it
    exits at once, code 1 (the parent's handler returns its wait status)."""
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, q.name, "--grace", "5", registry=REG, log=str(log))
    try:
        job = _run_among_others(q, w, task, None)
        got = q.get_job(job)
        assert got.state == "done", got.fields
        assert got.result_json == str(EXIT_FAILED << 8)  # a wait status: exit code 1
        assert "forked by a handler" in log.read_text()
        _stops_on_sigterm(w, log)
    finally:
        stop_all([w])


def test_a_handler_that_stops_the_event_loop_leaves_the_worker_running(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """Before: "Event loop stopped before Future completed", exit 1, no shutdown."""
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, q.name, "--grace", "5", registry=REG, log=str(log))
    try:
        _run_among_others(q, w, "stop_loop", None)
        assert "the event loop was stopped" in log.read_text()
        _stops_on_sigterm(w, log)
    finally:
        stop_all([w])


def test_a_handler_that_replaces_stdout_leaves_a_clean_exit_code(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    """A stream whose write and flush fail put in sys.stdout / sys.stderr: before, the
    interpreter's flush at exit failed and a clean stop exited 120."""
    log = tmp_path / "w.log"
    w = spawn_worker(redis_url, q.name, "--grace", "5", registry=REG, log=str(log))
    try:
        _run_among_others(q, w, "replace_stdio", None)
        _stops_on_sigterm(w, log)
    finally:
        stop_all([w])


_ASYNCIO_LOOP = """
import asyncio, os, signal
from scheduler.worker import signals

got = []

async def main():
    loop = asyncio.get_running_loop()
    signals.install(loop, got.append)
    loop.add_signal_handler(signal.SIGTERM, lambda: None)  # as a handler could
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    await asyncio.sleep(1.5)  # three checks (signal_guard.CHECK_S)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.sleep(0.5)
    signals.remove(loop)
    print(sorted(got))

asyncio.run(main())
"""


def test_the_signal_handlers_are_put_back_on_asyncios_own_loop() -> None:
    """The CLI runs on uvloop; asyncio's loop keeps its handlers apart (same no-op function
    for every add_signal_handler): both are checked."""
    out = subprocess.run(
        [sys.executable, "-c", _ASYNCIO_LOOP],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == str(sorted([signal.SIGINT, signal.SIGTERM]))
    assert "restored" in out.stderr


def test_a_worker_built_before_a_fork_runs_sync_jobs_in_the_child(redis_url: str, q: Queue) -> None:
    """The fork guard compares each handler thread's process with its own start's, not with
    the process that built the worker: a Worker made, then forked (a preloading app server),
    ran its first sync job and exited as 'forked by a handler'."""
    import asyncio
    import multiprocessing

    from scheduler import Registry
    from scheduler.core.connection import connect_async
    from scheduler.worker import Worker, WorkerSettings

    registry = Registry()

    @registry.task("plain.sync")
    def plain(payload: object, ctx: object) -> str:
        return "ran"

    job = q.enqueue("plain.sync")
    worker = Worker(connect_async(redis_url), registry,
                    WorkerSettings(queues=(q.name,), burst=True))  # fmt: skip

    def child() -> None:
        raise SystemExit(asyncio.run(worker.run(install_signals=False)))

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert q.get_job(job).state == "done"
