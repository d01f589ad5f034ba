"""Start real worker processes for tests, and poll for conditions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")


def spawn_worker(url: str, queue: str, *args: str, registry: str = "tests.workers.basic:registry",
                 log: str | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    env = dict(os.environ, TEST_REDIS_URL=url, PYTHONPATH=str(ROOT))
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            [SCHEDULER, "worker", registry, "--url", url, "--queue", queue, "--json-logs", *args],
            cwd=ROOT, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        if log and not isinstance(out, int):
            out.close()


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
