"""The dashboard says why a due job held by flow control is not running (docs/flow-control.md):
the job page shows the key limit, the rate window's next slot, the parents it waits for or the
parent that parked it, and the job's priority and keys; the overview and queue pages count held
jobs by reason. Real scripts on a private Redis, through Starlette's TestClient."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard import Auth, create_app
from tests.conftest import Clock


@pytest.fixture
def web(client: redis.Redis, q: Queue) -> Iterator[TestClient]:
    with TestClient(create_app(client=client, queues=[q.name], auth=Auth())) as t:
        yield t


def job_page(web: TestClient, q: Queue, job_id: str) -> str:
    r = web.get(f"/queues/{q.name}/jobs/{job_id}")
    assert r.status_code == 200
    return r.text


def test_a_job_held_by_a_key_limit_says_so_on_its_page(q: Queue, web: TestClient) -> None:
    ids = [
        q.enqueue("sync", i, priority=3, concurrency_key="tenant:7", concurrency_limit=1)
        for i in range(2)
    ]
    leased = [j.id for j in q.claim("w1", limit=2).jobs]
    assert leased == ids[:1]  # the second was set aside by its key, still due
    page = job_page(web, q, ids[1])
    assert 'data-reason="limited-by-key"' in page
    assert "limited by key tenant:7: its 1 slots are leased" in page
    assert 'data-reason="waiting-for-worker"' not in page
    assert '<td class="mono" data-flow="priority">3</td>' in page
    assert "tenant:7 (at most 1 at once)" in page
    # The leased one is running: no reason; the counts say one is held by a key limit.
    assert "Running now" in job_page(web, q, ids[0])
    queue_page = web.get(f"/queues/{q.name}").text
    assert 'id="held"' in queue_page
    assert '<span data-live="held_key_limit">1</span> by a key limit' in queue_page
    assert '(<span data-live="held">1</span> held)' in web.get("/").text
    api = web.get(f"/queues/{q.name}/api").json()
    assert (api["held"], api["held_key_limit"], api["held_rate_window"]) == (1, 1, 0)


def test_a_full_rate_window_shows_its_next_slot(q: Queue, web: TestClient) -> None:
    ids = [q.enqueue("send", i, rate_limit=(1, 3_600_000)) for i in range(2)]
    batch = q.claim("w1", limit=2)
    assert [j.id for j in batch.jobs] == ids[:1]
    page = job_page(web, q, ids[1])
    assert 'data-reason="rate-window"' in page
    assert "rate window send is full (1 starts per 3600000 ms)" in page
    assert f"(server ms {batch.now_ms + 3_600_000})" in page
    assert '<td class="mono" data-flow="rate key">send (1 per 3600000 ms)</td>' in page
    assert web.get(f"/queues/{q.name}/api").json()["held_rate_window"] == 1


def test_waiting_for_parents_then_parked_when_one_dies(q: Queue, web: TestClient) -> None:
    parent = q.enqueue("fetch", None)
    child = q.enqueue("index", None, after=[parent])
    page = job_page(web, q, child)
    assert 'data-reason="waiting-for-parents"' in page
    assert "waiting for 1 parent job to be done" in page
    assert f'<td class="mono" data-flow="parents">{parent}</td>' in page  # which one
    assert web.get(f"/queues/{q.name}/api").json()["held_waiting"] == 1
    (job,) = q.claim("w1", limit=1).jobs
    q.fail(job.id, job.token, ("Boom", "no", "tb"), retryable=False)
    page = job_page(web, q, child)
    assert 'data-reason="parked-by-parent"' in page
    assert f"parked because its parent job {parent} ended dead" in page
    assert '<td class="mono" data-flow="priority">0</td>' in page
    assert web.get(f"/queues/{q.name}/api").json()["held"] == 0


def test_a_due_suspect_says_so_on_its_page(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    jid = q.enqueue("sync")
    for lapse in range(1, 3):  # a worker dies holding it, twice; the reaper puts it back
        assert [j.id for j in q.claim("crashed", limit=1, lease_ms=1_000).jobs] == [jid]
        clock.set_ms(1_000_000 + lapse * 1_001)
        q.claim("reaper", limit=0, lease_ms=1_000)
    with TestClient(create_app(client=client, queues=[q.name], auth=Auth())) as web:
        page = job_page(web, q, jid)
    assert 'data-reason="suspect"' in page
    assert "its lease lapsed 2 times" in page
