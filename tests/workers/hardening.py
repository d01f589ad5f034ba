"""Handlers for tests/test_worker_hardening.py: a gate a test opens, a sync handler that ignores
its timeout, and in-process counters of live runs."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from typing import Any, ClassVar

import redis

from scheduler.core.backoff import Backoff
from scheduler.worker.registry import JobContext, Registry

registry = Registry()
LEDGER = "test:hardening"
_client: redis.Redis | None = None


def r() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], decode_responses=True)
    return _client


def gate_key(job_id: str) -> str:
    return f"test:gate:{job_id}"


def _wait_gate(ctx: JobContext) -> None:
    r().rpush(f"{LEDGER}:{ctx.queue}", f"{ctx.job_id}|{ctx.attempt}|start")
    deadline = time.monotonic() + 30
    while not r().exists(gate_key(ctx.job_id)) and time.monotonic() < deadline:
        time.sleep(0.01)


@registry.task(name="gate", max_attempts=1)
def gate(payload: Any, ctx: JobContext) -> str:
    _wait_gate(ctx)
    return "ok"


@registry.task(name="gate_fail", max_attempts=1)
def gate_fail(payload: Any, ctx: JobContext) -> None:
    _wait_gate(ctx)
    raise RuntimeError("failed on purpose")


@registry.task(name="nap")
async def nap(payload: Any, ctx: JobContext) -> str:
    r().rpush(f"{LEDGER}:{ctx.queue}", f"{ctx.job_id}|{ctx.attempt}|start")
    await asyncio.sleep(payload["s"])
    return "ok"


@registry.task(name="noop")
async def noop(payload: Any, ctx: JobContext) -> None:
    return None


class Live:
    """Live runs of `stubborn` in this process (the in-process thread-cap test reads it)."""

    lock = threading.Lock()
    now = 0
    peak = 0
    starts = 0
    by_job: ClassVar[Counter[str]] = Counter()
    overlaps: ClassVar[list[str]] = []

    @classmethod
    def reset(cls) -> None:
        with cls.lock:
            cls.now = cls.peak = cls.starts = 0
            cls.by_job.clear()
            cls.overlaps.clear()


@registry.task(name="stubborn", max_attempts=100, timeout_s=0.05,
               backoff=Backoff(10, 1.0, 10, 0.0))  # fmt: skip
def stubborn(payload: Any, ctx: JobContext) -> None:
    """Times out at once and keeps running (ignores ctx.stopped)."""
    with Live.lock:
        Live.now += 1
        Live.starts += 1
        Live.peak = max(Live.peak, Live.now)
        Live.by_job[ctx.job_id] += 1
        if Live.by_job[ctx.job_id] > 1:
            Live.overlaps.append(ctx.job_id)
    try:
        time.sleep(payload["s"])
    finally:
        with Live.lock:
            Live.now -= 1
            Live.by_job[ctx.job_id] -= 1
