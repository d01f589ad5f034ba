"""The stats counter `rearm` (docs/glossary.md: a recurring schedule enqueues its next slot,
lib/rearm.lua): one each time a schedule places its next occurrence after its pending one left
due, claimed (claim's re-arm), or ended without running (cancelled, parked, purged), or, for a
cron schedule whose buffer ran out meanwhile, when the refill places it. Defining or resuming a
schedule places its first occurrence: no re-arm; nor is a retry's claim."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.operations import browsing
from tests.conftest import Clock

MIN_MS = 60_000


def rearms(client: redis.Redis, q: Queue) -> int:
    """Every minute bucket's `rearm` counter (the test clock's minutes are far in the past)."""
    keys = client.scan_iter(match=q.keys.prefix + "stats:*", count=1000)
    return sum(int(client.hget(k, "rearm") or 0) for k in keys)


def test_claim_and_cancel_of_the_pending_run_each_count_one_rearm(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    base = 1_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("tick", "t", every_ms=MIN_MS, max_attempts=3)
    assert rearms(client, q) == 0  # the first occurrence: no re-arm
    first = str(client.hget(q.keys.schedule("tick"), "pending"))
    at = int(str(client.hget(q.keys.job(first), "run_at_ms")))
    clock.set_ms(at)  # the first due, the next a minute later
    (run,) = q.claim("w", limit=5, lease_ms=30_000).jobs
    assert run.id == first and rearms(client, q) == 1  # claim placed the next one
    nxt = str(client.hget(q.keys.schedule("tick"), "pending"))
    assert q.fail(run.id, run.token, ValueError("x"), delay_ms=0).status == "retry"
    assert [j.id for j in q.claim("w", limit=5, lease_ms=30_000).jobs] == [first]
    assert rearms(client, q) == 1  # a retry's claim: none
    assert q.cancel(nxt) == "scheduled" and rearms(client, q) == 2  # its end re-armed the schedule
    assert str(client.hget(q.keys.schedule("tick"), "pending")) not in ("", nxt)
    _, _, series = q._run(browsing.queue_row(q.ops, 60))
    assert browsing.window_totals(series, (60,))["60m"].get("rearm") == rearms(client, q)


def test_a_cron_schedule_refilled_after_an_outage_counts_the_refills_placing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Claimed 500 minutes late, past its 64 buffered slots: the overdue occurrence is skipped
    (misfire) and the next cannot be placed until the claim's refill places slot 500 (one
    re-arm); claiming 500 places 501 (another)."""
    q, clock = tq
    base = 10_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("long", "t", cron="* * * * *", misfire="run_once")
    clock.set_ms(base + 500 * MIN_MS + 1_000)
    claimed = []
    for _ in range(3):  # the skip and the refill, then slot 500
        claimed += [j.id for j in q.claim("w", limit=5, lease_ms=30_000).jobs]
    assert [int(i.rsplit(":", 1)[1]) for i in claimed] == [base + 500 * MIN_MS]
    assert rearms(client, q) == 2
