"""`jobs show` on the spec-record layout: a lean finished job says its payload was dropped (not
'missing'), and a job without a time limit of its own reads "task's timeout_s, else none"
instead of '0ms'."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from tests.conftest import Clock

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], catch_exceptions=False)

    return run


def finished(q: Queue, **kw: object) -> str:
    job_id = q.enqueue("t", {"to": "x@example.org"}, **kw)  # type: ignore[arg-type]
    (job,) = q.claim("w", limit=1).jobs
    q.complete(job_id, job.token, {"sent": True})
    return job_id


def test_a_lean_finished_job_says_its_payload_was_dropped(cli: Run, q: Queue) -> None:
    job_id = finished(q)
    out = cli("jobs", "show", "--json", "-q", q.name, job_id)
    data = json.loads(out.stdout)
    assert data["payload_dropped"] is True and data["payload_error"] is None
    assert data["result"] == {"sent": True}
    human = cli("jobs", "show", "-q", q.name, job_id).stdout
    assert "dropped (finished" in human and "missing" not in human


def test_a_kept_payload_is_shown(cli: Run, q: Queue) -> None:
    job_id = finished(q, keep_payload=True)
    data = json.loads(cli("jobs", "show", "--json", "-q", q.name, job_id).stdout)
    assert data["payload_dropped"] is False and data["payload"] == {"to": "x@example.org"}


def test_no_time_limit_reads_task_default(cli: Run, q: Queue) -> None:
    plain, limited = q.enqueue("t", 1), q.enqueue("t", 2, timeout_ms=90_000)
    assert "task's timeout_s, else none" in cli("jobs", "show", "-q", q.name, plain).stdout
    human = cli("jobs", "show", "-q", q.name, limited).stdout
    assert "timeout_s, else none" not in human and "1m30s" in human


def test_lapses_are_shown(cli: Run, tq: tuple[Queue, Clock]) -> None:
    """A job whose lease lapsed twice (a suspect: docs/durability.md) says so; a hand-edited
    count reads as 0."""
    q, clock = tq
    clock.set_ms(1_000_000)
    job_id = q.enqueue("t", 1)
    for _ in range(2):
        q.claim("crashed", limit=1, lease_ms=1_000)
        clock.set_ms(int(q.client.get(q.keys.test_clock) or 0) + 1_001)
        q.claim("reaper", limit=0)
    data = json.loads(cli("jobs", "show", "--json", "-q", q.name, job_id).stdout)
    assert data["lapses"] == 2 and data["attempts"] == 2
    assert "lapses" in cli("jobs", "show", "-q", q.name, job_id).stdout
    q.client.hset(q.keys.job(job_id), "lapses", "nonsense")
    assert json.loads(cli("jobs", "show", "--json", "-q", q.name, job_id).stdout)["lapses"] == 0
