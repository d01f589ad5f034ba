"""A stop signal to a `scheduler worker` while it starts (before its worker's own handlers are
in place: the registry's import, the connect and checks): a clean exit 0 with a log line, not
the signal's default death (scheduler/cli/worker_signals.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import Queue
from tests.workers.procs import spawn_worker, stop_all, wait_for

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_while_the_registry_is_imported_exits_0_with_a_log_line(
    redis_url: str, q: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int
) -> None:
    """Before: SIGTERM killed the starting worker (exit -15, 143 in a shell: not in the table
    of exit codes), SIGHUP too (-1, 129), and SIGINT printed 'Aborted!' (exit 1, a crash to
    a supervisor). Now each is a stop: nothing was claimed yet, so the process exits 0 at once
    and says why."""
    marker = tmp_path / "importing"
    log = tmp_path / "worker.log"
    monkeypatch.setenv("TEST_IMPORT_MARKER", str(marker))
    worker = spawn_worker(redis_url, q.name, registry="tests.workers.slow_import:registry",
                          log=str(log))  # fmt: skip
    try:
        wait_for(marker.exists, what="the registry's import under way")
        worker.send_signal(sig)
        code = worker.wait(30)  # a hang guard only: the import sleeps 60 s
    finally:
        stop_all([worker])
    text = log.read_text(errors="replace")
    assert code == 0, text
    name = signal.Signals(sig).name
    assert f"stop asked ({name}) while the worker was starting" in text, text


def test_a_process_forked_while_starting_gets_the_defaults_back() -> None:
    """An import's helper forked meanwhile must not exit 0 on its own SIGTERM with the
    worker's words: the child of a fork has Python's defaults, the parent keeps the stop."""
    script = (
        "import os, signal\n"
        "from scheduler.cli.worker_signals import stop_while_starting\n"
        "stop_while_starting(False)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and "
        "signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "    os._exit(0 if ok else 9)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), signal.getsignal(signal.SIGTERM).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["0", "_exit_now"], out


def test_the_cli_run_in_process_leaves_the_signal_handlers_as_it_found_them() -> None:
    """click's CliRunner (an app calling the CLI) runs the worker command in its own process:
    a start that ends before the worker runs (here a usage error, exit 2) must not leave the
    start's handlers behind, which would end that process at its next SIGTERM or Ctrl-C with
    exit 0 and the worker's words."""
    from click.testing import CliRunner

    from scheduler.cli.main import main

    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = [signal.getsignal(s) for s in sigs]
    result = CliRunner().invoke(main, ["worker", "tests.workers.basic:registry", "-c", "0"])
    assert result.exit_code == 2, result.output
    assert [signal.getsignal(s) for s in sigs] == before
