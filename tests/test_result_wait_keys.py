"""Queue.result / AsyncQueue.result leave no `result_wait:<id>` behind once the wait ends (a
result, a typed error, a timeout, a cancelled asyncio waiter), while other waiters on the same
job stay announced. Before: the announcement lived the whole timeout_s + 5 s after its waiter
had gone (up to a day), and the job's outcome then wrote a wake-up list for nobody that lived
as long as the record."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, JobCancelled, Queue, ResultTimeout
from tests.workers.procs import wait_for


def _wait_key(q: Queue, job_id: str) -> str:
    return q.keys.result_wait(job_id)


def test_a_cancelled_async_waiter_leaves_no_key(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("t", {})

    async def main() -> None:
        aq = AsyncQueue.from_url(redis_url, q.name)
        try:
            task = asyncio.create_task(aq.result(job_id, timeout_s=600))
            for _ in range(1500):  # liveness bound: until it announced itself
                if client.exists(_wait_key(q, job_id)):
                    break
                await asyncio.sleep(0.02)
            assert client.exists(_wait_key(q, job_id))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await aq.aclose()

    asyncio.run(main())
    assert client.exists(_wait_key(q, job_id)) == 0
    (lease,) = q.claim("w", limit=1).jobs
    q.complete(job_id, lease.token, 1)
    assert client.exists(q.keys.result_wake(job_id)) == 0  # nobody waits: no wake-up list


def test_a_woken_waiter_and_a_timed_out_one_leave_no_key(q: Queue, client: redis.Redis) -> None:
    job_id = q.enqueue("t", {})
    with pytest.raises(ResultTimeout):
        q.result(job_id, timeout_s=0.2)
    assert client.exists(_wait_key(q, job_id)) == 0
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.setdefault("r", q.result(job_id, timeout_s=600)))
    t.start()
    wait_for(lambda: client.exists(_wait_key(q, job_id)) == 1, 15)
    (lease,) = q.claim("w", limit=1).jobs
    q.complete(job_id, lease.token, {"ok": 1})
    t.join(30)
    assert got["r"] == {"ok": 1}
    assert client.exists(_wait_key(q, job_id)) == 0


def test_one_waiter_leaving_keeps_the_others_announced(q: Queue, client: redis.Redis) -> None:
    job_id = q.enqueue("t", {})
    got: dict[str, Any] = {}

    def long_wait() -> None:
        try:
            q.result(job_id, timeout_s=600)
        except JobCancelled as exc:
            got["r"] = exc

    t = threading.Thread(target=long_wait)
    t.start()
    wait_for(lambda: client.exists(_wait_key(q, job_id)) == 1, 15)
    with pytest.raises(ResultTimeout):  # a second, short waiter comes and goes
        q.result(job_id, timeout_s=0.2)
    assert client.exists(_wait_key(q, job_id)) == 1  # the long one is still there
    assert q.cancel(job_id) == "due"
    t.join(30)
    assert isinstance(got["r"], JobCancelled)
    assert client.exists(_wait_key(q, job_id)) == 0


def test_a_shorter_waiter_never_shortens_a_longer_ones_announcement(
    q: Queue, client: redis.Redis
) -> None:
    # Before: each waiter set the key's PX to its own wait, so the short one below cut the
    # long one's announcement to about 5 s; the job's outcome after that pushed no wake-up
    # and the long waiter learnt it only at its next re-read.
    job_id = q.enqueue("t", {})
    got: dict[str, Any] = {}

    def long_wait() -> None:
        try:
            q.result(job_id, timeout_s=600)
        except JobCancelled as exc:
            got["r"] = exc

    t = threading.Thread(target=long_wait)
    t.start()
    try:
        wait_for(lambda: client.exists(_wait_key(q, job_id)) == 1, 15)
        with pytest.raises(ResultTimeout):
            q.result(job_id, timeout_s=0.5)
        assert client.pttl(_wait_key(q, job_id)) > 60_000  # still the long one's ~605 s
    finally:
        assert q.cancel(job_id) == "due"
        t.join(30)
    assert isinstance(got["r"], JobCancelled)
