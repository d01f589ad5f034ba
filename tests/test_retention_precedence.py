"""Retention precedence, job > task > worker > 1 h, and the keep_payload task default: what a
finished job keeps, and for how long, when a real worker completes it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import BadArgument, Queue
from scheduler.worker import WorkerSettings
from scheduler.worker.registry import Registry
from tests.embedded_worker import worker_thread
from tests.workers.procs import wait_for

registry = Registry()


# TTLs far apart and long enough that a slow worker stop on a loaded machine cannot expire them.
@registry.task("brief", result_ttl_ms=45_000)
def brief(payload: Any, ctx: Any) -> str:
    return "ok"


@registry.task("kept", keep_payload=True)
def kept(payload: Any, ctx: Any) -> str:
    return "ok"


def run_all(redis_url: str, q: Queue, ids: list[str]) -> None:
    """One worker with --result-ttl-ms 300000 runs every job to done."""
    settings = WorkerSettings(queues=(q.name,), result_ttl_ms=300_000)
    with worker_thread(redis_url, registry, settings):
        wait_for(lambda: all(q.status(j) == "done" for j in ids), what="all done")


def test_the_jobs_own_retention_wins_over_the_task_and_the_worker(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    own = brief.enqueue(q, {}, result_ttl_ms=900_000)
    task_default = brief.enqueue(q, {})
    run_all(redis_url, q, [own, task_default])
    assert 300_000 < client.pttl(q.keys.job(own)) <= 900_000  # not 45 s (task), not 300 s (worker)
    assert 0 < client.pttl(q.keys.job(task_default)) <= 45_000


def test_a_task_may_keep_its_payloads_and_a_job_may_say_no(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    keep = kept.enqueue(q, {"a": 1})
    drop = kept.enqueue(q, {"a": 2}, keep_payload=False)
    run_all(redis_url, q, [keep, drop])
    assert q.get_job(keep).payload() == {"a": 1}
    assert q.get_job(drop).payload_dropped


def test_the_task_default_is_checked_at_registration() -> None:
    r = Registry()
    with pytest.raises(BadArgument, match="keep_payload"):
        r.task("t", keep_payload="yes")  # type: ignore[arg-type]
    assert r.names() == []
