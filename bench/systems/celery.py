"""Celery driver (Redis broker): ``task.delay``; ``celery -A systems.celery worker`` (prefork)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import common as c
import redis
from celery import Celery, group

CONCURRENCY = os.cpu_count() or 1  # celery's default: one prefork child per CPU


def broker_url(url: str) -> str:
    """kombu spells unix sockets ``redis+socket:///path``."""
    return "redis+socket://" + url.removeprefix("unix://") if url.startswith("unix://") else url


app = Celery("bench", broker=broker_url(os.environ.get(c.ENV_URL, "unix:///nonexistent")))
app.conf.update(
    task_default_queue=c.QUEUE,
    task_ignore_result=True,  # no result backend configured
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_R: redis.Redis | None = None


@app.task(name="bench.task")
def task(data: dict[str, Any]) -> None:
    global _R
    if _R is None:
        _R = c.client(c.env_url())
    c.handle_sync(_R, data)


def meta() -> dict[str, Any]:
    return {
        "version": version("celery"),
        "kombu": version("kombu"),
        "settings": {
            "enqueue": "task.delay(payload)",
            "bulk": "no batch API: group(task.s(...)).apply_async() (one publish per job)",
            "worker": f"celery -A systems.celery worker -P prefork -c {CONCURRENCY} "
            "(default prefetch multiplier 4)",
            "scheduler": "task.apply_async(args=..., eta=datetime)",
            "concurrency": CONCURRENCY,
            "results": "ignored (no backend)",
        },
    }


def enqueue_single(url: str, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        task.delay(c.payload(i))
    return time.perf_counter() - t0


def enqueue_bulk(url: str, n: int) -> float:
    t0 = time.perf_counter()
    group(task.s(c.payload(i)) for i in range(n)).apply_async()
    return time.perf_counter() - t0


def pending(url: str, n: int) -> None:
    group(task.s(c.payload(i)) for i in range(n)).apply_async()


def _cmd(concurrency: int | None) -> list[str]:
    return [
        c.bin_path("celery"),
        "-A",
        "systems.celery",
        "worker",
        "-P",
        "prefork",
        "-c",
        str(concurrency or CONCURRENCY),
        "-Q",
        c.QUEUE,
        "-l",
        "WARNING",
    ]


def drain(url: str, n: int, concurrency: int | None) -> float:
    pending(url, n)
    r = c.client(url)
    with c.running("celery-drain", _cmd(concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("celery-sched", _cmd(None), url) as proc:
        c.wait_ready(r, lambda: task.delay(c.payload(-1)) and None, proc, "celery-sched")
        due = c.due_in(delay_s)
        eta = datetime.fromtimestamp(due, tz=UTC)
        for i in range(n):
            task.apply_async(args=(c.payload(i, True),), eta=eta)
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
