"""A large backlog of one rate key must not starve the queue's other jobs. A claim brought back
every rate-held job whose slot had come (up to its batch plus the hold budget of 1,000), all at
their old run_at, ahead of the plain jobs due after them; it took the window's few starts and
spent its whole budget setting the rest aside again, every window. An audit measured 0 of 60
plain jobs run in 18 s behind 20,000 jobs at 10/200ms, Redis at 99% CPU. Now only the window's
room comes back (in claim's order), the others wait one window more. Server time is the test
clock (fq), so each window is exact."""

from __future__ import annotations

from typing import Any

import redis

from scheduler import JobSpec, Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock

RATE: dict[str, Any] = {"rate_limit": "10/200ms", "rate_key": "api"}
# The rate log's TTL is real time (window + 1 s, lua/lib/flow.lua flow_rate_settle) while the
# test clock stands still: a test of many claims (3,000 set aside) uses a window longer than
# it can take on a loaded machine (10/200ms: its log expired mid-test and a claim started 10).
SLOW_RATE: dict[str, Any] = {"rate_limit": "10/20s", "rate_key": "api"}
WINDOW_MS = 20_000


def claim_ids(q: Queue, limit: int) -> list[str]:
    return [j.id for j in q.claim("w", limit=limit, lease_ms=600_000).jobs]


def test_plain_jobs_are_claimed_beside_a_rate_backlog(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    backlog = q.enqueue_many([JobSpec("t", {"n": i}, **SLOW_RATE) for i in range(3_000)])
    first = claim_ids(q, 20)
    assert first == backlog[:10]  # the window's 10; the rest are being set aside
    while client.zcard(q.keys.due) > 0:  # a claim examines at most its hold budget
        assert claim_ids(q, 20) == []
    assert client.zcard(q.keys.flow_rheld) == 2_990
    clock.set_ms(T0 + 1)
    plain = [q.enqueue("t", {"plain": i}) for i in range(5)]  # due after the backlog's run_at
    for window in range(1, 4):
        clock.set_ms(T0 + WINDOW_MS * window + 1)
        got = claim_ids(q, 20)
        rated = [j for j in got if j in set(backlog)]
        assert len(rated) == 10, (window, len(rated))  # each window: its 10 starts
        if window == 1:
            assert set(plain) <= set(got), "the plain jobs waited behind the backlog"
        # Only the window's room came back into due: nothing left to set aside again.
        assert client.zcard(q.keys.due) == 0
        assert client.zcard(q.keys.flow_rheld) == 2_990 - 10 * window
    # In order: the backlog runs oldest first, window after window.
    assert claim_ids(q, 20) == []


def test_a_rate_slot_still_goes_to_the_highest_priority_of_many(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    low = q.enqueue_many([JobSpec("t", {"n": i}, **RATE) for i in range(50)])
    assert claim_ids(q, 50) == low[:10]
    urgent = q.enqueue("t", {"urgent": 1}, priority=9, **RATE)
    assert claim_ids(q, 50) == []  # set aside with the rest
    clock.set_ms(T0 + 201)
    got = claim_ids(q, 50)
    assert got[0] == urgent and len(got) == 10 and set(got[1:]) <= set(low[10:])
