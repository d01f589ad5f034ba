"""A stored payload is read by the worker as strictly as enqueue writes it: NaN, Infinity and a
number past a float's range (written into a job by hand) park the job as InvalidPayload; they
used to reach the handler (whose result then failed to encode), an audit found."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until

registry = Registry()
seen: list[Any] = []


@registry.task("strict.echo")
def echo(payload: Any, ctx: JobContext) -> str:
    seen.append(payload)
    return "ran"


@pytest.mark.parametrize("stored", ['{"x": NaN}', "[Infinity]", "[-Infinity]", "[1e999]"])
def test_a_payload_enqueue_would_refuse_is_parked_not_run(
    module_server: RedisProcess, stored: str
) -> None:
    raw = redis.Redis.from_url(module_server.url)
    q = Queue.from_url(module_server.url, "strict")
    bad = q.enqueue("strict.echo", {"x": 1})
    fine = q.enqueue("strict.echo", {"x": 2.5})
    raw.hset(q.keys.job(bad), "payload", stored)  # the hash's payload wins over the spec's

    seen.clear()
    run_until(module_server.url, registry, WorkerSettings(queues=("strict",), grace_s=0),
              lambda: q.status(bad) == "dead" and q.status(fine) == "done")  # fmt: skip
    job = q.get_job(bad)
    assert (job.state, job.fields.get("last_error_type")) == ("dead", "InvalidPayload")
    assert seen == [{"x": 2.5}]  # only the other job reached the handler
