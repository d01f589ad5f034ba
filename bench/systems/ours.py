"""Our driver: ``Queue.enqueue`` / ``Queue.enqueue_many``; ``scheduler worker`` (asyncio, one
process, claims in batches, async handler)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import common as c
import redis
import redis.asyncio as aredis

import scheduler
from scheduler import JobSpec, Queue
from scheduler.worker.registry import JobContext, Registry

registry = Registry()
_R: aredis.Redis | None = None
CONCURRENCY = 16
PROCESSES = 1  # systems/ours_2p.py sets 2: `scheduler worker --processes 2`


@registry.task(name="task")
async def task(data: dict[str, Any], ctx: JobContext) -> None:
    global _R
    if _R is None:
        # Same handler client as the Python peers': their redis-py 5.3.1 has no default
        # socket_timeout; the project's redis-py 8 has one, which on Python 3.11 makes every
        # send an asyncio.wait_for (a Task per command, ~8-11 us: docs/performance.md). So the
        # handler's client is built with socket_timeout=None, as theirs are.
        # BENCH_HANDLER_SOCKET_TIMEOUT=default measures redis-py 8's default instead.
        # redis-py 8 caps a pool at 100 connections, the peers' 5.3.1 at 2**31: at a worker
        # concurrency above 100 the handler's INCR raised MaxConnectionsError (the job failed
        # and was retried a second later), so the handler's pool is uncapped as theirs is.
        kw: dict[str, Any] = {"max_connections": 2**31}
        if not _default_timeout():
            kw["socket_timeout"] = None
        _R = aredis.Redis.from_url(c.env_url(), **kw)
    await c.handle_async(_R, data)


def _default_timeout() -> bool:
    return os.environ.get("BENCH_HANDLER_SOCKET_TIMEOUT") == "default"


def _queue(url: str) -> Queue:
    return Queue.from_url(url, c.QUEUE)


def meta() -> dict[str, Any]:
    return {
        "version": version("scheduler"),
        # Which source tree ran (PYTHONPATH may point the bench at a snapshot of a commit).
        "source": str(Path(scheduler.__file__).resolve().parent.parent),
        "settings": {
            "enqueue": "Queue.enqueue('task', payload)",
            "bulk": "Queue.enqueue_many([JobSpec...]) (one EVALSHA per 1000 jobs)",
            "worker": "scheduler worker systems.ours:registry --log-level WARNING "
            + (
                "(1 process, asyncio, claim batch 100)"
                if PROCESSES == 1
                else f"--processes {PROCESSES} (a supervisor and {PROCESSES} worker processes, "
                "each asyncio, claim batch 100, --concurrency each)"
            ),
            "scheduler": "enqueue(..., run_at=<datetime>)",
            "concurrency": CONCURRENCY,
            "handler client": f"redis.asyncio.Redis.from_url (redis-py {redis.__version__}, "
            + (
                "its default socket_timeout: BENCH_HANDLER_SOCKET_TIMEOUT=default)"
                if _default_timeout()
                else "socket_timeout=None, as the peers' redis-py 5.3.1 clients)"
            ),
        },
    }


def enqueue_single(url: str, n: int) -> float:
    q = _queue(url)
    t0 = time.perf_counter()
    for i in range(n):
        q.enqueue("task", c.payload(i))
    return time.perf_counter() - t0


def enqueue_bulk(url: str, n: int) -> float:
    q = _queue(url)
    t0 = time.perf_counter()
    q.enqueue_many([JobSpec("task", c.payload(i)) for i in range(n)])
    return time.perf_counter() - t0


def pending(url: str, n: int) -> None:
    _queue(url).enqueue_many([JobSpec("task", c.payload(i)) for i in range(n)])


def _worker_cmd(url: str, concurrency: int | None) -> list[str]:
    return [c.bin_path("scheduler"), "worker", "systems.ours:registry", "--url", url,
            "--queue", c.QUEUE, "--concurrency", str(concurrency or CONCURRENCY),
            "--log-level", "WARNING", "--processes", str(PROCESSES)]  # fmt: skip


def drain(url: str, n: int, concurrency: int | None) -> float:
    pending(url, n)
    r = c.client(url)
    with c.running("ours-drain", _worker_cmd(url, concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    q = _queue(url)
    r = c.client(url)
    with c.running("ours-sched", _worker_cmd(url, None), url) as proc:
        c.wait_ready(r, lambda: q.enqueue("task", c.payload(-1)), proc, "ours-sched")
        due = c.due_in(delay_s)
        when = datetime.fromtimestamp(due, tz=UTC)
        q.enqueue_many([JobSpec("task", c.payload(i, True), run_at=when) for i in range(n)])
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
