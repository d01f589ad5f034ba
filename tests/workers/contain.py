"""Handlers that misbehave against their own worker process (tests/test_contained_handlers.py):
a helper process forked and terminated, stdout/stderr closed, an async def that never awaits."""

from __future__ import annotations

import multiprocessing
import sys
import time
from typing import Any

from scheduler.worker.registry import JobContext, Registry

registry = Registry()


@registry.task(name="fork_helper")
def fork_helper(payload: Any, ctx: JobContext) -> int | None:
    """Starts a helper by multiprocessing's "fork" and terminates it (SIGTERM to the helper)."""
    helper = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    helper.start()
    helper.terminate()
    helper.join(5)
    if helper.exitcode is None:  # it ignored SIGTERM: do not leave it behind
        helper.kill()
        helper.join(5)
        return None
    return helper.exitcode


@registry.task(name="close_stdio")
def close_stdio(payload: Any, ctx: JobContext) -> None:
    sys.stdout.close()
    sys.stderr.close()


@registry.task(name="noop")
def noop(payload: Any, ctx: JobContext) -> int:
    return 1


@registry.task(name="spin")
async def spin(payload: Any, ctx: JobContext) -> None:
    """Holds the event loop: never awaits."""
    deadline = time.monotonic() + payload["s"]
    while time.monotonic() < deadline:
        pass
