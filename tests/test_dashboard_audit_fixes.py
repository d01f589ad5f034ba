"""Findings of a browser audit of the dashboard: "Run now" posted for a job due already (a
stale page) sent it to the back of the line; a queue or job named '.' or '..' could not be
linked to; "more" showed on a last full page; "back" on a filtered page (an offset that is a
scan position) skipped matches; mounted under a prefix, the JSON endpoints answered errors in
HTML; and a link could make the page claim an action had been done."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from scheduler import JobSpec, Queue
from scheduler.core.errors import BadArgument
from scheduler.dashboard import Auth, create_app
from tests.redis_server import free_port
from tests.test_dashboard import csrf_of, make_client
from tests.test_dashboard_pause import post

HOUR_MS = 3_600_000


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def test_run_now_on_a_job_due_already_keeps_its_place(q: Queue, web: TestClient) -> None:
    first = q.enqueue("t", 0)
    q.enqueue_many([JobSpec("t", i) for i in range(1, 5)])
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    code, location = post(web, f"/queues/{q.name}/jobs/{first}/run-now", token)
    assert code == 303 and "notice=not-moved" in location and "state=due" in location
    assert "Nothing changed: the job is due." in web.get(location).text
    assert q.list_jobs("due", limit=1)[0].id == first  # still at the head of the line
    # A job due later still moves to now.
    later = q.enqueue("t", 9, delay_ms=HOUR_MS)
    code, location = post(web, f"/queues/{q.name}/jobs/{later}/run-now", token)
    assert "notice=moved-now" in location
    assert later in [j.id for j in q.list_jobs("due", limit=10)]


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_names_are_refused_for_queues_and_new_job_ids(
    client: redis.Redis, q: Queue, name: str
) -> None:
    with pytest.raises(BadArgument, match=re.escape("not '.' or '..'")):
        Queue(client, name)
    with pytest.raises(BadArgument, match="cannot be linked to"):
        q.enqueue("t", job_id=name)
    assert q.counts().due == 0


def test_more_shows_only_when_more_jobs_follow(q: Queue, web: TestClient) -> None:
    q.enqueue_many([JobSpec("t", i) for i in range(4)])
    for _ in range(4):
        (job,) = q.claim("w", limit=1).jobs
        q.fail(job.id, job.token, RuntimeError("x"), retryable=False)
    full_last = web.get(f"/queues/{q.name}?state=dead&limit=2&offset=2").text
    assert "more &rarr;" not in full_last
    assert "more &rarr;" in web.get(f"/queues/{q.name}?state=dead&limit=2").text
    for path in (f"/queues/{q.name}/dead?limit=2&offset=2", f"/queues/{q.name}/dead?limit=4"):
        assert "more &rarr;" not in web.get(path).text
    assert "more &rarr;" in web.get(f"/queues/{q.name}/dead?limit=2").text


def test_back_from_a_filtered_page_goes_to_the_first_page(q: Queue, web: TestClient) -> None:
    q.enqueue_many([JobSpec("a" if i % 2 else "b", i) for i in range(12)])
    page = web.get(f"/queues/{q.name}?state=due&task=a&limit=2&offset=4").text
    assert "first page" in page and "offset=0&amp;limit=2" in page
    plain = web.get(f"/queues/{q.name}?state=due&limit=2&offset=4").text
    assert "newer / earlier" in plain and "offset=2&amp;limit=2" in plain


def test_a_mounted_dashboards_json_errors_are_json(client: redis.Redis, q: Queue) -> None:
    outer = Starlette(
        routes=[Mount("/ops", app=create_app(client=client, queues=[q.name], auth=Auth()))]
    )
    with TestClient(outer) as web:
        r = web.get("/ops/queues/no-such-queue/api")
        assert r.status_code == 404 and r.headers["content-type"] == "application/json"
        assert web.get("/ops/queues/no-such-queue").headers["content-type"].startswith("text/html")
    # Redis down: the overview's JSON (the live refresh's) answers JSON under the prefix too.
    down = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2)
    outer = Starlette(
        routes=[Mount("/ops", app=create_app(client=down, queues=["x"], auth=Auth()))]
    )
    with TestClient(outer) as web:
        r = web.get("/ops/api/overview")
        assert r.status_code == 503 and r.headers["content-type"] == "application/json"
        assert r.json()["error"] == "Redis unreachable"


def test_a_notice_shows_only_with_the_acting_sessions_signature(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    forged = web.get(f"/queues/{q.name}/dead?notice=purged&n=5000").text
    assert "Purged 5000" not in forged
    q.enqueue("t")
    (job,) = q.claim("w", limit=1).jobs
    q.fail(job.id, job.token, RuntimeError("x"), retryable=False)
    token = csrf_of(web.get(f"/queues/{q.name}/dead").text)
    r = web.post(
        f"/queues/{q.name}/dead/apply",
        data={"csrf": token, "action": "purge", "scope": "selected", "ids": job.id},
        follow_redirects=False,
    )
    assert r.status_code == 303
    location = r.headers["location"]
    assert "Purged 1 dead job(s)." in web.get(location).text
    assert "Purged 5 dead" not in web.get(location.replace("n=1", "n=5")).text  # edited words
    with make_client(client, q) as other:  # another browser (session) following the link
        assert "Purged 1 dead job(s)." not in other.get(location).text
