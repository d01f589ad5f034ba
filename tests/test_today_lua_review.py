"""This session's Lua fixes, reviewed for regressions: each test failed on the code as reviewed."""

from __future__ import annotations

import redis

from scheduler import Queue
from tests.conftest import Clock

MIN_MS = 60_000
DAY_MS = 24 * 60 * MIN_MS


def test_a_cancelled_future_occurrence_does_not_block_a_redefinition(
    tq: tuple[Queue, Clock],
) -> None:
    """cancel arms the next occurrence through sched_place, which records the cancelled slot
    (tomorrow) as ran_ms; a redefinition then places from max(now, ran_ms): nothing of the new
    every-minute definition runs before tomorrow."""
    q, clock = tq
    now = 1_000 * DAY_MS + 1
    clock.set_ms(now)
    q.schedule("nightly", "t", every_ms=DAY_MS)
    q.cancel(q.get_schedule("nightly").pending)  # skip tomorrow's run
    assert q.schedule("nightly", "t", every_ms=MIN_MS) == "updated"
    nxt = q.get_schedule("nightly").next_run_ms
    assert nxt is not None and nxt <= now + MIN_MS, f"next run in {(nxt or 0) - now} ms"


def test_a_held_job_is_not_dropped_when_flow_held_is_of_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """flow_ck_promote ZREMs the job from flow:ckheld:<key>, then flow_unhold's pcall'd ZREM of
    flow:held errors (a string now) and it returns: the job is in no set at all."""
    q, clock = tq
    clock.set_ms(1_000_000)
    holder = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    waiter = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    (lease,) = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert lease.id == holder
    client.delete(q.keys.flow_held)
    client.set(q.keys.flow_held, "hand-edited")
    q.complete(holder, lease.token)
    places = [k for k in (q.keys.due, q.keys.prefix + "flow:ckheld:k", q.keys.dead)
              if client.zscore(k, waiter) is not None]  # fmt: skip
    assert places, f"{waiter} (spec kept: {client.exists(q.keys.spec(waiter))}) is in no place"
