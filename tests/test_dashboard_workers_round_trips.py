"""/workers' round trips do not grow with the number of queues (a real private redis-server,
and a local Redis Cluster): each queue's ZCARD, its entries' ZRANGE and their presence
hashes were round trips of their own, so a page of 200 queues made 200 to 400 of them. Now the
page's queues are read in three pipelines a server (per node on a cluster). Counted at the
connection: one send_packed_command is one round trip (a pipeline is one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.queue import Queue
from scheduler.dashboard import Auth, create_app
from tests.conftest import delete_queue
from tests.fixtures.partitioned import MakePq
from tests.test_dashboard_workers_scale import register, rows


def count_sends(mp: pytest.MonkeyPatch) -> list[int]:
    """One entry a round trip sent on any redis-py connection from now on (a pipeline: one)."""
    sent: list[int] = []
    original: Callable[..., None] = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        original(self, command, check_health)

    mp.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    return sent


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_sends(monkeypatch)


def trips(web: TestClient, path: str, sent: list[int]) -> tuple[int, list[tuple[str, str]]]:
    """(round trips of one GET of `path`, its rows)."""
    web.get(path)  # the first: the queues' partition records (kept), a cluster's slot map
    before = len(sent)
    page = web.get(path)
    assert page.status_code == 200
    return len(sent) - before, rows(page.text)


def setup(client: Any, names: list[str], pqs: list[PartitionedQueue]) -> list[str]:
    """Two live workers and a stopped one on each plain queue, two on every partition of
    each partitioned queue: the queues the dashboard serves."""
    for name in names:
        register(client, name, [f"{name}-w1", f"{name}-w2"])
        register(client, name, [f"{name}-gone"], live=False)
    for pq in pqs:
        for part in pq.parts:
            register(client, part.name, [f"{pq.name}-w1", f"{pq.name}-w2"])
    return [*names, *(pq.name for pq in pqs)]


@pytest.fixture
def served(
    private: redis.Redis, make_pq: MakePq, queue_name: str
) -> Iterator[tuple[redis.Redis, list[str], list[str]]]:
    """A few queues, and many (a superset): 3 plain + 1 partitioned, 40 plain + 5."""
    pqs = [make_pq(suffix=f"-pq{i}", client="private") for i in range(5)]
    names = [f"{queue_name}-q{i:02d}" for i in range(40)]
    every = setup(private, names, pqs)
    yield private, [*names[:3], pqs[0].name], every


PATHS = ("/workers", "/workers?from=3", "/workers?from=1000000")


@pytest.mark.parametrize("path", PATHS)
def test_round_trips_do_not_grow_with_the_queues(
    served: tuple[redis.Redis, list[str], list[str]], round_trips: list[int], path: str
) -> None:
    client, few, many = served
    with TestClient(create_app(client=client, queues=few, auth=Auth())) as web:
        n_few, rows_few = trips(web, path, round_trips)
    with TestClient(create_app(client=client, queues=many, auth=Auth())) as web:
        n_many, rows_many = trips(web, path, round_trips)
    # Before: 2 to 3 a queue (its ZCARD, its entries' ZRANGE, their presence pipeline).
    assert n_many == n_few
    assert n_many <= 4  # three pipelines and the page's TIME
    if path == "/workers":  # every live worker once, none stopped
        want = {(f"{n}-w{i}", n) for n in many if "-pq" not in n for i in (1, 2)}
        assert want <= set(rows_many)
        assert len(rows_many) == len(want) + 2 * 5  # each partitioned queue's two, once
        assert len(rows_few) == 3 * 2 + 2


def test_a_cluster_page_makes_three_pipelines_a_node(rc: Any, queue_name: str) -> None:
    """On a cluster the queues' sets are on every node: one pipeline a node a step."""
    names = [f"{queue_name}-c{i:02d}" for i in range(30)]
    try:
        every = setup(rc, names, [])
        nodes = len(rc.get_primaries())
        with pytest.MonkeyPatch.context() as mp:
            sent = count_sends(mp)
            with TestClient(create_app(client=rc, queues=every[:3], auth=Auth())) as web:
                n_few, _ = trips(web, "/workers", sent)
            with TestClient(create_app(client=rc, queues=every, auth=Auth())) as web:
                n_many, got = trips(web, "/workers", sent)
        assert sorted(got) == sorted((f"{n}-w{i}", n) for n in names for i in (1, 2))
        assert n_many <= 3 * nodes + 1  # before: 60 (each queue's ZRANGE and presence pipeline)
        assert n_few <= n_many
    finally:
        for name in names:
            delete_queue(rc, Queue(rc, name))
