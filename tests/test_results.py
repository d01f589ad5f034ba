"""Queue.result / AsyncQueue.result (issue 13): the handler's result, typed errors for dead,
cancelled, unknown and not-yet-finished jobs, and a wake-up (no polling) that expires with the
outcome record."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, JobCancelled, JobDead, JobNotFound, Queue, ResultTimeout
from scheduler.core.errors import BadArgument
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry
from tests.embedded_worker import worker_thread
from tests.workers.procs import wait_for

registry = Registry()
release = threading.Event()


@registry.task("results.gated")
def gated(payload: Any, ctx: Any) -> dict[str, Any]:
    # Holds the job leased until the test has started waiting on it.
    assert release.wait(30)
    return {"sum": payload["a"] + payload["b"]}


class Boom(Exception):
    pass


@registry.task("results.broken", max_attempts=1)
def broken(payload: Any, ctx: Any) -> None:
    raise Boom("it broke")


def running_worker(redis_url: str, queue: str) -> AbstractContextManager[Worker]:
    return worker_thread(redis_url, registry, WorkerSettings(queues=(queue,), result_ttl_ms=60_000))


def wake_key(q: Queue, job_id: str) -> str:
    return q.keys.prefix + "result:" + job_id


def announce(client: redis.Redis, q: Queue, job_id: str) -> None:
    """What Queue.result() does before its last state check: say a waiter is there."""
    client.set(q.keys.prefix + "result_wait:" + job_id, "1", px=60_000)


def test_a_job_nobody_waits_for_leaves_no_wake_up_key(q: Queue, client: redis.Redis) -> None:
    done_id, dead_id, cancelled_id = (q.enqueue("t", {}, max_attempts=1) for _ in range(3))
    assert q.cancel(cancelled_id) == "due"
    jobs = {j.id: j for j in q.claim("w1", limit=2).jobs}
    q.complete(done_id, jobs[done_id].token, "ok")
    q.fail(dead_id, jobs[dead_id].token, ("E", "bad", ""), retryable=False)
    for job_id in (done_id, dead_id, cancelled_id):
        assert client.exists(wake_key(q, job_id)) == 0, job_id
    assert q.result(done_id, timeout_s=1) == "ok"  # the state itself answers


def test_result_waits_for_a_worker_to_complete_the_job(redis_url: str, q: Queue) -> None:
    release.clear()
    job_id = q.enqueue("results.gated", {"a": 2, "b": 3})
    with running_worker(redis_url, q.name):
        try:
            got: list[Any] = []
            waiter = threading.Thread(target=lambda: got.append(q.result(job_id, timeout_s=30)))
            waiter.start()
            release.set()  # the handler may finish before or after the waiter blocks: both work
            waiter.join(30)
            assert got == [{"sum": 5}]
            # Asked again later, the stored result answers at once.
            assert q.result(job_id, timeout_s=1) == {"sum": 5}
        finally:
            release.set()


def test_a_waiter_blocked_before_completion_is_woken(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("t", {})
    (job,) = q.claim("w1", limit=1).jobs
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(q.result(job_id, timeout_s=30)))
    waiter.start()
    # Complete only once the waiter is blocked on the wake-up list (CLIENT LIST shows blmove).
    wait_for(lambda: any(c.get("cmd") == "blmove" for c in client.client_list()),
             what="the waiter blocked on its wake-up")  # fmt: skip
    q.complete(job_id, job.token, [1, "two"])
    waiter.join(30)
    assert got == [[1, "two"]]
    # Every waiter wakes, not only the first: the element stays (BLMOVE onto itself).
    assert client.lrange(wake_key(q, job_id), 0, -1) == ["done"]


def test_dead_raises_job_dead_with_the_last_error(redis_url: str, q: Queue) -> None:
    job_id = broken.enqueue(q, {})
    with running_worker(redis_url, q.name), pytest.raises(JobDead) as info:
        q.result(job_id, timeout_s=30)
    assert info.value.job_id == job_id
    assert info.value.error_type is not None and "Boom" in info.value.error_type
    assert info.value.error_message == "it broke"


def test_a_job_parked_and_deleted_at_once_raises_job_dead_to_its_waiter(
    q: Queue, client: redis.Redis
) -> None:
    # A dead retention of max_count=0 deletes a job as it is parked; a waiter already blocked
    # on it was told JobNotFound ("no such job"), though the park's wake-up said "dead".
    q.set_dead_retention(max_count=0)
    job_id = q.enqueue("t", {}, max_attempts=1)
    (job,) = q.claim("w1", limit=1).jobs
    got: list[BaseException] = []

    def wait() -> None:
        try:
            q.result(job_id, timeout_s=30)
        except (JobDead, JobNotFound) as exc:
            got.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: any(c.get("cmd") == "blmove" for c in client.client_list()),
             what="the waiter blocked on its wake-up")  # fmt: skip
    q.fail(job_id, job.token, ("E", "bad", ""), retryable=False)
    waiter.join(30)
    with pytest.raises(JobNotFound):  # deleted with the park
        q.get_job(job_id)
    assert len(got) == 1 and isinstance(got[0], JobDead), got
    assert got[0].reason == "deleted by the dead-letter retention"


def test_cancelled_raises_job_cancelled(q: Queue, client: redis.Redis) -> None:
    job_id = q.enqueue("t", {}, delay_ms=60_000)
    announce(client, q, job_id)
    assert q.cancel(job_id) == "scheduled"
    with pytest.raises(JobCancelled):
        q.result(job_id, timeout_s=1)
    assert client.lrange(wake_key(q, job_id), 0, -1) == ["cancelled"]


def test_unknown_job_raises_job_not_found(q: Queue) -> None:
    with pytest.raises(JobNotFound):
        q.result("no-such-job", timeout_s=1)


def test_not_finished_in_time_raises_a_timeout_error(q: Queue) -> None:
    job_id = q.enqueue("t", {}, delay_ms=60_000)
    with pytest.raises(ResultTimeout) as info:
        q.result(job_id, timeout_s=0.2)
    assert isinstance(info.value, TimeoutError)
    assert q.status(job_id) == "scheduled"


@pytest.mark.parametrize("bad", [0, -1, True, "1", 86_401])
def test_bad_timeout_is_refused(q: Queue, bad: Any) -> None:
    job_id = q.enqueue("t", {})
    with pytest.raises(BadArgument):
        q.result(job_id, timeout_s=bad)


def test_the_wake_up_expires_with_the_record(q: Queue, client: redis.Redis) -> None:
    short = Queue(client, q.name, result_ttl_ms=5_000)
    job_id = short.enqueue("t", {})
    announce(client, q, job_id)
    (job,) = short.claim("w1", limit=1).jobs
    short.complete(job_id, job.token, "ok")
    record_ms = client.pttl(q.keys.job(job_id))
    wake_ms = client.pttl(wake_key(q, job_id))
    assert 0 < wake_ms <= 5_000 and 0 < record_ms <= 5_000
    assert abs(record_ms - wake_ms) < 1_000
    assert client.llen(wake_key(q, job_id)) == 1


def test_a_park_wakes_a_waiter_and_is_bounded(q: Queue, client: redis.Redis) -> None:
    job_id = q.enqueue("t", {}, max_attempts=1)
    announce(client, q, job_id)
    (job,) = q.claim("w1", limit=1).jobs
    assert q.fail(job_id, job.token, ("E", "bad", ""), retryable=False).status == "dead"
    assert client.lrange(wake_key(q, job_id), 0, -1) == ["dead"]
    assert 0 < client.pttl(wake_key(q, job_id)) <= 3_600_000
    with pytest.raises(JobDead) as info:
        q.result(job_id, timeout_s=1)
    assert (info.value.error_type, info.value.error_message) == ("E", "bad")


def test_a_requeued_dead_job_does_not_answer_with_its_old_wake_up(
    q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("t", {}, max_attempts=1)
    announce(client, q, job_id)
    (job,) = q.claim("w1", limit=1).jobs
    q.fail(job_id, job.token, ("E", "bad", ""), retryable=False)
    assert q.requeue_dead([job_id]) == 1
    # The stale 'dead' wakes the waiter, which re-reads the state, drops it and waits on.
    with pytest.raises(ResultTimeout):
        q.result(job_id, timeout_s=0.3)
    assert client.exists(wake_key(q, job_id)) == 0
    (again,) = q.claim("w2", limit=1).jobs
    q.complete(job_id, again.token, 7)
    assert q.result(job_id, timeout_s=1) == 7


def test_async_result(redis_url: str, q: Queue) -> None:
    job_id = q.enqueue("t", {})
    (job,) = q.claim("w1", limit=1).jobs

    async def go() -> Any:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            aq = AsyncQueue(client, q.name)
            waiter = asyncio.create_task(aq.result(job_id, timeout_s=30))
            await asyncio.sleep(0)  # let it start; complete may come before or after it blocks
            await aq.complete(job_id, job.token, {"ok": True})
            return await waiter
        finally:
            await client.aclose()

    assert asyncio.run(go()) == {"ok": True}


def test_the_blocking_result_is_refused_on_a_running_event_loop(redis_url: str, q: Queue) -> None:
    """A sync `q.result` in async code blocked the loop for the whole wait: an embedded worker
    on that loop could not run the job, and the caller got ResultTimeout after timeout_s, the
    job still due. Refused at once now, naming AsyncQueue.result; off the loop it still works."""
    reg = Registry()

    @reg.task("results.add")
    async def add(payload: Any, ctx: Any) -> int:
        return int(payload["a"]) + int(payload["b"])

    job_id = add.enqueue(q, {"a": 1, "b": 2})

    async def go() -> Any:
        async with AsyncQueue.from_url(redis_url, q.name) as aq:
            worker = Worker(aq.client, reg, WorkerSettings(queues=(q.name,)))
            running = asyncio.create_task(worker.run(install_signals=False))
            try:
                with pytest.raises(BadArgument, match=r"await AsyncQueue\.result"):
                    q.result(job_id, timeout_s=5)
                return await aq.result(job_id, timeout_s=10)
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)

    assert asyncio.run(go()) == 3
    assert q.result(job_id, timeout_s=1) == 3  # no loop in this thread: the blocking wait
