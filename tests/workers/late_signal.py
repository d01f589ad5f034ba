"""A registry for tests/test_worker_late_signal.py: the worker's process held, after its
worker has stopped, where a test can signal it and then let it go on. TEST_HOLD_MARKER names
the file touched once it is held, TEST_HOLD_GO the file whose existence lets it go on.

- TEST_HOLD_AT=exit: an atexit hook (the interpreter's exit, after the command returned).
- TEST_HOLD_AT=loop: the job `linger` leaves a task behind whose cancellation (run_loop's end
  of the leftover tasks, before the loop's close) holds the loop."""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from pathlib import Path
from typing import Any

from scheduler.worker.registry import JobContext, Registry

registry = Registry()
_GUARD_S = 60.0  # a hang guard only: the test lets it go at once
_left: set[asyncio.Task[None]] = set()


def _hold() -> None:
    Path(os.environ["TEST_HOLD_MARKER"]).touch()
    go = Path(os.environ["TEST_HOLD_GO"])
    deadline = time.monotonic() + _GUARD_S
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


async def _lingerer() -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _hold()
        raise


@registry.task(name="linger")
async def linger(payload: Any, ctx: JobContext) -> None:
    if os.environ.get("TEST_HOLD_AT") == "loop":
        _left.add(asyncio.get_running_loop().create_task(_lingerer()))
    Path(os.environ["TEST_HOLD_RAN"]).touch()


if os.environ.get("TEST_HOLD_AT") == "exit":
    atexit.register(_hold)
