"""A registry for tests/test_pool_stop_signal.py: a handler that changes its pool child's
handling of the supervisor's stop signal (SIGUSR1), then waits for the test's go."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from scheduler.core.connection import connect_async
from scheduler.worker.registry import JobContext, Registry

registry = Registry()


@registry.task(name="change_stop_signal")
async def change_stop_signal(payload: Any, ctx: JobContext) -> str:
    """payload: 'ignore' (SIG_IGN) or 'remove' (the loop's handler removed: the default,
    which ends the process). Then three of the worker's signal checks go by, the key
    `<job>:changed` is set, and the handler runs until the key `<job>:go` exists."""
    if payload == "ignore":
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    else:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
    await asyncio.sleep(1.5)
    client = connect_async(os.environ["TEST_REDIS_URL"])
    try:
        await client.set(f"{ctx.job_id}:changed", os.getpid())
        while not await client.exists(f"{ctx.job_id}:go"):
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()
    return "done"
