"""The schedules page's "Run now" (Starlette's TestClient, a real private Redis):
Queue.run_schedule_now as a POST action like pause / resume / remove (CSRF token, Origin,
read-only), for an active or a paused schedule; the redirect leads to the new job's page with
a notice; a schedule gone meanwhile says so and writes nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app
from scheduler.dashboard.render import NOTICES
from tests.conftest import delete_queue, dump_queue
from tests.test_dashboard import csrf_of, make_client
from tests.test_dashboard_pause import post

HOUR_MS = 3_600_000
RAN = "Ran the schedule now: this job is its extra run, due now"


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with make_client(client, q) as t:
        yield t


def run_button(page: str, queue: str, name: str) -> bool:
    return f'action="/queues/{queue}/schedules/{name}/run"' in page and ">Run now</button>" in page


def run(web: TestClient, queue: str, name: str) -> tuple[int, str, str]:
    """(status, location, the page the redirect leads to) of a Run now from the schedules page."""
    token = csrf_of(web.get("/schedules").text)
    code, location = post(web, f"/queues/{queue}/schedules/{name}/run", token)
    return code, location, web.get(location).text if code == 303 else ""


@pytest.mark.parametrize("paused", [False, True])
def test_run_now_creates_a_job_due_now_and_leaves_the_schedule(
    client: redis.Redis, q: Queue, web: TestClient, paused: bool
) -> None:
    q.schedule("hourly", "mail.send", {"to": "ops"}, every_ms=HOUR_MS)
    if paused:
        q.pause_schedule("hourly")
    assert run_button(web.get("/schedules").text, q.name, "hourly")  # paused too
    before = q.get_schedule("hourly")
    code, location, shown = run(web, q.name, "hourly")
    m = re.fullmatch(rf"/queues/{q.name}/jobs/([^?]+)\?notice=ran-now&.*", location)
    assert code == 303 and m, location
    job_id = m.group(1)
    assert RAN in shown and job_id in shown  # the new job's page, saying what was done
    job = q.get_job(job_id)
    assert (job.state, job.task, job.fields["schedule"]) == ("due", "mail.send", "hourly")
    assert q.get_schedule("hourly") == before
    assert [j.id for j in q.claim("w").jobs] == [job_id]  # the schedule's own run is later


def test_without_a_valid_token_or_from_another_site_nothing_is_written(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    url = f"/queues/{q.name}/schedules/hourly/run"
    token = csrf_of(web.get("/schedules").text)
    before = dump_queue(client, q)
    assert post(web, url, None)[0] == 403
    assert post(web, url, "0" * 64)[0] == 403
    assert post(web, url, token, headers={"origin": "https://evil.example"})[0] == 403
    assert web.get(url).status_code == 405  # GET changes nothing
    assert dump_queue(client, q) == before


def test_a_schedule_removed_meanwhile_is_said_and_nothing_is_written(
    client: redis.Redis, q: Queue, web: TestClient
) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    token = csrf_of(web.get("/schedules").text)  # the page, with its button
    q.remove_schedule("hourly")
    before = dump_queue(client, q)
    code, location = post(web, f"/queues/{q.name}/schedules/hourly/run", token)
    assert code == 303 and location.startswith("/schedules?notice=no-schedule")
    assert NOTICES["no-schedule"] in web.get(location).text
    assert dump_queue(client, q) == before


def test_read_only_and_unreadable_show_no_button(client: redis.Redis, q: Queue) -> None:
    q.schedule("hourly", "mail.send", every_ms=HOUR_MS)
    q.schedule("edited", "mail.send", every_ms=HOUR_MS)
    client.hdel(q.keys.schedule("edited"), "task")  # the scripts cannot read it: no run
    with make_client(client, q) as web:
        page = web.get("/schedules").text
        assert run_button(page, q.name, "hourly") and not run_button(page, q.name, "edited")
    with make_client(client, q, read_only=True) as web:
        assert not run_button(web.get("/schedules").text, q.name, "hourly")
        token = csrf_of(web.get(f"/queues/{q.name}/dead").text)  # that page has a form
        before = dump_queue(client, q)
        r = web.post(f"/queues/{q.name}/schedules/hourly/run", data={"csrf": token})
        assert r.status_code == 403 and "read-only" in r.text
        assert dump_queue(client, q) == before


def test_a_partitioned_queues_run_is_tagged_with_its_partition(
    client: redis.Redis, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        pq.schedule("nightly", "report", every_ms=HOUR_MS)
        k = pq.layout.partition_of_schedule("nightly")
        part = pq.parts[k].name
        with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
            assert run_button(web.get("/schedules").text, part, "nightly")
            code, location, shown = run(web, part, "nightly")
            job_id = location.split("/jobs/", 1)[1].split("?", 1)[0]
            assert code == 303 and RAN in shown
            # Found from the logical queue too: its id names its partition.
            assert job_id.startswith(f"p{k}.") and pq.get_job(job_id).fields["schedule"]
            assert web.get(f"/queues/{pq.name}/jobs/{job_id}").status_code == 200
    finally:
        for p in pq.parts:
            delete_queue(client, p)
        client.delete(f"sched:{{{queue_name}}}:partitions")
