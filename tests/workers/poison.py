"""The poison-containment test's handlers: one job that SIGKILLs its own worker process on
every attempt, and innocent jobs that run a short while and succeed."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from scheduler.worker.registry import JobContext, Registry

registry = Registry()


@registry.task(name="poison")
async def poison(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(0.05)  # its batch-mates have started too
    os.kill(os.getpid(), signal.SIGKILL)


@registry.task(name="innocent")
async def innocent(payload: Any, ctx: JobContext) -> int:
    await asyncio.sleep(0.3)
    return ctx.attempt
