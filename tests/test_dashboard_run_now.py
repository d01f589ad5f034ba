"""The job page's "Run now" (Starlette's TestClient, a real private Redis): Queue.reschedule to
now, a POST action like the others (CSRF token, Origin, read-only); shown only for a job
waiting for a future time; the notice says what the call answered, never what was pressed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Backoff, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.render import NOTICES
from tests.conftest import dump_queue
from tests.fixtures.partitioned import delete_partitioned
from tests.test_dashboard import csrf_of, make_client
from tests.test_dashboard_pause import post

HOUR_MS = 3_600_000
MOVED = "a worker takes it at its next claim"


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def run_now(web: TestClient, queue: str, job_id: str) -> tuple[int, str, str]:
    """(status, location, the page the redirect leads to) of a Run now with a valid token."""
    page = f"/queues/{queue}/jobs/{job_id}"
    token = csrf_of(web.get(f"/queues/{queue}/dead").text)  # that page always has a form
    code, location = post(web, page + "/run-now", token)
    return code, location, web.get(location).text if code == 303 else ""


def test_a_scheduled_job_runs_now(q: Queue, web: TestClient) -> None:
    job = q.enqueue("mail.send", {"to": "a"}, delay_ms=HOUR_MS)
    page = web.get(f"/queues/{q.name}/jobs/{job}").text
    assert 'id="run-now"' in page
    assert q.claim("w").jobs == []  # an hour ahead: nothing to claim yet
    code, location, shown = run_now(web, q.name, job)
    assert (code, location.split("?")[0]) == (303, f"/queues/{q.name}/jobs/{job}")
    assert "notice=moved-now" in location and MOVED in shown
    assert 'id="run-now"' not in shown  # due now: nothing left to move
    assert [j.id for j in q.claim("w").jobs] == [job]


@pytest.mark.parametrize("state", ["leased", "done"])
def test_a_job_that_is_not_waiting_is_not_moved_and_the_page_says_why(
    client: redis.Redis, q: Queue, web: TestClient, state: str
) -> None:
    job = q.enqueue("mail.send", None)
    (claimed,) = q.claim("w").jobs
    if state == "done":
        q.complete(job, claimed.token)
    page = web.get(f"/queues/{q.name}/jobs/{job}").text
    assert 'id="run-now"' not in page
    before = dump_queue(client, q)
    code, location, shown = run_now(web, q.name, job)  # a stale page's button, say
    assert code == 303 and "notice=not-moved" in location and f"state={state}" in location
    assert f"Nothing changed: the job is {state}." in shown and MOVED not in shown
    assert dump_queue(client, q) == before
    if state == "leased":
        _, held = q.heartbeat([(job, claimed.token)], lease_ms=30_000)
        assert held == {job: "held"}  # the lease still stands


def test_a_schedule_run_keeps_its_time(client: redis.Redis, q: Queue, web: TestClient) -> None:
    q.schedule("nightly", "report.build", every_ms=HOUR_MS)
    occurrence = q.get_schedule("nightly").pending
    assert occurrence
    page = web.get(f"/queues/{q.name}/jobs/{occurrence}").text
    assert "not found" not in page.lower() and 'id="run-now"' not in page
    before = dump_queue(client, q)
    code, location, shown = run_now(web, q.name, occurrence)
    assert code == 303 and "notice=not-moved-schedule" in location
    assert "keeps its schedule" in shown
    assert dump_queue(client, q) == before


def test_a_schedule_run_now_job_waiting_out_a_retry_runs_now(q: Queue, web: TestClient) -> None:
    """run_schedule_now's job is one of its own (docs/guide/schedules.md): its retry moves."""
    hour = Backoff(base_ms=HOUR_MS, factor=1.0, cap_ms=HOUR_MS, jitter=0.0)
    q.schedule("nightly", "report.build", every_ms=HOUR_MS, backoff=hour)
    extra = q.run_schedule_now("nightly")
    (job,) = q.claim("w").jobs
    assert job.id == extra and q.fail(extra, job.token, ("Bug", "fixed", "")).status == "retry"
    assert 'id="run-now"' in web.get(f"/queues/{q.name}/jobs/{extra}").text
    code, location, shown = run_now(web, q.name, extra)
    assert code == 303 and "notice=moved-now" in location and MOVED in shown
    assert [j.id for j in q.claim("w").jobs] == [extra]


def test_without_a_valid_token_or_from_another_site_nothing_moves(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    job = q.enqueue("mail.send", None, delay_ms=HOUR_MS)
    url = f"/queues/{q.name}/jobs/{job}/run-now"
    token = csrf_of(web.get(f"/queues/{q.name}/jobs/{job}").text)
    before = dump_queue(client, q)
    assert post(web, url, None)[0] == 403
    assert post(web, url, "0" * 64)[0] == 403
    assert post(web, url, token, headers={"origin": "https://evil.example"})[0] == 403
    assert dump_queue(client, q) == before
    assert q.claim("w").jobs == []


def test_read_only_shows_no_button_and_refuses_the_post(client: redis.Redis, q: Queue) -> None:
    job = q.enqueue("mail.send", None, delay_ms=HOUR_MS)
    with make_client(client, q, read_only=True) as web:
        page = web.get(f"/queues/{q.name}/jobs/{job}").text
        assert "read-only" in page and 'id="run-now"' not in page and "/run-now" not in page
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)  # that page has a form
        before = dump_queue(client, q)
        r = web.post(f"/queues/{q.name}/jobs/{job}/run-now", data={"csrf": token})
        assert r.status_code == 403 and "read-only" in r.text
        assert dump_queue(client, q) == before


def test_a_partitioned_queues_job_is_moved_in_its_partition(
    client: redis.Redis, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        jobs = [pq.enqueue("mail.send", {"i": i}, delay_ms=HOUR_MS) for i in range(3)]
        with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
            code, location, shown = run_now(web, pq.name, jobs[1])
        assert code == 303 and "notice=moved-now" in location and MOVED in shown
        claimed = [j.id for p in pq.parts for j in p.claim("w").jobs]
        assert claimed == [jobs[1]]  # that one only, from the partition holding it
    finally:
        delete_partitioned(client, pq)


def test_every_answer_of_reschedule_has_a_notice() -> None:
    from scheduler.dashboard.actions import RUN_NOW_NOTICES

    assert set(RUN_NOW_NOTICES) == {
        "rescheduled", "held", "schedule", "due", "leased", "done", "dead", "cancelled",
        "moving",  # a queue move's job (ReschedulingOps._moving)
    }  # fmt: skip
    assert all(notice in NOTICES for notice in RUN_NOW_NOTICES.values())
