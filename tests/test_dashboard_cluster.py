"""The dashboard on a Redis Cluster and on partitioned queues: a partitioned logical queue is ONE
queue (merged counts, jobs, dead letters; its partitions are not listed as queues), a job is
found and acted on through the logical name, the health page reads every primary. Runs on one
server and, in `make test-cluster`, on a local 3-primary cluster."""

from __future__ import annotations

import re

import redis
from starlette.testclient import TestClient

from scheduler import JobSpec
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import is_cluster, primaries
from scheduler.dashboard import Auth, create_app
from tests.redis_server import is_cluster_run


def fill(pq: PartitionedQueue) -> tuple[list[str], list[str]]:
    """Six jobs over the three partitions, then one job of partitions 0 and 2 failed to dead:
    (the waiting ids, the dead ids)."""
    ids = pq.enqueue_many([JobSpec("mail.send", {"n": i}) for i in range(6)])
    dead = []
    for k in (0, 2):
        (job,) = pq.parts[k].claim("w-dash", limit=1).jobs
        pq.parts[k].fail(job.id, job.token, ("Boom", "boom", "Traceback: boom"), retryable=False)
        dead.append(job.id)
    return [i for i in ids if i not in dead], dead


def web(client: redis.Redis, queues: tuple[str, ...] = ()) -> TestClient:
    return TestClient(create_app(client=client, queues=queues, auth=Auth()))


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert m, "no CSRF field on the page"
    return m.group(1)


def test_a_partitioned_queue_is_one_row_of_the_overview(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    waiting, dead = fill(pq)
    with web(client) as t:  # discovery: SCAN of every primary
        rows = {r["queue"]: r for r in t.get("/api/overview").json()["queues"]}
        html = t.get("/").text
    assert pq.name in rows
    assert not [n for n in rows if n.startswith(pq.name + ".p")], "partitions listed as queues"
    row = rows[pq.name]
    assert (row["due"], row["dead"]) == (len(waiting), len(dead))
    assert row["partitions"] == list(pq.layout.names)
    assert "3 partitions" in html
    # fill()'s two claims recorded their start lateness in partitions 0 and 2: merged here.
    assert any(v is not None for v in row["late_max_ms"][-2:])


def test_queue_and_dead_pages_merge_the_partitions(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    waiting, dead = fill(pq)
    with web(client, (pq.name,)) as t:
        page = t.get(f"/queues/{pq.name}?state=due").text
        dead_page = t.get(f"/queues/{pq.name}/dead").text
        two = t.get(f"/queues/{pq.name}?state=due&limit=2").text
        filtered = t.get(f"/queues/{pq.name}/dead?task=mail.send").text
    assert all(i in page for i in waiting)
    assert all(i in dead_page for i in dead) and not any(i in dead_page for i in waiting)
    assert all(i in filtered for i in dead)
    assert sum(i in two for i in waiting) == 2  # a merged page of 2, oldest run_at first
    for name in pq.layout.names:
        assert f"/queues/{name}" in page  # each partition one click away


def test_a_job_is_shown_and_acted_on_through_the_logical_name(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    waiting, dead = fill(pq)
    on_last = next(i for i in waiting if i.startswith("p2."))
    with web(client, (pq.name,)) as t:
        page = t.get(f"/queues/{pq.name}/jobs/{on_last}")
        assert page.status_code == 200 and on_last in page.text
        token = csrf_of(t.get(f"/queues/{pq.name}/dead").text)
        r = t.post(
            f"/queues/{pq.name}/dead/apply",
            data={"csrf": token, "action": "requeue", "scope": "matching"},
            follow_redirects=False,
        )
        assert r.status_code == 303 and "n=2" in r.headers["location"]
        r = t.post(
            f"/queues/{pq.name}/jobs/{on_last}/cancel",
            data={"csrf": token},
            follow_redirects=False,
        )
        assert r.status_code == 303
    counts = pq.counts()
    assert counts.dead == 0 and counts.due == len(waiting) + len(dead) - 1
    assert pq.status(on_last) == "cancelled"


def test_health_reads_every_primary(client: redis.Redis, redis_url: str) -> None:
    with TestClient(create_app(url=redis_url, auth=Auth())) as t:
        app_client = t.app.store.client  # type: ignore[attr-defined]
        html = t.get("/health").text
    assert is_cluster(app_client) == is_cluster_run()  # the URL's cluster form is honoured
    nodes = primaries(client)
    assert html.count("redis_version") == len(nodes)
    if is_cluster_run():
        assert len(nodes) == 3
        for node in client.get_primaries():  # type: ignore[attr-defined]
            assert node.name in html


def test_a_job_written_into_a_partition_directly_is_still_found(
    client: redis.Redis, pq: PartitionedQueue
) -> None:
    job_id = next(f"own-{i}" for i in range(100) if pq.layout.partition_of_id(f"own-{i}") != 1)
    pq.parts[1].enqueue("mail.send", {}, job_id=job_id)  # not where the id routes
    with web(client, (pq.name,)) as t:
        listed = t.get(f"/queues/{pq.name}?state=due").text
        page = t.get(f"/queues/{pq.name}/jobs/{job_id}")
        deep = t.get(f"/queues/{pq.name}?state=due&offset=1990&limit=50")
    assert job_id in listed and page.status_code == 200 and "mail.send" in page.text
    assert deep.status_code == 400 and "one partition" in deep.text  # merged pages are capped
