"""Priority inside one concurrency key (docs/flow-control.md, "Priority inside a key"): once a
job of the key is set aside, the key's held jobs come back in order of place: run_at less
priority_aging_ms / 9 per priority level (tests/test_flow_held_priority.py has the rule's
edges). A newer job of the key is held behind those placed before it, so no job of a key is
held for ever by newer work of that key (the starvation 5733db5 removed for mixed limits):
newer ones overtake it for at most priority_aging_ms. These tests pin the documented rule;
changing it must change the page too."""

from __future__ import annotations

from typing import Any

from scheduler import JobState, Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock

LEASE_MS = 60_000
AGING_MS = 50
KEY: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}


def _claim(q: Queue) -> list[tuple[str, str]]:
    return [(j.id, j.token) for j in q.claim("w", limit=10, lease_ms=LEASE_MS).jobs]


def test_a_busy_keys_held_jobs_start_by_place_priority_first(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    a = q.enqueue("t", "a", **KEY)
    [(got, token)] = _claim(q)
    assert got == a
    old = q.enqueue("t", "old", **KEY)
    clock.set_ms(T0 + 1)
    urgent = q.enqueue("t", "urgent", priority=9, **KEY)
    assert _claim(q) == []  # both held: k is full
    assert q.status(old) == q.status(urgent) == JobState.HELD
    assert q.get_job(urgent).fields["flow_reason"] == "limited by key k (1 leased)"
    q.complete(a, token, None)
    [(got, token)] = _claim(q)
    # urgent's place: 1 ms after old, less 60 s (priority 9 of the default aging). Before the
    # hold set was scored by place, old started first.
    assert got == urgent, "the key's priority-9 held job starts first"
    assert q.status(old) == JobState.HELD
    q.complete(urgent, token, None)
    assert [i for i, _ in _claim(q)] == [old]


def test_priority_orders_a_keys_jobs_while_none_is_set_aside(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    low = q.enqueue("t", "low", **KEY)
    clock.set_ms(T0 + 1)
    high = q.enqueue("t", "high", priority=9, **KEY)
    # Neither is held yet: claim meets the priority-9 one first, and k is then full for the
    # other, which is set aside.
    assert [i for i, _ in _claim(q)] == [high]
    assert q.status(low) == JobState.HELD


def test_no_job_of_a_key_is_held_for_ever_by_newer_higher_priority_jobs(
    fq: tuple[Queue, Clock],
) -> None:
    # Steady traffic of priority-9 jobs on a limit-1 key with priority-0 jobs held in it: each
    # step (5 ms) one lease ends and one more priority-9 job comes. A priority-9 job is placed
    # priority_aging_ms before its run_at, so the newer jobs overtake a priority-0 one, but
    # only those that came less than priority_aging_ms after it: then it is let back first.
    q, clock = fq
    q.client.hset(q.keys.prefix + "config", "priority_aging_ms", AGING_MS)
    first = q.enqueue("t", "first", **KEY)
    [(got, token)] = _claim(q)
    assert got == first
    low: dict[str, int] = {}
    for n in range(3):
        clock.set_ms(T0 + 1 + n)  # one ms each: a key's held jobs come back by run_at
        low[q.enqueue("t", f"low{n}", **KEY)] = T0 + 1 + n
    assert _claim(q) == []
    started: dict[str, int] = {}
    high: list[str] = []
    leased = (first, token)
    for step in range(1, 40):
        now = T0 + 5 * step
        clock.set_ms(now)
        high.append(q.enqueue("t", f"high{step}", priority=9, **KEY))
        q.complete(*leased, None)
        [leased] = _claim(q)
        started[leased[0]] = now
    for job, run_at in low.items():
        assert job in started, "a priority-0 job was held for ever behind newer jobs of its key"
        # Overtaken until run_at + AGING_MS, then the key drains the ones placed before it
        # (the older priority-0 ones), one a step.
        assert started[job] <= run_at + AGING_MS + (len(low) + 1) * 5
    overtaken = [j for j in low if any(started[h] < started[j] for h in high if h in started)]
    assert overtaken, "no newer priority-9 job started before an older priority-0 one"
