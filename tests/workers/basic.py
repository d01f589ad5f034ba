"""Registries the worker tests run in real worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import redis

from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect
from scheduler.worker.registry import JobContext, Registry

registry = Registry()
_client: redis.Redis | None = None
LEDGER = "test:ledger"  # queue-independent key: tests run on a private server


def r() -> redis.Redis:
    global _client
    if _client is None:
        _client = connect(os.environ["TEST_REDIS_URL"])  # a redis+cluster:// URL too
    return _client


def mark(ctx: JobContext, what: str) -> None:
    r().rpush(
        f"{LEDGER}:{ctx.queue}", f"{ctx.job_id}|{ctx.attempt}|{ctx.token}|{what}|{os.getpid()}"
    )


@registry.task(name="noop")
async def noop(payload: Any, ctx: JobContext) -> None:
    return None


@registry.task(name="echo")
def echo(payload: Any, ctx: JobContext) -> Any:
    mark(ctx, "start")
    return payload


@registry.task(name="sleep")
async def sleep(payload: Any, ctx: JobContext) -> str:
    mark(ctx, "start")
    try:
        await asyncio.sleep(payload["s"])
    except asyncio.CancelledError:
        mark(ctx, "cancelled:" + str(ctx.stop_reason))
        raise
    mark(ctx, "end")
    return "slept"


@registry.task(name="sync_sleep")
def sync_sleep(payload: Any, ctx: JobContext) -> str:
    """Sleeps payload['s'] seconds, or until the file payload['until'] exists (a test's gate:
    a fixed sleep raced a loaded machine's slower steps)."""
    mark(ctx, "start")
    deadline = time.monotonic() + payload["s"]
    gate = payload.get("until")
    while time.monotonic() < deadline and not (gate and os.path.exists(gate)):
        if ctx.should_stop():
            mark(ctx, "stopped:" + str(ctx.stop_reason))
            return "stopped"
        time.sleep(0.01)
    mark(ctx, "end")
    return "slept"


@registry.task(name="boom", backoff=Backoff(100, 2.0, 1000, 0.0), non_retryable=(KeyError,))
def boom(payload: Any, ctx: JobContext) -> None:
    mark(ctx, "start")
    if payload.get("fatal"):
        raise KeyError("fatal")
    raise RuntimeError("boom")


@registry.task(name="poison")
def poison(payload: Any, ctx: JobContext) -> None:
    mark(ctx, "start")
    os.kill(os.getpid(), signal.SIGKILL)
