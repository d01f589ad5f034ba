"""Review of 12a674d (storage-generation guard), e75411e (queue index) and ce99fef (sync
results encoded in the handler thread): each test failed before its fix."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from click.testing import CliRunner
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import JobSpec, NewerStorage, Queue
from scheduler.admin.startup import check_access_async
from scheduler.cli.main import main
from scheduler.core import queue_index
from scheduler.core.keys import QUEUE_INDEX, STORAGE_GENERATION
from tests.conftest import delete_queue
from tests.workers.procs import spawn_worker, stop_all, wait_for

NEWER = str(STORAGE_GENERATION + 1)


def _python_refuses(redis_url: str, queue: str) -> bool:
    async def go() -> bool:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await check_access_async(client, [queue])
        except NewerStorage:
            return True
        finally:
            await client.aclose()
        return False

    return asyncio.run(go())


@pytest.mark.parametrize("value", ["00000002", "0000000000000002", "0000002", "02", "1000001"])
def test_lua_and_the_worker_start_read_a_generation_alike(
    client: redis.Redis, redis_url: str, q: Queue, value: str
) -> None:
    """Before: the scripts read '00000002' as generation 2 and refused every call while
    `scheduler worker` (and the doctor) read it as no generation: the worker started on a
    queue it could never claim from. Now a value the Python side does not read as a
    generation (over 7 digits) refuses nothing in Lua either."""
    client.hset(q.keys.config, "generation", value)
    try:
        q.enqueue("echo", None)
        lua_refuses = False
    except NewerStorage:
        lua_refuses = True
    assert lua_refuses == _python_refuses(redis_url, q.name)


def test_an_unreachable_index_is_not_tried_again_by_every_enqueue(
    client: redis.Redis, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a SADD to the index that could not reach its server was tried again by the next
    enqueue, and the next: on a Redis Cluster whose index node was down, every enqueue to a
    queue of a healthy node paid the failed SADD first (3 to 4.5 s each, measured on a local
    cluster; they took ms before the index). Now one try, then none for a while: the enqueues
    go on at their own speed, the index is tried again later."""
    tries: list[tuple[object, ...]] = []

    def down(*args: object) -> None:
        tries.append(args)
        raise RedisConnectionError("the index's node is down")

    monkeypatch.setattr(client, "sadd", down)
    ids = [q.enqueue("echo", {"i": i}) for i in range(3)]
    ids += q.enqueue_many([JobSpec("echo", {"i": 3})])
    assert len(tries) == 1
    assert [q.status(j) for j in ids] == ["due"] * 4


@pytest.mark.parametrize(
    "error",
    [
        SlotNotCoveredError("slot 1 is not covered by the cluster"),
        ClusterDownError("CLUSTERDOWN The cluster is down"),
        TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    ],
)
def test_an_index_refused_for_now_fails_no_enqueue_and_is_added_later(
    client: redis.Redis, q: Queue, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """Before: redis-py's SlotNotCoveredError (no RedisError: the index's slot unserved on a
    cluster) came out of the enqueue, which failed though its own node answered; and a
    CLUSTERDOWN or TRYAGAIN (ResponseErrors, for now only) was taken as a refusal for good, so
    the queue was never indexed by that process: missing from every listing once the index
    was scanned. Now the enqueue goes on and the name is added on a later call."""
    real, failures = client.sadd, [error]

    def flaky(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args)

    monkeypatch.setattr(client, "sadd", flaky)
    monkeypatch.setattr(queue_index, "RETRY_AFTER_S", 0.0)  # no wait for the later call
    first = q.enqueue("echo", None)
    assert q.status(first) == "due"
    assert q.name not in client.smembers(QUEUE_INDEX)
    q.enqueue("echo", None)
    assert q.name in client.smembers(QUEUE_INDEX)


def test_a_running_worker_leaves_a_newer_queues_wake_ups_to_its_workers(
    client: redis.Redis, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    """Before: a worker of this version went on popping the wake-up LIST of a queue a newer
    version stores (a rolling upgrade), then had its claim refused: each wake-up an enqueue
    pushed for the newer version's workers was lost, and they slept out their idle wait (up
    to 30 s) before starting the job. Now the queue's wake-up key leaves the pop while its
    claims are refused (a wake-up popped meanwhile is pushed back)."""
    newer, other = Queue(client, queue_name + "-newer"), Queue(client, queue_name + "-other")
    log = tmp_path / "worker.log"
    w = spawn_worker(redis_url, newer.name, "--queue", other.name, log=str(log))

    def refused() -> bool:
        return "NewerStorage" in log.read_text()

    def served() -> bool:
        job = other.enqueue("echo", None)
        wait_for(lambda: other.status(job) == "done", what="the other queue served")
        return True

    try:
        wait_for(lambda: client.exists(newer.keys.workers) == 1, what="the worker up")
        client.hset(newer.keys.config, "generation", NEWER)
        wait_for(lambda: served() and refused(), what="a claim of the newer queue refused")
        client.lpush(newer.keys.wake, "1")  # a newer producer's wake-up for its workers
        assert served() and served()  # the worker idle and woken twice since
        assert client.llen(newer.keys.wake) == 1
        assert w.poll() is None
    finally:
        stop_all([w])
        delete_queue(client, newer)
        delete_queue(client, other)


def test_jobs_cancel_says_why_a_newer_queue_refused_it_in_one_line(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    """Before: `scheduler jobs cancel ID` (d3a9c7f, a plain click command, not an
    AdminCommand) let NewerStorage (and any other refusal: a key edited by hand, OOM, Redis
    down) out as a traceback; every other command meeting it says one line, exit 1."""
    job = q.enqueue("echo", None, delay_ms=60_000)
    client.hset(q.keys.config, "generation", NEWER)
    got = CliRunner().invoke(main, ["jobs", "cancel", "--url", redis_url, "--queue", q.name, job])
    assert isinstance(got.exception, SystemExit), got.exception
    assert got.exit_code == 1
    assert "stored by a newer version" in got.output
