"""The wake-up LIST edited by hand into another type (`SET sched:{q}:wake garbage`).

Every worker of the queue stopped with exit 5 ("redis refused the worker's wake call"), the
code documented for an ACL problem, which supervisors are told not to restart: one advisory
key took the queue's workers down. Now the worker claims by polling while the key is bad, the
next enqueue's wake-up replaces it, and doctor names it."""

from __future__ import annotations

import time

import redis

from scheduler import Queue, Registry
from scheduler.admin.doctor import check_queue
from scheduler.worker import WorkerSettings
from tests.embedded_worker import run_until


def test_worker_goes_on_with_a_wake_key_of_another_type(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    ran: list[int] = []
    reg = Registry()

    @reg.task("t")
    def t(payload: int, ctx: object) -> None:
        ran.append(payload)

    q.enqueue("t", 1)  # claimed by the worker's first round, wake-up or not
    client.delete(q.keys.wake)
    client.set(q.keys.wake, "garbage")
    first_done: list[float] = []

    def done() -> bool:
        if ran == [1] and not first_done:
            first_done.append(time.monotonic())
        elif first_done and len(first_done) == 1 and time.monotonic() - first_done[0] > 0.6:
            # The worker has been idle, its wake-up pop refused, for a while: a raw due entry
            # (no enqueue, so no wake-up repairs the key) must still be claimed, by polling.
            first_done.append(0.0)
            client.set(f"{q.keys.prefix}spec:manual1", "2|t|||||||2")
            client.zadd(q.keys.due, {"manual1": 0})
        return ran == [1, 2]

    settings = WorkerSettings(queues=(q.name,), lease_ms=5_000, heartbeat_ms=1_000, grace_s=0)
    assert run_until(redis_url, reg, settings, done, timeout_s=10)


def test_enqueue_replaces_a_wake_key_of_another_type(client: redis.Redis, q: Queue) -> None:
    client.set(q.keys.wake, "garbage")
    assert [i.code for i in check_queue(client, q.name)] == ["wrong-type"]
    q.enqueue("t", 1)
    assert client.type(q.keys.wake) == "list"
    assert check_queue(client, q.name) == []
