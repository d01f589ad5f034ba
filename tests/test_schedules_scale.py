"""Recurring schedules at scale, in miniature (the figures: bench/schedules_scale.py,
docs/performance.md section 32): defects the audit of 2026-12-04 found, each on a clock the
test controls."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from scheduler import BadArgument, Queue
from scheduler.schedules.recurring import BUFFER_SLOTS
from tests.conftest import Clock

MIN_MS = 60_000
T0 = 1_000_000 * MIN_MS


def drain(q: Queue, clock: Clock, now_ms: int, ran: Counter[str], *, limit: int) -> int:
    """Claim and complete everything due at `now_ms`; returns the claims it took."""
    clock.set_ms(now_ms)
    claims = 0
    while True:
        batch = q.claim("w", limit=limit, lease_ms=600_000)
        claims += 1
        if batch.jobs:
            q.complete_many([(j.id, j.token, None) for j in batch.jobs])
        ran.update(j.id for j in batch.jobs)
        if len(batch.jobs) < limit and not (0 <= batch.next_ms <= now_ms):
            return claims


def test_cron_buffers_running_low_together_are_refilled_before_they_run_out(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Found by the audit's simulation (4,000 schedules, claims of 1,000): cron schedules defined
    together run low on slots in the same minute, and a claim refilled 20 of them whatever it
    had claimed. Claiming all 400 in one call a minute, the 16 slots left were used up
    before the last refills: their runs were not placed for minutes (lost, not late). Now a
    claim refills at least as many as it claimed (each claimed run asks for one refill at most)."""
    q, clock = tq
    n = 400
    clock.set_ms(T0)
    for i in range(n):
        q.schedule(f"c{i:03d}", "t", cron="* * * * *")
    ran: Counter[str] = Counter()
    minutes = BUFFER_SLOTS + 4  # past the first buffer's end
    for m in range(1, minutes + 1):
        drain(q, clock, T0 + m * MIN_MS, ran, limit=500)
        assert client.scard(q.keys.schedules_refill) < n, m
    assert set(ran.values()) == {1}
    slots = [T0 + m * MIN_MS for m in range(1, minutes + 1)]
    expected = {f"schedule:c{i:03d}:{slot}" for i in range(n) for slot in slots}
    assert len(expected - set(ran)) == 0
    assert set(ran) == expected


def test_a_redefinition_keeps_the_run_a_starved_cron_schedule_owes(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Found by the audit (a deploy after an outage): after an outage longer than the cron
    buffer, each schedule waits for a refill before its missed run can be placed ('starved'),
    and one claim refills only some of many. A redefinition in that window placed the next
    future slot and dropped the run the misfire policy owed (run_once: the latest missed one):
    40 of 60 schedules lost it. Now the owed run is placed under the new definition."""
    q, clock = tq
    n = 30
    clock.set_ms(T0)
    names = [f"c{i:02d}" for i in range(n)]
    for name in names:
        q.schedule(name, "t", {"v": 1}, cron="* * * * *")
    back = T0 + 2 * BUFFER_SLOTS * MIN_MS + 1_000  # past the whole buffer
    clock.set_ms(back)
    q.claim("w", limit=1, lease_ms=600_000)
    starved = [s for s in names if client.hget(q.keys.schedule(s), "starved") == "1"]
    assert starved  # the window this test is about
    assert all(q.schedule(s, "t", {"v": 2}, cron="* * * * *") == "updated" for s in names)
    ran: Counter[str] = Counter()
    drain(q, clock, back, ran, limit=100)
    owed_slot = back - 1_000
    assert {f"schedule:{s}:{owed_slot}" for s in starved} <= set(ran)
    assert set(ran.values()) == {1}
    # Then each goes on at the next minute, once.
    drain(q, clock, back + MIN_MS, ran, limit=100)
    assert {f"schedule:{s}:{owed_slot + MIN_MS}" for s in names} <= set(ran)
    assert set(ran.values()) == {1}
    for s in names:  # the new definition goes on
        pending = client.hget(q.keys.schedule(s), "pending")
        assert pending == f"schedule:{s}:{owed_slot + 2 * MIN_MS}"
        assert q.get_job(pending).payload() == {"v": 2}


def test_the_cached_cron_check_still_refuses_bad_input_with_a_typed_error(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """check_cron is cached (a deploy's sync of 10,000 schedules spent most of its time in
    it): an unhashable or malformed expression is still a BadArgument, and nothing is stored."""
    q, _ = tq
    for bad in (["* * * * *"], "* * * *", "61 * * * *", "H * * * *"):
        with pytest.raises(BadArgument):
            q.schedule("x", "t", cron=bad)  # type: ignore[arg-type]
        with pytest.raises(BadArgument):  # the second time from the cache's side
            q.schedule("x", "t", cron=bad)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        q.schedule("x", "t", cron="* * * * *", tz="Nowhere/City")
    assert not client.exists(q.keys.schedule("x"))
    assert q.schedule("x", "t", cron="* * * * *") == "created"
