"""The dashboard while a queue's hash slot is being migrated between Redis Cluster nodes (a
reshard: TRYAGAIN, or redis-py's 'TTL exhausted' once its redirections are used up). Every page
says so in the one sentence the overview and the CLI use (errors.slot_move_text), never in
redis-py's raw words ('TryAgainError: Multiple keys request during rehashing of slot'); a
partitioned queue one of whose partitions moves shows the others and names that one. The move
is made by tests/fixtures/slot_move.py on a local cluster (one per module); the
/workers reads, which the real move does not refuse, get the same errors injected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ClusterError, TryAgainError
from starlette.testclient import TestClient

from scheduler import Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.dashboard import Auth, create_app, workers_read
from tests.conftest import delete_queue
from tests.fixtures.slot_move import partitioned_on_the_move, queue_on_the_move

SAYS = "hash slot is being migrated to another Redis Cluster node"
RAW = ("Multiple keys request", "TryAgainError", "TTL exhausted.")
EVERY_MS = 60_000


def friendly(text: str) -> bool:
    return SAYS in text and not any(r in text for r in RAW)


@pytest.fixture
def moving(cluster_url: str, queue_name: str) -> Iterator[Queue]:
    """A queue with jobs and a schedule, every key of its slot moved to the other node, the
    move not finished: its multi-key reads are refused with TRYAGAIN."""
    with queue_on_the_move(cluster_url, queue_name, jobs=4, every_ms=EVERY_MS) as q:
        yield q


@pytest.fixture
def moving_partition(cluster_url: str, queue_name: str) -> Iterator[PartitionedQueue]:
    """A partitioned queue of 2, each partition with jobs and a schedule; the first one's slot
    moved as in `moving`. The second answers."""
    with partitioned_on_the_move(cluster_url, queue_name, jobs=3, every_ms=EVERY_MS) as pq:
        yield pq


def web_of(url: str, *queues: str) -> TestClient:
    return TestClient(create_app(url=url, queues=queues, auth=Auth()))


@pytest.mark.parametrize("path", ["", "?state=held", "/dead", "/api"])
def test_a_moving_queues_own_pages_say_so(cluster_url: str, moving: Queue, path: str) -> None:
    """Its 503 said 'Redis refused the request for now: TryAgainError: Multiple keys request
    during rehashing of slot'."""
    with web_of(cluster_url, moving.name) as web:
        r = web.get(f"/queues/{moving.name}{path}")
    assert r.status_code == 503, r.text[-300:]
    assert friendly(r.text), r.text[-600:]


@pytest.mark.parametrize("page", ["/schedules", "/health"])
def test_pages_over_queues_whose_only_queue_moves_say_so(
    cluster_url: str, moving: Queue, page: str
) -> None:
    with web_of(cluster_url, moving.name) as web:
        r = web.get(page)
    assert friendly(r.text), r.text[-600:]


def test_a_moving_partition_leaves_the_queue_page_readable(
    cluster_url: str, moving_partition: PartitionedQueue
) -> None:
    """The due page read each partition's ids (one-key reads follow ASK), then the records of
    the moving one were refused, and the page answered 503 for all of them."""
    pq = moving_partition
    first, second = pq.parts
    with web_of(cluster_url, pq.name) as web:
        r = web.get(f"/queues/{pq.name}")
    assert r.status_code == 200, r.text[-600:]
    assert all(j.id in r.text for j in second.list_jobs("due"))
    assert f"partition {first.name}: its {SAYS}" in r.text and friendly(r.text), r.text[-900:]


@pytest.mark.parametrize("page", ["/schedules", "/health"])
def test_a_moving_partition_leaves_the_others_on_schedules_and_health(
    cluster_url: str, moving_partition: PartitionedQueue, page: str
) -> None:
    """/schedules caught a node down only: the TRYAGAIN of one partition failed the queue
    (its only one: the page's 503 in raw words); /health read unpartial counts."""
    pq = moving_partition
    first, second = pq.parts
    with web_of(cluster_url, pq.name) as web:
        r = web.get(page)
    assert r.status_code == 200, r.text[-600:]
    assert f"partition {first.name}: its {SAYS}" in r.text and friendly(r.text), r.text[-900:]
    if page == "/schedules":
        assert f"every-{second.name}" in r.text and f"every-{first.name}" not in r.text


@pytest.mark.parametrize(
    "error",
    [
        TryAgainError("Multiple keys request during rehashing of slot"),
        ClusterError("TTL exhausted."),
    ],
    ids=["TRYAGAIN", "TTL-exhausted"],
)
def test_workers_of_a_moving_partition_are_named_so(
    cluster_url: str,
    moving_partition: PartitionedQueue,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    """Store.workers caught a node down only: a TRYAGAIN failed the whole queue, and 'TTL
    exhausted' was shown as is ('partition <p>: TTL exhausted.'). The first partition's
    pipelines (workers_read.py) fail with `error`."""
    pq = moving_partition
    first, second = pq.parts
    real = workers_read.pipelined

    def refused(client: redis.Redis, parts: Any, queue: Any) -> Any:
        got = real(client, parts, queue)
        return [error if p.q.name == first.name else r for p, r in zip(parts, got, strict=True)]

    rc = second.client
    rc.zadd(second.keys.workers, {"w-live": 1})
    rc.hset(second.keys.worker("w-live"), mapping={"host": "h1", "pid": "7"})
    monkeypatch.setattr(workers_read, "pipelined", refused)
    with web_of(cluster_url, pq.name) as web:
        r = web.get("/workers")
    assert r.status_code == 200, r.text[-600:]
    assert "w-live" in r.text
    assert f"partition {first.name}: its {SAYS}" in r.text and friendly(r.text), r.text[-900:]


def test_a_slot_move_is_asked_again_at_the_next_refresh_and_said_so_again(
    cluster_url: str, queue_name: str
) -> None:
    """A read that met 'TTL exhausted' (a ClusterError, as a node down is) was taken for a node
    down: not asked again for 15 s, and the next pages said 'queue <q>: TTL exhausted. (asked
    again within 15s)', redis-py's words. A slot on the move is asked again at once."""
    rc: Any = connect(cluster_url)
    q = Queue(rc, queue_name)
    other = Queue(rc, queue_name + "-b")
    for each in (q, other):
        each.enqueue("t", None)
    app = create_app(url=cluster_url, queues=[q.name, other.name], auth=Auth())
    real, asked = app.store.queue_summary, []

    def moving(name: str, minutes: int = 60) -> dict[str, Any]:
        if name == q.name:
            asked.append(name)
            raise ClusterError("TTL exhausted.")
        return real(name, minutes)

    app.store.queue_summary = moving  # type: ignore[method-assign]
    try:
        with TestClient(app) as web:
            said = [web.get("/api/overview").json()["unreachable"] for _ in range(2)]
        assert len(asked) == 2  # asked again at the next refresh
        for unreachable in said:
            (line,) = [u for u in unreachable if q.name in u]
            assert line.startswith(f"queue {q.name}: its {SAYS}") and friendly(line), line
    finally:
        delete_queue(rc, q)
        delete_queue(rc, other)
        rc.close()
