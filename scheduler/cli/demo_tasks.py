"""The demo's tasks: a registry module any worker runs as-is,
`scheduler worker scheduler.cli.demo_tasks:registry --url URL --queue demo`.

Each handler also notes its start in a ledger list the demo's timeline reads; only when the
demo says where (SCHEDULER_DEMO_URL, or REDIS_URL), so a worker started by hand with `--url`
never writes to some other default Redis."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import redis

from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect
from scheduler.worker.registry import JobContext, Registry
from scheduler.worker.retry_later import RetryLater

QUEUE = "demo"
LEDGER = "demo:ledger"
FLAKY_BACKOFF = Backoff(base_ms=1_000, factor=2.0, cap_ms=10_000, jitter=0.0)
RETRY_AFTER_MS = 2_000  # the webhook's remote says when to come back: longer than the backoff
registry = Registry()
_client: redis.Redis | None = None


def _note(ctx: JobContext, event: str) -> None:
    global _client
    url = os.environ.get("SCHEDULER_DEMO_URL") or os.environ.get("REDIS_URL")
    if url is None:
        return
    if _client is None:
        _client = connect(url)
    s, us = _client.time()
    _client.rpush(
        LEDGER,
        json.dumps(
            {
                "job": ctx.job_id,
                "attempt": ctx.attempt,
                "pid": os.getpid(),
                "event": event,
                "at_ms": s * 1000 + us // 1000,
            }
        ),
    )


@registry.task(name="demo.greet")
def greet(payload: Any, ctx: JobContext) -> str:
    _note(ctx, "start")
    return f"hello, {payload['name']}"


@registry.task(name="demo.charge", max_attempts=3, backoff=FLAKY_BACKOFF)
def charge(payload: Any, ctx: JobContext) -> None:
    _note(ctx, "start")
    raise ConnectionError("payment API unreachable")


@registry.task(name="demo.crashy")
def crashy(payload: Any, ctx: JobContext) -> str:
    _note(ctx, "start")
    if ctx.attempt == 1:  # the worker process dies mid-job: no result, no error, nothing
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived a crash"


@registry.task(name="demo.webhook", max_attempts=3, backoff=FLAKY_BACKOFF)
def webhook(payload: Any, ctx: JobContext) -> str:
    _note(ctx, "start")
    if ctx.attempt == 1:  # the remote said when to come back: that delay, not the backoff's
        raise RetryLater(
            RETRY_AFTER_MS, f"HTTP 429 Too Many Requests, Retry-After: {RETRY_AFTER_MS // 1000}"
        )
    return "delivered (HTTP 200)"
