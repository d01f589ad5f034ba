"""A second audit of the dashboard against what an operator meets in production (Starlette's
TestClient on a private Redis): the overview's lateness chart says which queues it covers (the
overview is paged by OVERVIEW_SHOWN queues, and the chart is the worst of the page's queues,
not of every queue); a partitioned queue's layout record edited by hand is one queue's trouble,
named, not a 500 or every page's 400."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.partitions import meta_key
from scheduler.dashboard import Auth, create_app, pages
from tests.conftest import delete_queue
from tests.fixtures.partitioned import MakePq


@pytest.fixture
def three(client: redis.Redis, q: Queue) -> Iterator[list[Queue]]:
    """Three queues by name, each with a job started (a lateness recorded)."""
    queues = [q, Queue(client, q.name + "-b"), Queue(client, q.name + "-c")]
    for each in queues:
        each.enqueue("t", None)
        each.claim("w1")
    yield queues
    for each in queues[1:]:
        delete_queue(client, each)


def scope(html: str) -> str:
    m = re.search(r'<p class="hint" id="lateness-scope">(.*?)</p>', html, re.S)
    assert m, "the chart names no scope"
    return m.group(1)


def test_the_lateness_chart_says_it_covers_the_pages_queues_only(
    client: redis.Redis, three: list[Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its title said "worst queue" on every page of the overview: an operator reading page 1
    took it for every queue's, while a late queue on page 2 was in no chart of page 1."""
    monkeypatch.setattr(pages, "OVERVIEW_SHOWN", 2)
    app = create_app(client=client, queues=[x.name for x in three], auth=Auth())
    with TestClient(app) as web:
        first, second = web.get("/").text, web.get("/?offset=2").text
        api = web.get("/api/overview?offset=2").json()
    assert "queues 1-2 of 3 only" in scope(first), scope(first)
    assert "queues 3-3 of 3 only" in scope(second), scope(second)
    assert api["lateness_queues"] == [three[2].name]


def test_unpaged_the_chart_covers_every_queue_listed(
    client: redis.Redis, three: list[Queue]
) -> None:
    app = create_app(client=client, queues=[x.name for x in three], auth=Auth())
    with TestClient(app) as web:
        page = web.get("/").text
        api = web.get("/api/overview").json()
    assert "every queue listed above" in scope(page)
    assert api["lateness_queues"] == sorted(x.name for x in three)


@pytest.fixture(params=["garbage", "another-type"])
def bad_layout(
    request: pytest.FixtureRequest, client: redis.Redis, make_pq: MakePq
) -> PartitionedQueue:
    """A partitioned queue whose stored layout record was edited by hand: to text it cannot
    read, or into a hash."""
    pq = make_pq(partitions=2, suffix="-p")
    pq.enqueue("t", None)
    client.delete(meta_key(pq.name))
    if request.param == "garbage":
        client.set(meta_key(pq.name), "zzz")
    else:
        client.hset(meta_key(pq.name), "partitions", "2")
    return pq


@pytest.mark.parametrize("path", ["", "/dead", "/api"])
def test_a_layout_record_edited_by_hand_is_named_on_its_queues_pages(
    client: redis.Redis, bad_layout: PartitionedQueue, path: str
) -> None:
    """Edited into a hash, the queue's pages answered a bare 500 (redis-py's WRONGTYPE)."""
    app = create_app(client=client, queues=[bad_layout.name], auth=Auth())
    with TestClient(app, raise_server_exceptions=False) as web:
        r = web.get(f"/queues/{bad_layout.name}{path}")
    assert r.status_code == 400, r.text[-300:]
    assert "partition record" in r.text and "scheduler doctor" in r.text, r.text[-400:]


