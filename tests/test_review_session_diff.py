"""Review of the session's changes (git diff 9b8633f..HEAD -- lua scheduler): each test failed
on the code before its fix. Real scripts on the test clock."""

from __future__ import annotations

from collections import Counter

import pytest
from redis.exceptions import RedisError

from scheduler import Queue
from scheduler.core.errors import CorruptKey
from scheduler.operations import leasing
from tests.conftest import Clock, dump_queue
from tests.test_review_schedule_crashes import _work

T0 = 1_000_000
MIN_MS = 60_000
BASE = 10_000 * MIN_MS


def _pending(q: Queue, name: str) -> str:
    return str(q.client.hget(q.keys.prefix + "schedule:" + name, "pending"))


@pytest.mark.parametrize("how", ["remove", "pause"])
def test_a_withdrawal_that_would_park_children_with_leased_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], how: str
) -> None:
    # sched_unpend parks the occurrence's waiting children (dead_letter: ZREM leased) after
    # its first write: a leased key edited by hand must refuse the call whole, as a dead key
    # of another type does. It raised half-way: the child left flow:waiting and flow:held
    # but never reached the dead list (lost), the occurrence out of due but still pending.
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=MIN_MS)
    occ = _pending(q, "s")
    q.enqueue("t", after=[occ])
    q.client.set(q.keys.leased, "x")
    before = dump_queue(q.client, q)
    with pytest.raises(CorruptKey):
        if how == "remove":
            q.remove_schedule("s")
        else:
            q.pause_schedule("s")
    assert dump_queue(q.client, q) == before


def test_catch_up_after_a_long_outage_runs_the_latest_n_of_more_cron_schedules_than_one_refill(
    tq: tuple[Queue, Clock],
) -> None:
    # An outage longer than the cron buffer starves every cron schedule at once; a claim's
    # refill tops up at most 20 of them. The claim after it must not decide a schedule whose
    # refill is still outstanding on its stale buffer: it ran the oldest buffered run, 500
    # minutes late, instead of the latest N.
    q, clock = tq
    clock.set_ms(BASE + 1)
    names = [f"c{i:02d}" for i in range(22)]
    for n in names:
        q.schedule(n, "t", cron="* * * * *", misfire="catch_up:100")
    done: Counter[str] = Counter()
    _work(q, clock, BASE + 500 * MIN_MS + 1_000, done)
    for n in names:
        minutes = sorted(
            (int(i.rsplit(":", 1)[1]) - BASE) // MIN_MS for i in done if i.split(":")[1] == n
        )
        assert minutes == list(range(401, 501)), n


def test_a_refill_that_keeps_failing_defers_a_stale_slot_a_bounded_number_of_claims(
    tq: tuple[Queue, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    # While the refill is still asked for, claims keep waiting for it; one that can never
    # happen (every client's refill fails) must not hold the run back forever, nor make a
    # worker claim it in a loop: after SCHED_DEFER_MOST claims the stale buffer decides.
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("c", "t", cron="* * * * *", misfire="catch_up:100")

    def broken(*_a: object, **_k: object) -> object:
        raise RedisError("refill down")
        yield  # a generator, as the real one

    monkeypatch.setattr(leasing, "refill_schedules", broken)
    clock.set_ms(BASE + 500 * MIN_MS + 1_000)
    claims = 0
    while claims < 200:
        claims += 1
        batch = q.claim("w", limit=10, lease_ms=30_000)
        if batch.jobs:
            break
        assert 0 <= batch.next_ms <= BASE + 500 * MIN_MS + 1_000  # still due: not dropped
    assert [j.id.split(":")[1] for j in batch.jobs] == ["c"]
    assert claims == 51
    assert q.client.hget(q.keys.schedule("c"), "deferrals") == "50"
