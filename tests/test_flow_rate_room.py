"""A rate window's room goes to jobs that can start (lua/lib/flow.lua flow_rate_due): a job set
aside by its rate window whose concurrency key is full comes back without taking room. Before,
it took the room, claim then held it by its key, and a job of the same rate key that could have
started waited one more window (found by tests/test_flow_model.py's Hypothesis search)."""

from __future__ import annotations

from typing import Any

from scheduler import Queue
from tests.conftest import FLOW_T0, Clock

RATE = (2, 1_000)


def test_a_job_held_by_its_key_does_not_take_a_rate_windows_room(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    rated: dict[str, Any] = {"rate_limit": RATE, "rate_key": "r"}
    first = [q.enqueue("t", **rated) for _ in range(2)]  # fill the first window
    keyed = [q.enqueue("t", concurrency_key="a", concurrency_limit=1, **rated) for _ in range(2)]
    plain = q.enqueue("t", **rated)
    got = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert sorted(j.id for j in got) == sorted(first)  # the other three set aside by the window
    clock.set_ms(FLOW_T0 + 2_000)  # a new window: room for two
    got = q.claim("w", limit=10, lease_ms=60_000).jobs
    # One of key a (its limit is 1) and the plain one: the second of key a is held by its key.
    assert sorted(j.id for j in got) == sorted([keyed[0], plain])
    counts = q.counts()
    assert (counts.held_key_limit, counts.held_rate_window) == (1, 0)


def test_a_full_key_found_by_the_rate_step_still_holds_its_jobs(fq: tuple[Queue, Clock]) -> None:
    """Key a's one slot is taken after its jobs were set aside by the window: both come back
    without room and are held by the key; the window's room goes to the jobs that can start."""
    q, clock = fq
    rated: dict[str, Any] = {"rate_limit": RATE, "rate_key": "r"}
    first = [q.enqueue("t", **rated) for _ in range(2)]
    keyed = [q.enqueue("t", concurrency_key="a", concurrency_limit=1, **rated) for _ in range(2)]
    plain = [q.enqueue("t", **rated) for _ in range(2)]
    got = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert sorted(j.id for j in got) == sorted(first)
    assert q.counts().held_rate_window == 4
    holder = q.enqueue("t", concurrency_key="a", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=1, lease_ms=60_000).jobs] == [holder]
    clock.set_ms(FLOW_T0 + 2_000)
    got = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert sorted(j.id for j in got) == sorted(plain)
    counts = q.counts()
    assert counts.held_key_limit == len(keyed) and counts.held_rate_window == 0
