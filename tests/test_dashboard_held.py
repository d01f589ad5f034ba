"""Held jobs (JobState.HELD: set aside by flow control, a key at its limit, a rate window, parents
not done; docs/flow-control.md) on the dashboard's lists and actions, plain and partitioned:
the held tab says why each one is held, the due tab says where the held ones are (the due
count includes them, its list does not), and a Requeue posted for a job that is not a dead
letter says so instead of "Requeued 0 dead job(s)". Real scripts on a private Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.ids import new_job_id
from scheduler.dashboard import Auth, create_app
from tests.conftest import dump_queue
from tests.fixtures.partitioned import MakePq
from tests.test_dashboard import csrf_of
from tests.test_dashboard_pause import post

HOUR_MS = 3_600_000


def hold(q: Queue | PartitionedQueue) -> tuple[str, str, str]:
    """(a job held by a key limit, a child held by its parent, the parent): two jobs of key
    tenant-7 (limit 1, in one partition), one claimed; a child `after` a parent an hour ahead."""

    def route() -> dict[str, Any]:  # a partitioned queue's key limit holds per partition
        return {"job_id": f"p0.{new_job_id()}"} if isinstance(q, PartitionedQueue) else {}

    a, b = (
        q.enqueue("sync", i, concurrency_key="tenant-7", concurrency_limit=1, **route())
        for i in range(2)
    )
    parts = q.parts if isinstance(q, PartitionedQueue) else [q]
    claimed = [j.id for p in parts for j in p.claim("w1", limit=5).jobs]
    assert claimed == [a]
    parent = q.enqueue("export", None, delay_ms=HOUR_MS, **route())
    child = q.enqueue("notify", None, after=[parent])
    assert q.status(b) == q.status(child) == "held"
    return b, child, parent


@pytest.fixture(params=["plain", "partitioned"])
def held(
    request: pytest.FixtureRequest, client: redis.Redis, q: Queue, make_pq: MakePq
) -> Iterator[tuple[TestClient, Queue | PartitionedQueue, tuple[str, str, str]]]:
    target: Queue | PartitionedQueue = q
    if request.param == "partitioned":
        target = make_pq(partitions=2, suffix="-p")
    jobs = hold(target)
    with TestClient(create_app(client=client, queues=[target.name], auth=Auth())) as web:
        yield web, target, jobs


def test_the_held_tab_says_why_each_job_is_held(
    held: tuple[TestClient, Queue | PartitionedQueue, tuple[str, str, str]],
) -> None:
    """The tab listed the held jobs with an empty worker column: why each waits took a click
    on every job."""
    web, q, (by_key, child, _) = held
    page = web.get(f"/queues/{q.name}?state=held").text
    assert "<th>held by</th>" in page
    assert by_key in page and child in page
    assert 'data-reason="limited-by-key"' in page and "limited by key tenant-7" in page
    assert 'data-reason="waiting-for-parents"' in page and "waiting for 1 parent job" in page


def test_the_due_tab_says_where_the_held_jobs_are(
    held: tuple[TestClient, Queue | PartitionedQueue, tuple[str, str, str]],
) -> None:
    """'2 due now' on the card and 'No due jobs here.' under it, nothing between."""
    web, q, _ = held
    page = web.get(f"/queues/{q.name}?state=due").text
    assert '<b data-live="due">2</b> due now' in page
    assert 'id="held-elsewhere"' in page
    assert f'href="/queues/{q.name}?state=held"' in page
    assert "2 held by flow control" in page
    leased = web.get(f"/queues/{q.name}?state=leased").text
    assert 'id="held-elsewhere"' not in leased  # only the due tab counts them


def test_requeue_of_a_held_job_says_it_is_not_a_dead_letter(
    client: redis.Redis,
    held: tuple[TestClient, Queue | PartitionedQueue, tuple[str, str, str]],
) -> None:
    """A stale page's (or a hand-made) Requeue of a held job said "Requeued 0 dead job(s).":
    now the notice names the job's state, and nothing changed."""
    web, q, (by_key, child, parent) = held
    parts = q.parts if isinstance(q, PartitionedQueue) else [q]
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    for job, state in [(by_key, "held"), (child, "held"), (parent, "scheduled")]:
        before = [dump_queue(client, p) for p in parts]
        code, location = post(web, f"/queues/{q.name}/jobs/{job}/requeue", token)
        assert code == 303 and "notice=not-requeued" in location, location
        shown = web.get(location).text
        assert f"Nothing requeued: the job is {state}, not a dead letter." in shown
        assert "Requeued 0" not in shown
        assert [dump_queue(client, p) for p in parts] == before
    code, location = post(web, f"/queues/{q.name}/jobs/{'x' * 16}/requeue", token)
    assert "Nothing requeued: the job is missing" in web.get(location).text
