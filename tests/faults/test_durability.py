"""Durability levels: WAIT for replicas after enqueue (NotDurable when they do not answer), and a
full server (maxmemory + noeviction) that refuses new jobs without touching the stored ones."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler.core.errors import NotDurable
from tests.conftest import dump_queue
from tests.faults.conftest import Server, retrying_client
from tests.workers.procs import wait_for

QUEUE = "durable"


@pytest.fixture
def primary_and_replica(start_server: Callable[..., Server]) -> tuple[Server, Server]:
    primary = start_server("--repl-diskless-sync-delay", "0", tcp=True)
    replica = start_server("--replicaof", "127.0.0.1", str(primary.port))
    wait_for(lambda: replica.admin().info("replication")["master_link_status"] == "up",
             what="replica in sync")  # fmt: skip
    return primary, replica


def test_wait_replicas_acknowledged(primary_and_replica: tuple[Server, Server]) -> None:
    primary, replica = primary_and_replica
    q = Queue(primary.admin(), QUEUE, wait_replicas=1, wait_timeout_ms=5_000)
    jid = q.enqueue("d.t", {"a": 1})
    ids = q.enqueue_many([JobSpec("d.t", {"n": i}) for i in range(3)])
    # WAIT returned only once the replica had the writes: it can answer at once.
    on_replica = Queue(replica.admin(), QUEUE)
    assert [on_replica.status(i) for i in [jid, *ids]] == ["due"] * 4


def test_missing_replica_raises_not_durable_with_the_ids(
    primary_and_replica: tuple[Server, Server],
) -> None:
    primary, replica = primary_and_replica
    replica.kill()
    wait_for(lambda: primary.admin().info("replication")["connected_slaves"] == 0,
             what="primary sees the replica gone")  # fmt: skip
    q = Queue(primary.admin(), QUEUE, wait_replicas=1, wait_timeout_ms=100)
    spec = JobSpec("d.t", {"a": 1}, job_id="order-1")
    with pytest.raises(NotDurable) as caught:
        q.enqueue_many([spec])
    assert caught.value.job_ids == ["order-1"] and caught.value.acked == 0
    # The primary holds the job; sending the same spec again is idempotent on its id.
    before = dump_queue(primary.admin(), q)
    with pytest.raises(NotDurable):
        q.enqueue_many([spec])
    assert dump_queue(primary.admin(), q) == before
    assert Queue(primary.admin(), QUEUE).status("order-1") == "due"


def test_wait_path_survives_script_flush(primary_and_replica: tuple[Server, Server]) -> None:
    primary, _ = primary_and_replica
    q = Queue(retrying_client(primary.url), QUEUE, wait_replicas=1, wait_timeout_ms=5_000)
    stop = threading.Event()

    def flusher() -> None:
        admin = primary.admin()
        while not stop.is_set():
            admin.script_flush()
            stop.wait(0.003)

    t = threading.Thread(target=flusher)
    t.start()
    try:
        ids = [q.enqueue("d.t", {"n": i}) for i in range(150)]
    finally:
        stop.set()
        t.join()
    assert primary.admin().zcard(q.keys.due) == len(set(ids)) == 150


def test_full_server_refuses_enqueue_and_keeps_existing_jobs(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--maxmemory-policy", "noeviction")
    admin = server.admin()
    q = Queue(admin, QUEUE)
    q.preload()  # scripts are cached before the server fills up
    kept = [q.enqueue("d.t", {"n": i}) for i in range(20)]
    leased = q.claim("w", limit=5).jobs
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 256 * 1024)
    big = "x" * 100_000
    returned: list[str] = []
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for _ in range(50):
            returned.append(q.enqueue("d.t", {"big": big}))
    before = dump_queue(admin, q)
    for _ in range(3):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            q.enqueue("d.t", {"big": big})
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            q.enqueue_many([JobSpec("d.t", {"n": i}) for i in range(10)])
    assert dump_queue(admin, q) == before, "a refused enqueue changed the stored jobs"
    # A re-sent enqueue of jobs already stored (a retry after a lost reply) writes nothing, so
    # the full server still answers it: with their ids, not OutOfMemoryError.
    again = [JobSpec("d.t", {"n": 0}, job_id=j) for j in kept[:3]]
    assert q.enqueue_many(again) == kept[:3]
    assert q.enqueue("d.t", None, job_id=kept[3]) == kept[3]
    assert dump_queue(admin, q) == before
    # Every id an enqueue returned is stored; nothing was evicted.
    assert all(q.status(j) == "due" for j in returned)
    assert [q.status(j) for j in kept].count("due") == 15
    assert all(q.status(j.id) == "leased" for j in leased)
    # Settling still works at the limit (complete and fail write a ZREM first, which Redis
    # allows; the rest of the script may then write), so running jobs finish.
    q.complete(leased[0].id, leased[0].token, None)
    assert q.status(leased[0].id) == "done"
    out = q.fail(leased[1].id, leased[1].token, RuntimeError("x"), delay_ms=0)
    assert out.status == "retry" and q.status(leased[1].id) == "due"
    # Claims grow memory first (the fence), so they wait for room; nothing is lost meanwhile.
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        q.claim("w", limit=100)
    admin.config_set("maxmemory", 0)
    assert len(q.claim("w", limit=100).jobs) == 15 + 1 + len(returned)
