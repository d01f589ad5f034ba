"""A registry for the remote stop tests (tests/test_worker_remote_stop.py): a job that runs
until the test sets a key, so "still running" and "ended" are the test's to decide."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.worker.registry import JobContext, Registry
from tests.workers.basic import mark, r

registry = Registry()


@registry.task(name="hold")
async def hold(payload: Any, ctx: JobContext) -> str:
    """Runs until the key payload["until"] exists (checked every 20 ms)."""
    mark(ctx, "start")
    try:
        while not r().exists(payload["until"]):
            await asyncio.sleep(0.02)
    except asyncio.CancelledError:
        mark(ctx, "cancelled:" + str(ctx.stop_reason))
        raise
    mark(ctx, "end")
    return "held"
