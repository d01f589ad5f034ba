"""Priority inside one concurrency key (docs/flow-control.md, "Priority inside a key"): once a
job of the key is set aside, the key is FIFO by run_at whatever the priorities. Its held jobs
come back oldest first, and a newer job of the key, even of priority 9, is held behind them, so
no job of a key is held for ever by newer work of that key (the starvation 5733db5 removed for
mixed limits). Priority orders a key's jobs only while none is set aside: claim meets due jobs
in flow order. These tests pin the documented rule; changing it must change the page too."""

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


def test_a_busy_keys_held_jobs_start_oldest_first_whatever_their_priority(
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
    assert got == old, "the key's older held job starts first, whatever the priorities"
    assert q.status(urgent) == JobState.HELD
    q.complete(old, token, None)
    assert [i for i, _ in _claim(q)] == [urgent]


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
    # step (5 ms) one lease ends and one more priority-9 job comes. A priority-0 job let back
    # into due is met after a priority-9 one let back in the same claim, so the newer jobs may
    # overtake it, but only until it has aged (priority_aging_ms): then claim meets it first.
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
        # Aged at run_at + AGING_MS; met at the next claim that finds it let back.
        assert started[job] <= run_at + AGING_MS + 2 * 5
    overtaken = [j for j in low if any(started[h] < started[j] for h in high if h in started)]
    assert overtaken, "no newer priority-9 job started before an older priority-0 one"