@pytest.mark.parametrize("page", ["/", "/api/overview", "/workers", "/schedules", "/health"])
def test_a_layout_record_edited_by_hand_leaves_the_other_queues_shown(
    client: redis.Redis, q: Queue, bad_layout: PartitionedQueue, page: str
) -> None:
    """One queue's unreadable record answered 400 for the overview, /workers, /schedules and
    /health: every other queue's rows were gone with it."""
    q.enqueue("t", None)
    q.schedule("nightly", "t", every_ms=60_000)
    app = create_app(client=client, queues=[q.name, bad_layout.name], auth=Auth())
    with TestClient(app, raise_server_exceptions=False) as web:
        r = web.get(page)
    assert r.status_code == 200, r.text[-300:]
    said = r.json()["unreachable"] if page.startswith("/api") else r.text
    assert f"queue {bad_layout.name}: " in str(said) and "partition record" in str(said)
    if page == "/api/overview":
        assert [row["queue"] for row in r.json()["queues"]] == [q.name]
    elif page == "/schedules":
        assert "nightly" in r.text


def test_jobs_held_after_the_page_loaded_show_in_the_live_refresh(
    client: redis.Redis, q: Queue
) -> None:
    """The held count (overview: '(N held)' by the due count; queue page: its card) was drawn
    only when the page was rendered with held jobs: jobs held after the page loaded never
    showed there, the live refresh having no element to fill. A real Chromium
    (tests/test_dashboard_browser.py's setup; skipped without one, as there)."""
    from tests.test_dashboard_browser import CHROMIUM, serve

    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM}")
    q.enqueue("sync", 0, concurrency_key="k", concurrency_limit=1)
    app = create_app(client=client, queues=[q.name], auth=Auth())
    with serve(app) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        queue_page = browser.new_page()
        page.goto(f"{url}/")
        queue_page.goto(f"{url}/queues/{q.name}")
        held = page.locator(f'tr[data-queue="{q.name}"] [data-live="held"]')
        card = queue_page.locator('[data-live="held_key_limit"]')
        sync_api.expect(held).to_be_hidden()
        sync_api.expect(card).to_be_hidden()
        q.enqueue("sync", 1, concurrency_key="k", concurrency_limit=1)
        assert len(q.claim("w1", limit=2).jobs) == 1  # the other one is held now
        sync_api.expect(held).to_be_visible(timeout=10_000)
        sync_api.expect(held).to_have_text("1")
        sync_api.expect(card).to_be_visible(timeout=10_000)
        sync_api.expect(card).to_have_text("1")
        browser.close()


@pytest.mark.parametrize("path", ["", "?state=held", "/api"])
def test_the_current_stats_minute_edited_by_hand_leaves_the_queue_page_readable(
    client: redis.Redis, q: Queue, path: str
) -> None:
    """The queue page and its JSON read the current minute's stats hash: edited into a string
    it answered a bare 500 (WRONGTYPE), and the overview left the queue out. The counts are
    shown; the figures of the stats are named as not read."""
    q.enqueue("t", None)
    minute = int(client.time()[0]) // 60
    for m in (minute, minute + 1):  # the page's minute, even if the clock turns meanwhile
        client.delete(q.keys.stats(m))
        client.set(q.keys.stats(m), "edited")
    app = create_app(client=client, queues=[q.name], auth=Auth())
    with TestClient(app, raise_server_exceptions=False) as web:
        r = web.get(f"/queues/{q.name}{path}")
        overview = web.get("/api/overview").json()
    assert r.status_code == 200, r.text[-300:]
    said = r.json()["unread_partitions"] if path == "/api" else r.text
    assert "per-minute stats" in str(said) and "edited by hand" in str(said), str(said)[-600:]
    if path == "/api":
        assert r.json()["due"] == 1
    assert [row["queue"] for row in overview["queues"]] == [q.name]
    assert overview["queues"][0]["due"] == 1


def test_a_workers_set_edited_by_hand_leaves_the_job_page_readable(
    client: redis.Redis, q: Queue
) -> None:
    """The job page asks whether any worker is alive (the workers ZSET): edited into a string,
    it answered a bare 500 and the job could not be seen."""
    job = q.enqueue("t", None)
    client.delete(q.keys.workers)
    client.set(q.keys.workers, "edited")
    app = create_app(client=client, queues=[q.name], auth=Auth())
    with TestClient(app, raise_server_exceptions=False) as web:
        r = web.get(f"/queues/{q.name}/jobs/{job}")
    assert r.status_code == 200, r.text[-300:]
    assert job in r.text
    assert 'data-reason="no-live-worker"' not in r.text  # not known: not said
