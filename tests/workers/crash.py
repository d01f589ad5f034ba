"""The crash test's handler: per (job, attempt) it SIGKILLs its own process, blocks the whole
worker past its lease, raises, or succeeds; every start goes to a ledger with the server time."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from typing import Any

import redis

from scheduler.core.backoff import Backoff
from scheduler.worker.registry import JobContext, Registry

registry = Registry()
LEASE_MS = 1_000
_client: redis.Redis | None = None
_LOG = """redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. redis.call('TIME')[1] * 1000 +
  math.floor(redis.call('TIME')[2] / 1000)) return 1"""


def fate(job_id: str, attempt: int) -> str:
    n = int(hashlib.sha256(f"{job_id}:{attempt}".encode()).hexdigest()[:8], 16) % 1000
    if n < 12:
        return "kill"
    if n < 30:
        return "stall"
    if n < 150:
        return "raise"
    return "ok"


@registry.task(name="crash", max_attempts=4, backoff=Backoff(200, 2.0, 2_000, 0.5))
async def crash(payload: Any, ctx: JobContext) -> int:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], decode_responses=True)
    _client.eval(_LOG, 1, os.environ["CRASH_LEDGER"],
                 f"{ctx.job_id}|{ctx.attempt}|{ctx.token}|{ctx.run_at_ms}")  # fmt: skip
    what = fate(ctx.job_id, ctx.attempt)
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "stall":  # blocks the event loop: no heartbeat, every lease of this worker lapses
        time.sleep(LEASE_MS * 1.6 / 1000)
    if what == "raise":
        raise RuntimeError("handler failed")
    await asyncio.sleep(0.001)
    return ctx.fence
