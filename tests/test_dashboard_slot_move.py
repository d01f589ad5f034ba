"""The dashboard while a queue's hash slot is being migrated between Redis Cluster nodes (a
reshard: TRYAGAIN, or redis-py's 'TTL exhausted' once its redirections are used up). Every page
says so in the one sentence the overview and the CLI use (errors.slot_move_text), never in
redis-py's raw words ('TryAgainError: Multiple keys request during rehashing of slot'); a
partitioned queue one of whose partitions moves shows the others and names that one. The move
is made by tests/test_cluster_reshard.py's SlotMove on a local cluster (one per module); the
/workers reads, which the real move does not refuse, get the same errors injected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ClusterError, TryAgainError
from starlette.testclient import TestClient

from scheduler import JobSpec, Queue
from scheduler.admin.workers import live_workers
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.core.partitions import meta_key
from scheduler.dashboard import Auth, create_app
from tests.conftest import delete_queue
from tests.test_cluster_reshard import moving_slot

SAYS = "hash slot is being migrated to another Redis Cluster node"
RAW = ("Multiple keys request", "TryAgainError", "TTL exhausted.")
EVERY_MS = 60_000


def friendly(text: str) -> bool:
    return SAYS in text and not any(r in text for r in RAW)


@pytest.fixture
def moving(cluster_url: str, queue_name: str) -> Iterator[Queue]:
    """A queue with jobs and a schedule, every key of its slot moved to the other node, the
    move not finished: its multi-key reads are refused with TRYAGAIN."""
    rc: Any = connect(cluster_url)
    q = Queue(rc, queue_name)
    q.enqueue_many([JobSpec("t", None) for _ in range(4)])
    q.schedule("nightly", "t", every_ms=EVERY_MS)
    try:
        with moving_slot(rc, q.keys.prefix):
            yield q
    finally:
        delete_queue(rc, q)
        rc.close()


@pytest.fixture
def moving_partition(cluster_url: str, queue_name: str) -> Iterator[PartitionedQueue]:
    """A partitioned queue of 2, each partition with jobs and a schedule; the first one's slot
    moved as in `moving`. The second answers."""
    rc: Any = connect(cluster_url)
    pq = PartitionedQueue.create(rc, queue_name, partitions=2)
    for p in pq.parts:
        p.enqueue_many([JobSpec("t", None) for _ in range(3)])
        p.schedule(f"every-{p.name}", "t", every_ms=EVERY_MS)
    try:
        with moving_slot(rc, pq.parts[0].keys.prefix):
            yield pq
    finally:
        for p in pq.parts:
            delete_queue(rc, p)
        rc.delete(meta_key(queue_name))
        rc.close()


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
    exhausted' was shown as is ('partition <p>: TTL exhausted.')."""
    import scheduler.dashboard.store as store

    pq = moving_partition
    first, second = pq.parts
    real = live_workers

    def refused(client: redis.Redis, keys: Any, limit: int = -1) -> Any:
        if keys.queue == first.name:
            raise error
        return real(client, keys, limit=limit)

    rc = second.client
    rc.zadd(second.keys.workers, {"w-live": 1})
    rc.hset(second.keys.worker("w-live"), mapping={"host": "h1", "pid": "7"})
    monkeypatch.setattr(store, "live_workers", refused)
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
