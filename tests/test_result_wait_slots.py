"""The blocking `Queue.result`'s cap on the connections its waits hold (client/result_waiting.py
`_Slots`, half the pool as on asyncio), and a wait that finds the pool full
(operations/result_wait.py `outage`). On this module's private server."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError

from scheduler import JobCancelled, Queue, ResultTimeout
from scheduler._spawn import RedisProcess
from scheduler.client import result_waiting
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect
from scheduler.operations.requests import Commands
from scheduler.operations.result_wait import Pause
from tests.redis_server import is_cluster_run
from tests.workers.procs import wait_for

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")


@pytest.fixture
def url(module_server: RedisProcess) -> str:
    return module_server.url


@pytest.fixture
def admin(url: str) -> Iterator[redis.Redis]:
    c = connect(url)
    yield c
    c.close()


def _outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:
        return exc


def test_a_thread_back_for_a_slot_queues_behind_the_one_already_waiting() -> None:
    """A plain Semaphore (like a BlockingConnectionPool) lets the thread that just gave its slot
    back take it again before the waiting one wakes: a waiter past the cap would never read."""
    slots = result_waiting._Slots(1)
    assert slots.take(time.monotonic() + 60)
    got: list[bool] = []
    other = threading.Thread(target=lambda: got.append(slots.take(time.monotonic() + 60)))
    other.start()
    wait_for(lambda: len(slots.turns) == 1, 10, "the other thread waiting for the slot")
    slots.give()
    again = slots.take(0)  # no wait: its turn is after the other thread's
    other.join(10)
    assert (again, got) == (False, [True])
    slots.give()
    assert slots.take(0)


def test_waits_of_a_partitioned_queues_partitions_share_one_cap(
    url: str, admin: redis.Redis, queue_name: str
) -> None:
    """Two threads waiting on jobs of two partitions, a pool of 2: one connection is left for
    an enqueue (each wait held one: MaxConnectionsError)."""
    q = PartitionedQueue.create(connect(f"{url}?max_connections=2"), queue_name, partitions=2)
    side = PartitionedQueue.open(admin, queue_name)
    jobs = [side.enqueue("t", {}, job_id=f"j{k}", delay_ms=600_000) for k in range(8)]
    homes = {side.part_of(j).keys.queue: j for j in jobs}
    assert len(homes) == 2
    waited = list(homes.values())
    out: list[Any] = [None, None]

    def wait(k: int) -> None:
        out[k] = _outcome(lambda: q.result(waited[k], timeout_s=60))

    threads = [threading.Thread(target=wait, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    try:
        wait_for(
            lambda: all(admin.scard(side.part_of(j).keys.result_wait(j)) for j in waited),
            20,
            "both waiters announced",
        )
        enqueued = _outcome(lambda: q.enqueue("t", {"web": "request"}))
    finally:
        for j in waited:
            side.cancel(j)
        for th in threads:
            th.join(30)
        q.client.close()
    assert [type(o) for o in out] == [JobCancelled, JobCancelled], out
    assert isinstance(enqueued, str), enqueued


def test_a_wait_that_gets_no_slot_by_its_end_raises_result_timeout(
    url: str, admin: redis.Redis, queue_name: str
) -> None:
    q = Queue.from_url(f"{url}?max_connections=2", queue_name)
    job = Queue(admin, queue_name).enqueue("t", {}, delay_ms=600_000)
    slots = result_waiting._sync_slots(q.client)
    assert slots.take(0)  # the client's only wait slot, held by another waiter
    try:
        with pytest.raises(ResultTimeout, match="not read again"):
            q.result(job, timeout_s=0.05)
    finally:
        slots.give()
        q.close()


def test_a_wait_on_a_full_pool_raises_max_connections_error_at_once(
    url: str, admin: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As every call past the pool does (README): the wait used to sleep and retry it as an
    outage for its whole timeout_s, then raise it."""
    q = Queue.from_url(f"{url}?max_connections=1", queue_name)
    job = Queue(admin, queue_name).enqueue("t", {}, delay_ms=600_000)
    held = q.client.connection_pool.get_connection()  # another thread's call, say
    slept: list[float] = []
    fake_time = types.SimpleNamespace(monotonic=time.monotonic, sleep=slept.append)
    monkeypatch.setattr(result_waiting, "time", fake_time)
    try:
        with pytest.raises(MaxConnectionsError):
            q.result(job, timeout_s=600)
    finally:
        q.client.connection_pool.release(held)
        q.close()
    assert slept == []


def test_the_wait_op_raises_a_full_pool_and_retries_an_outage(queue_name: str) -> None:
    """The op both drivers share: a full pool ends the wait, a dropped connection is retried."""
    q = Queue(redis.Redis(), queue_name)  # never sent: the op is driven by hand
    for exc, retried in (
        (MaxConnectionsError("Too many connections"), False),
        (RedisConnectionError("gone"), True),
    ):
        op = q.ops.result("j1", 60)
        assert isinstance(next(op), Commands)
        if retried:
            assert isinstance(op.throw(exc), Pause)
        else:
            with pytest.raises(MaxConnectionsError):
                op.throw(exc)
