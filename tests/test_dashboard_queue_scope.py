"""A dashboard started for some queues (`--queue`, create_app(queues=...)) serves those and
no other: another queue's pages, JSON and actions are refused (404) and change nothing, so a
dashboard given to one team cannot read or requeue another team's jobs by editing the URL.
Before, the list only chose what the overview showed. Starlette's TestClient, a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app
from tests.conftest import delete_queue, dump_queue
from tests.test_dashboard import csrf_of, dead_job


@pytest.fixture
def other(client: redis.Redis, queue_name: str) -> Iterator[Queue]:
    o = Queue(client, queue_name + "-other")
    yield o
    delete_queue(client, o)


def test_another_queues_pages_and_actions_are_refused(
    client: redis.Redis, q: Queue, other: Queue
) -> None:
    mine = q.enqueue("mail.send", {"n": 1})
    later = other.enqueue("mail.send", {"secret": "theirs"}, delay_ms=3_600_000)
    dead = dead_job(other, {"secret": "theirs"})
    other.schedule("nightly", "mail.send", every_ms=60_000)
    app = create_app(client=client, queues=[q.name], auth=Auth())
    with TestClient(app) as web:
        page = web.get(f"/queues/{q.name}/jobs/{mine}")
        assert page.status_code == 200
        token = csrf_of(page.text)
        before = dump_queue(client, other)
        o = f"/queues/{other.name}"
        for path in (o, f"{o}/api", f"{o}/jobs/{later}", f"{o}/dead"):
            r = web.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert "theirs" not in r.text
        posts = [
            f"{o}/jobs/{later}/cancel",
            f"{o}/jobs/{later}/run-now",
            f"{o}/jobs/{dead}/requeue",
            f"{o}/pause",
            f"{o}/resume",
            f"{o}/schedules/nightly/pause",
            f"{o}/dead/confirm",
            f"{o}/dead/apply",
        ]
        for path in posts:
            data = {"csrf": token, "do": "purge:selected", "ids": dead}
            r = web.post(path, data=data, follow_redirects=False)
            assert r.status_code == 404, (path, r.status_code, r.headers.get("location"))
        assert dump_queue(client, other) == before
        assert other.status(dead) == "dead" and other.get_schedule("nightly").paused is False
        # The queue it serves still acts.
        r = web.post(f"/queues/{q.name}/pause", data={"csrf": token}, follow_redirects=False)
        assert r.status_code == 303
        assert q.counts().paused


def test_a_partitioned_queue_in_the_list_is_served_with_its_partitions(
    client: redis.Redis, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=2)
    try:
        job_id = pq.enqueue("mail.send", None, delay_ms=3_600_000)
        pq.schedule("nightly", "mail.send", every_ms=60_000)
        app = create_app(client=client, queues=[queue_name], auth=Auth())
        with TestClient(app) as web:
            page = web.get(f"/queues/{queue_name}/jobs/{job_id}")
            assert page.status_code == 200
            token = csrf_of(page.text)
            part = pq.parts[pq.layout.partition_of_schedule("nightly")].name
            r = web.post(
                f"/queues/{part}/schedules/nightly/pause",
                data={"csrf": token},
                follow_redirects=False,
            )
            assert r.status_code == 303, r.text
            assert pq.get_schedule("nightly").paused is True
            # A partition-like name of a queue not in the list is still refused, and so is a
            # plain queue named like a partition of a listed queue it is not one of.
            lookalike = Queue(client, f"{queue_name}.p7")
            lookalike.enqueue("mail.send", None, job_id="own")
            for name in (f"{queue_name}x.p0", lookalike.name):
                r = web.post(
                    f"/queues/{name}/schedules/nightly/pause",
                    data={"csrf": token},
                    follow_redirects=False,
                )
                assert r.status_code == 404, name
            delete_queue(client, lookalike)
    finally:
        for each in pq.parts:
            delete_queue(client, each)
        client.delete(f"sched:{{{queue_name}}}:partitions")


def test_without_a_list_every_queue_is_served(client: redis.Redis, q: Queue, other: Queue) -> None:
    job_id = other.enqueue("mail.send", None, delay_ms=3_600_000)
    with TestClient(create_app(client=client, auth=Auth())) as web:
        assert web.get(f"/queues/{other.name}/jobs/{job_id}").status_code == 200
