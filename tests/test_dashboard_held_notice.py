"""The notice after a Run now of a held job (set aside by flow control): it said "it runs when
released", but a released job goes back at its own run time (lua/lib/flow.lua puts it into
due at that score), so a held job whose run time is later still waits for that time after
the release. The notice now says both; this shows both on real scripts (a private Redis)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard.render import NOTICES
from tests.test_dashboard import make_client
from tests.test_dashboard_run_now import run_now

HOUR_MS = 3_600_000
LATER = "or at its own run time if that is later"


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def test_a_held_job_due_later_waits_for_its_time_after_release(q: Queue, web: TestClient) -> None:
    parent = q.enqueue("export", None)
    child = q.enqueue("notify", None, after=[parent], delay_ms=HOUR_MS)
    assert q.status(child) == "held"
    code, location, shown = run_now(web, q.name, child)
    assert code == 303 and "notice=not-moved-held" in location
    assert "flow control holds the job" in shown and LATER in shown
    (job,) = q.claim("w").jobs
    assert job.id == parent
    q.complete(parent, job.token)  # the child released ...
    assert q.status(child) == "scheduled"  # ... and still an hour ahead: not run at release
    assert q.claim("w").jobs == []


def test_a_held_job_already_due_runs_when_released(q: Queue, web: TestClient) -> None:
    a, b = (q.enqueue("sync", i, concurrency_key="k", concurrency_limit=1) for i in range(2))
    (first,) = q.claim("w", limit=5).jobs
    assert first.id == a and q.status(b) == "held"
    code, location, shown = run_now(web, q.name, b)
    assert code == 303 and "notice=not-moved-held" in location and LATER in shown
    q.complete(a, first.token)  # the key's room back: b runs at once
    assert [j.id for j in q.claim("w").jobs] == [b]


def test_the_notice_names_both_cases() -> None:
    text = NOTICES["not-moved-held"]
    assert "when released" in text and LATER in text
