"""Start real worker processes for tests, and poll for conditions."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")

# Every worker log of the running test: conftest shows their tails when the test fails, so a
# timeout in CI says what the worker was doing (a worker's output used to go to /dev/null).
SPAWNED_LOGS: list[str] = []
_TEMP_LOGS: set[str] = set()  # those spawn_worker made (deleted after the test)


def spawn_worker(url: str, queue: str, *args: str, registry: str = "tests.workers.basic:registry",
                 log: str | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    env = dict(os.environ, TEST_REDIS_URL=url, PYTHONPATH=str(ROOT))
    if log is None:
        fd, log = tempfile.mkstemp(prefix="worker-", suffix=".log")
        os.close(fd)
        _TEMP_LOGS.add(log)
    SPAWNED_LOGS.append(log)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [SCHEDULER, "worker", registry, "--url", url, "--queue", queue, "--json-logs", *args],
            cwd=ROOT, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def run_worker(url: str, queue: str, *args: str, registry: str = "tests.workers.basic:registry",
               timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """A worker run to its exit, its output captured: for one that refuses to start (one that
    starts runs until timeout_s, then subprocess.TimeoutExpired)."""
    env = dict(os.environ, TEST_REDIS_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [SCHEDULER, "worker", registry, "--url", url, "--queue", queue, *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env,
    )  # fmt: skip


def log_tails(lines: int = 40) -> str:
    """The last lines of each worker log of the running test, for a failure report."""
    parts = []
    for path in SPAWNED_LOGS:
        try:
            text = Path(path).read_text(errors="replace").splitlines()[-lines:]
        except OSError as e:
            text = [f"(unreadable: {e})"]
        parts.append(f"--- {path}\n" + "\n".join(text))
    return "\n".join(parts)


def forget_logs() -> None:
    """Drop the running test's worker logs; the temporary ones are deleted."""
    for path in _TEMP_LOGS:
        Path(path).unlink(missing_ok=True)
    _TEMP_LOGS.clear()
    SPAWNED_LOGS.clear()


def wait_for(pred: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(10)
