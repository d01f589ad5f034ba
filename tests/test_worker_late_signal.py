"""A stop signal after the worker has stopped (its run returned, its exit code decided) and
before the process ends: noted, never the signal's default death (143 for SIGTERM) nor a
KeyboardInterrupt; the process exits with the code its stop decided
(scheduler/cli/worker_signals.py). The registry tests/workers/late_signal.py holds the process
there until the test lets it go, so the signal lands in the window every time."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import Queue
from tests.workers.procs import spawn_worker, stop_all, wait_for

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

NOTE = "after the worker stopped"


@pytest.mark.parametrize("at", ["loop", "exit"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_after_the_worker_stopped_keeps_its_exit_code(
    redis_url: str,
    q: Queue,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    at: str,
    sig: int,
) -> None:
    """Before: SIGTERM there ended the process with -15 (143 in a shell: a code outside the
    table, where the stop had decided 0), SIGHUP at the interpreter's exit with -1, SIGINT
    raised KeyboardInterrupt into whatever ran. loop: the loop's end of a leftover task (after
    the worker's handlers were removed); exit: an atexit hook (after the command returned)."""
    held, go, ran = tmp_path / "held", tmp_path / "go", tmp_path / "ran"
    for name, path in (("MARKER", held), ("GO", go), ("RAN", ran)):
        monkeypatch.setenv(f"TEST_HOLD_{name}", str(path))
    monkeypatch.setenv("TEST_HOLD_AT", at)
    log = tmp_path / "worker.log"
    q.enqueue("linger", None)
    worker = spawn_worker(redis_url, q.name, registry="tests.workers.late_signal:registry",
                          log=str(log))  # fmt: skip
    try:
        wait_for(ran.exists, what="the job ran")
        worker.send_signal(signal.SIGTERM)  # the stop: exit 0 decided
        wait_for(lambda: held.exists() or worker.poll() is not None, what="held after the stop")
        assert held.exists(), log.read_text(errors="replace")
        worker.send_signal(sig)
        wait_for(
            lambda: worker.poll() is not None or NOTE in log.read_text(errors="replace"),
            what="the late signal handled",
        )
        go.touch()
        code = worker.wait(30)  # a hang guard only
    finally:
        go.touch()
        stop_all([worker])
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert f"stop asked ({signal.Signals(sig).name}) {NOTE}" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_the_cli_run_in_process_after_a_worker_ran_leaves_the_handlers_as_it_found_them(
    redis_url: str, q: Queue
) -> None:
    """click's CliRunner (an app calling the CLI) runs a worker to its end (--burst): its
    process's handlers are as they were afterwards, not the ones that note a late signal
    (which would leave that process deaf to its next SIGTERM)."""
    from click.testing import CliRunner

    from scheduler.cli.main import main

    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = [signal.getsignal(s) for s in sigs]
    args = ["worker", "tests.workers.basic:registry", "--url", redis_url, "-q", q.name, "--burst"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert [signal.getsignal(s) for s in sigs] == before


def test_a_fork_after_the_worker_stopped_gets_the_defaults_back() -> None:
    """A process forked on the way out (an atexit hook's helper) must not inherit the handler
    that notes a late signal: its SIGTERM is its default."""
    script = (
        "import os, signal\n"
        "from scheduler.cli import worker_signals\n"
        "worker_signals.stop_while_starting(False)\n"
        "worker_signals.command_ended()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and "
        "signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "    os._exit(0 if ok else 9)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), signal.getsignal(signal.SIGTERM).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["0", "_late"], out
