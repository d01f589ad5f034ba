"""docs/guide/workers.md's "Making side effects idempotent" example runs as written against a
real Redis: a job run twice (a stalled worker's lease lapsed) has one welcome recorded, the
newest run's report, and the stale run's complete refused. And the README's own handler keys
its mailer on the job id, not on what changes with each claim."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler import Queue
from tests.conftest import delete_queue

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs/guide/workers.md"


def _example() -> str:
    section = GUIDE.read_text().split("## Making side effects idempotent", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block under '## Making side effects idempotent'"
    return match.group(1)


@pytest.fixture
def demo_queue(client: redis.Redis) -> Iterator[Queue]:
    queue = Queue(client, "idempotency-demo")
    delete_queue(client, queue)
    yield queue
    delete_queue(client, queue)


def test_the_idempotency_example_runs(
    redis_url: str, demo_queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    ns: dict[str, object] = {"__name__": "idempotency_example"}
    exec(compile(_example(), str(GUIDE), "exec"), ns)  # its own asserts check each step
    job = demo_queue.get_job(str(ns["job_id"]))
    assert job.state == "done" and job.result_json == '"sent"'
    assert job.attempts == 2  # it did run twice: once per claim


def test_the_readme_handler_deduplicates_on_the_job_id() -> None:
    readme = (ROOT / "README.md").read_text()
    keys = re.findall(r"idempotency_key=([^)\n]+)", readme)
    assert keys and all(k.strip() == "ctx.job_id" for k in keys), keys
