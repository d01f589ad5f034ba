"""Handlers that misuse their worker's process (tests/test_handler_misuse.py): they change its
signal handling, fork and come back, stop its event loop, replace its stdout."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from scheduler.worker.registry import JobContext, Registry

registry = Registry()


@registry.task(name="noop")
async def noop(payload: Any, ctx: JobContext) -> int:
    return 1


@registry.task(name="change_signals")
async def change_signals(payload: Any, ctx: JobContext) -> None:
    loop = asyncio.get_running_loop()
    if payload == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif payload == "loop_handler":
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
    else:  # "loop_remove": SIGTERM back to its default (the process dies of it)
        loop.remove_signal_handler(signal.SIGTERM)


@registry.task(name="fork_async")
async def fork_async(payload: Any, ctx: JobContext) -> int:
    """Forks and forgets os._exit in the child, which awaits on and returns: the parent waits
    for it and returns its exit status."""
    pid = os.fork()
    if pid == 0:
        await asyncio.sleep(0.1)
        return 0
    loop = asyncio.get_running_loop()
    _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
    return status


@registry.task(name="fork_sync")
def fork_sync(payload: Any, ctx: JobContext) -> int:
    pid = os.fork()
    if pid == 0:
        return 0  # the child returns into the worker's thread pool
    return os.waitpid(pid, 0)[1]


@registry.task(name="stop_loop")
async def stop_loop(payload: Any, ctx: JobContext) -> None:
    asyncio.get_running_loop().stop()


class _Broken:
    def write(self, text: str) -> int:
        raise OSError("broken stream")

    def flush(self) -> None:
        raise OSError("broken stream")


@registry.task(name="replace_stdio")
def replace_stdio(payload: Any, ctx: JobContext) -> None:
    sys.stdout = _Broken()
    sys.stderr = _Broken()
