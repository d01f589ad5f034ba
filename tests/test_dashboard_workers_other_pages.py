"""The per-queue round trips /workers had, on the dashboard's other pages over queues: the
overview (and the /api/overview it polls every 3 s) read each queue's counts script and its
per-minute stats as driver calls of their own, /health each queue's counts, /schedules each
queue's (partition's) names, definitions, clock and last occurrences: 2, 1 and 2-5 round trips
a queue, 400 an overview of 200 queues. Now each is one driver call a server for the whole
page (batch.py, schedule_view.page_rows); a queue that fails in it is read alone, as before."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from scheduler import JobSpec
from scheduler.client.queue import Queue
from scheduler.dashboard import Auth, batch, create_app, schedule_view
from tests.conftest import delete_queue
from tests.fixtures.partitioned import MakePq
from tests.test_dashboard_workers_round_trips import count_sends

PATHS = ("/", "/api/overview", "/health", "/schedules")
COUNTED = ("due", "scheduled", "leased", "dead", "held", "paused_ms", "partitions")


@pytest.fixture
def served(
    private: redis.Redis, make_pq: MakePq, queue_name: str
) -> Iterator[tuple[redis.Redis, list[str], list[str]]]:
    """40 plain queues and 5 partitioned ones with jobs in every state: a few, and all."""
    pqs = [make_pq(suffix=f"-pq{i}", client="private") for i in range(5)]
    names = [f"{queue_name}-q{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        q = Queue(private, name)
        q.enqueue_many([JobSpec("t", {"n": n}) for n in range(i % 4 + 1)])
        q.enqueue("t", None, delay_ms=3_600_000)
        (job,) = q.claim("w", limit=1).jobs
        q.complete(job.id, job.token)
        if i % 3 == 0:
            q.pause()
        if i % 5 == 0:
            q.schedule(f"every-{i}", "t", every_ms=60_000)
    for pq in pqs:
        pq.enqueue_many([JobSpec("t", {"n": n}) for n in range(5)])
        pq.schedule("nightly", "t", every_ms=86_400_000)
    every = [*names, *(pq.name for pq in pqs)]
    yield private, [*names[:3], pqs[0].name], every


@pytest.mark.parametrize("path", PATHS)
def test_round_trips_do_not_grow_with_the_queues(
    served: tuple[redis.Redis, list[str], list[str]], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    client, few, many = served
    sent = count_sends(monkeypatch)
    counted = []
    for queues in (few, many):
        with TestClient(create_app(client=client, queues=queues, auth=Auth())) as web:
            assert web.get(path).status_code == 200  # the partition records read, kept
            before = len(sent)
            assert web.get(path).status_code == 200
            counted.append(len(sent) - before)
    # Before: 2 a queue (a partition) on the overview, 1 on /health, 2+ on /schedules.
    assert counted[1] == counted[0]


def test_the_rows_read_at_once_are_those_read_alone(
    served: tuple[redis.Redis, list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, many = served

    def rows() -> dict[str, dict[str, Any]]:
        with TestClient(create_app(client=client, queues=many, auth=Auth())) as web:
            page = web.get("/api/overview").json()
        assert page["unreachable"] == []
        return {r["queue"]: {k: r[k] for k in COUNTED} | {"done": sum(r["done"])}
                for r in page["queues"]}  # fmt: skip

    at_once = rows()
    monkeypatch.setattr(batch, "summaries", lambda store, names: {})  # each alone, as before
    assert rows() == at_once
    assert len(at_once) == len(many)
    assert sum(r["done"] for r in at_once.values()) == 40
    assert sum(r["paused_ms"] is not None for r in at_once.values()) == 14


def test_the_schedules_read_at_once_are_those_read_alone(
    served: tuple[redis.Redis, list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, many = served

    def page() -> str:
        with TestClient(create_app(client=client, queues=many, auth=Auth())) as web:
            html = web.get("/schedules").text
        return re.sub(r'name="csrf" value="[0-9a-f]+"', "", html)

    at_once = page()
    monkeypatch.setattr(schedule_view, "page_rows", lambda store, names, shown: {})
    assert page() == at_once
    assert all(f">every-{i}<" in at_once for i in range(0, 40, 5)) and ">nightly<" in at_once


def test_a_cluster_overview_is_two_driver_calls_a_node(rc: Any, queue_name: str) -> None:
    """The queues' slots are on every node: each read of the page one pipeline a node."""
    queues = [Queue(rc, f"{queue_name}-c{i:02d}") for i in range(30)]
    try:
        for q in queues:
            q.enqueue("t", None)
        nodes = len(rc.get_primaries())
        with pytest.MonkeyPatch.context() as mp:
            sent = count_sends(mp)
            app = create_app(client=rc, queues=[q.name for q in queues], auth=Auth())
            with TestClient(app) as web:
                web.get("/api/overview")
                before = len(sent)
                page = web.get("/api/overview").json()
                trips = len(sent) - before
        assert [r["due"] for r in page["queues"]] == [1] * len(queues)
        assert trips <= 2 * nodes  # the counts, then the minutes; before: 60
    finally:
        for q in queues:
            delete_queue(rc, q)


@pytest.mark.parametrize("path", ("/api/overview", "/health", "/schedules", "/workers"))
def test_a_first_request_asks_which_queues_are_partitioned_at_once(
    served: tuple[redis.Redis, list[str], list[str]], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A dashboard's first request (and the first after a minute) read each queue's layout
    record on its own (Store.view: a GET a queue) before the page's reads."""
    client, few, many = served
    with TestClient(create_app(client=client, queues=many, auth=Auth())) as web:
        assert web.get(path).status_code == 200  # the scripts loaded: not this test's count
    sent = count_sends(monkeypatch)
    counted = []
    for queues in (few, many):
        with TestClient(create_app(client=client, queues=queues, auth=Auth())) as web:
            before = len(sent)
            assert web.get(path).status_code == 200
            counted.append(len(sent) - before)
    assert counted[1] == counted[0]  # before: one more a queue
