"""Second review of the session's changes (git diff c8c89d7..HEAD): each test failed on the code
before its fix. Real scripts on the test clock."""

from __future__ import annotations

import pytest
from redis.exceptions import RedisError

from scheduler import Queue
from scheduler.operations import leasing
from tests.conftest import Clock

MIN_MS = 60_000
BASE = 10_000 * MIN_MS
DEFER_MOST = 50  # lua/lib/schedule.lua SCHED_DEFER_MOST


def _refill_down(*_a: object, **_k: object) -> object:
    raise RedisError("refill down")
    yield  # a generator, as the real one


@pytest.mark.parametrize("edited", ["-inf", "-1e300", "-5000000"])
def test_a_hand_edited_deferral_count_cannot_hold_a_stale_slot_back_for_ever(
    tq: tuple[Queue, Clock], monkeypatch: pytest.MonkeyPatch, edited: str
) -> None:
    # sched_rearm read `deferrals` with tonumber: '-inf' stayed '-inf' (fmt(-inf + 1)), and a
    # large negative count went on for millions of claims, so while the refill kept failing
    # the stale slot was deferred at every claim for ever (a worker claiming it in a loop,
    # the schedule never running). Read strictly, a hand edit reads as 1: bounded again.
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("c", "t", cron="* * * * *", misfire="catch_up:100")
    monkeypatch.setattr(leasing, "refill_schedules", _refill_down)
    now = BASE + 500 * MIN_MS + 1_000
    clock.set_ms(now)
    first = q.claim("w", limit=10, lease_ms=30_000)
    assert first.jobs == [] and 0 <= first.next_ms <= now  # deferred once, still due
    q.client.hset(q.keys.schedule("c"), "deferrals", edited)
    claims = 0
    while claims < 2 * DEFER_MOST:
        claims += 1
        batch = q.claim("w", limit=10, lease_ms=30_000)
        if batch.jobs:
            break
        assert 0 <= batch.next_ms <= now  # still due: not dropped
    assert [j.id.split(":")[1] for j in batch.jobs] == ["c"], f"{claims} claims ran nothing"
    assert claims <= DEFER_MOST
