"""Priority inside a concurrency key's hold set (docs/flow-control.md, "Priority inside a
key"): a held job's place is its run_at less priority_aging_ms / 9 per priority level, so when
the key has room a higher-priority held job starts ahead of older lower-priority ones held
less than that before it, and no job waits more than priority_aging_ms behind newer ones.
Before, the hold set was scored by run_at alone: the key's oldest held job started first,
whatever the priorities. Entries written by the previous version (scored by run_at) are read
as priority 0 and still come back, into due at the job's own run_at."""

from __future__ import annotations

from typing import Any

import redis

from scheduler import JobState, Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock

AGING_MS = 9_000  # 1,000 ms of place per priority level
KEY: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}


def _claim(q: Queue) -> list[tuple[str, str]]:
    return [(j.id, j.token) for j in q.claim("w", limit=10, lease_ms=600_000).jobs]


def _held_key(q: Queue) -> str:
    return q.keys.prefix + "flow:ckheld:k"


def _busy(q: Queue, clock: Clock) -> tuple[str, str]:
    q.client.hset(q.keys.prefix + "config", "priority_aging_ms", AGING_MS)
    clock.set_ms(T0)
    a = q.enqueue("t", "a", **KEY)
    [lease] = _claim(q)
    assert lease[0] == a
    return lease


def test_the_higher_priority_held_job_starts_first_when_the_key_frees(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    lease = _busy(q, clock)
    old = q.enqueue("t", "old", **KEY)
    clock.set_ms(T0 + 2_000)
    mid = q.enqueue("t", "mid", priority=1, **KEY)
    clock.set_ms(T0 + 3_000)
    urgent = q.enqueue("t", "urgent", priority=9, **KEY)  # 9,000 ms of place
    assert _claim(q) == []
    assert {q.status(j) for j in (old, mid, urgent)} == {JobState.HELD}
    order = []
    for _ in range(3):
        q.complete(*lease, None)
        [lease] = _claim(q)
        order.append(lease[0])
    # urgent: T0 + 3,000 - 9,000; old: T0; mid: T0 + 2,000 - 1,000. Before: old, mid, urgent.
    assert order == [urgent, old, mid]


def test_a_job_held_longer_than_the_aging_ahead_of_it_keeps_its_place(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    lease = _busy(q, clock)
    old = q.enqueue("t", "old", **KEY)
    clock.set_ms(T0 + AGING_MS + 1)
    urgent = q.enqueue("t", "urgent", priority=9, **KEY)
    assert _claim(q) == []
    q.complete(*lease, None)
    [lease] = _claim(q)
    assert lease[0] == old  # held more than priority_aging_ms before: never overtaken
    q.complete(*lease, None)
    assert [i for i, _ in _claim(q)] == [urgent]


def test_a_higher_priority_job_with_room_is_not_held_behind_lower_ones(
    fq: tuple[Queue, Clock],
) -> None:
    """Limit 2, one leased and one priority-0 job held (waiting behind an older one let back):
    a priority-9 job met with the key's room starts; it is not held behind it."""
    q, clock = fq
    lease = _busy(q, clock)
    low = q.enqueue("t", "low", **KEY)
    assert _claim(q) == []
    clock.set_ms(T0 + 1_000)
    urgent = q.enqueue("t", "urgent", priority=9, concurrency_key="k", concurrency_limit=2)
    [second] = _claim(q)
    assert second[0] == urgent  # before: held behind low
    q.complete(*lease, None)
    assert _claim(q) == []
    assert q.status(low) == JobState.HELD  # its own limit (1) has no room while urgent runs
    q.complete(*second, None)
    assert [i for i, _ in _claim(q)] == [low]


def test_an_entry_written_by_the_previous_version_still_comes_back(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """The previous version scored a held job by its run_at whatever its priority: such an
    entry is read as priority 0, comes back in its run_at order and goes into due at its run_at
    (the hold set's score is no run_at for a prioritized job any more)."""
    q, clock = fq
    lease = _busy(q, clock)
    clock.set_ms(T0 + 1_000)
    legacy = q.enqueue("t", "legacy", priority=5, **KEY)
    clock.set_ms(T0 + 2_000)
    new = q.enqueue("t", "new", priority=5, **KEY)
    clock.set_ms(T0 + 3_000)
    low = q.enqueue("t", "low", **KEY)
    assert _claim(q) == []
    client.zadd(_held_key(q), {legacy: T0 + 1_000})  # as the previous version wrote it
    q.complete(*lease, None)  # the key's slot is free: its first held job goes into due
    assert client.zscore(q.keys.due, new) == T0 + 2_000  # its own run_at, not its place
    order = []
    for _ in range(3):
        [lease] = _claim(q)
        order.append(lease[0])
        q.complete(*lease, None)
    # new: T0 + 2,000 - 5,000; legacy (read as priority 0): T0 + 1,000; low: T0 + 3,000.
    assert order == [new, legacy, low]
    assert client.zscore(q.keys.due, legacy) is None and client.zcard(_held_key(q)) == 0
