"""A stored payload is read by the worker as strictly as enqueue writes it: NaN, Infinity and a
number past a float's range (written into a job by hand) park the job as InvalidPayload; they
used to reach the handler (whose result then failed to encode), an audit found. So does a lone
surrogate escape ("\\ud800", which Python's json.dumps of a str enqueue refuses writes, and
another client may): it reached the handler as a str no UTF-8 write accepts."""

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


@pytest.mark.parametrize(
    "stored",
    ['{"x": NaN}', "[Infinity]", "[-Infinity]", "[1e999]", '["a\\ud800"]', '{"x": "\\uDC00b"}'],
)
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


def test_escaped_text_that_is_valid_unicode_still_reaches_the_handler(
    module_server: RedisProcess,
) -> None:
    # A surrogate pair (json.dumps' default escapes an emoji so), and a backslash before "ud800"
    # (text, not an escape), are valid: only a lone surrogate is refused.
    raw = redis.Redis.from_url(module_server.url)
    q = Queue.from_url(module_server.url, "strict-ok")
    job = q.enqueue("strict.echo", {"x": 1})
    raw.hset(q.keys.job(job), "payload", '["\\ud83d\\ude00", "\\\\ud800"]')

    seen.clear()
    run_until(module_server.url, registry, WorkerSettings(queues=("strict-ok",), grace_s=0),
              lambda: q.status(job) in ("done", "dead"))  # fmt: skip
    assert q.status(job) == "done"
    assert seen == [["\U0001f600", "\\ud800"]]
