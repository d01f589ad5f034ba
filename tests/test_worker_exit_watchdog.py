"""After the worker has stopped (its exit code decided, its jobs finished or given back), the
rest of the exit cannot hold the process: a loop close that never returns, or a handler's
non-daemon thread that never ends, is cut after the watchdog's delay with the same exit code
(scheduler/cli/exit_watchdog.py); a caller that goes on after the worker returned (the CLI run
in-process) is left alone. Each case runs in a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.workers.procs import ROOT

_FORCED = "exiting now with code"


def _child(code: int, watchdog_s: float, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.workers.exit_hang", str(code), str(watchdog_s), how],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["close", "thread"])
def test_a_hung_exit_ends_with_the_workers_code(how: str) -> None:
    done = _child(7, 0.5, how)
    assert done.returncode == 7, done.stderr
    assert f"{_FORCED} 7" in done.stderr


def test_an_exit_that_does_not_hang_is_not_cut() -> None:
    done = _child(5, 20.0, "none")
    assert done.returncode == 5, done.stderr
    assert _FORCED not in done.stderr


def test_a_caller_that_goes_on_after_the_worker_is_left_alone() -> None:
    done = _child(7, 0.5, "inprocess")
    assert done.returncode == 0, done.stderr
    assert "went on" in done.stdout and _FORCED not in done.stderr
