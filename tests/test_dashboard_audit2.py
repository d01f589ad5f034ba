"""A second audit of the dashboard against what an operator meets in production (Starlette's
TestClient on a private Redis): the overview's lateness chart says which queues it covers (the
overview is paged by OVERVIEW_SHOWN queues, and the chart is the worst of the page's queues,
not of every queue)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.dashboard import Auth, create_app, pages
from tests.conftest import delete_queue


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
