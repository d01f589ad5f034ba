"""Review: the Redis server's clock stepping back and forward by 5 s, 5 min and 1 day between
calls (a failover to a replica whose clock differs, an NTP step, and a failover back), on the
test clock (tests/conftest.py tq). docs/durability.md "Clock steps" is the promise: after a
step back, whatever was placed by the clock before the step waits for the clock to catch up
(run_at, lease ends, schedule slots), but nothing runs twice, no lease lapses early, a rate key
is shut for one window (not for the step) and a job parked after the step is not the first the
count retention deletes. tests/test_clock_jumps.py covers steps of -1 s, -1 h and +1 h; these
add the forward-then-back case (state stamped by a clock a step ahead, then read by the one
behind it) and steps past a day.

"Before its run_at" is read by the clock of the moment: a job is never claimed while the
server's clock reads less than its run_at (the clock that accepted it wrote that run_at), so
after a step back it waits the step longer by the wall clock, and after a step forward it may
run earlier by the wall clock. That is what the tests below hold the product to."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.core.models import JobState
from tests.conftest import Clock

T0 = 10_000_000_000  # a server time, ms
SEC, MIN, DAY = 1_000, 60_000, 86_400_000
BACK = [5 * SEC, 5 * MIN, DAY]
LEASE = 30_000


def _claim(q: Queue, worker: str = "w", lease_ms: int = LEASE) -> list[Any]:
    return list(q.claim(worker, limit=10, lease_ms=lease_ms).jobs)


def _run(q: Queue) -> list[str]:
    """Claim what is due and complete it, until a claim says nothing more is due now (a claim
    that asked for a cron-buffer refill has the client refill it: the next one runs): the ids
    that ran."""
    ran: list[str] = []
    for _ in range(20):
        batch = q.claim("w", limit=10, lease_ms=LEASE)
        for j in batch.jobs:
            q.complete(j.id, j.token)
            ran.append(j.id)
        if len(batch.jobs) < 10 and not (0 <= batch.next_ms <= batch.now_ms):
            break
    return ran


def _park(q: Queue) -> str:
    jid = q.enqueue("t", None, max_attempts=1)
    [job] = _claim(q)
    assert q.fail(jid, job.token, ("E", "boom", ""), retryable=False).status == "dead"
    return jid


# --- defects ------------------------------------------------------------------------------


@pytest.mark.parametrize("step", BACK)
def test_a_rate_held_job_waits_one_window_not_the_step_after_a_step_back(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """At T0 + step (a clock ahead) A starts on a 1-per-second key and B is set aside until
    T0 + step + 1 s. Back at T0, the start is counted as at now (the rate-log clamp), so the key
    opens at T0 + 1 s, and C, enqueued after the step, runs then; B's slot was never clamped:
    it waits until T0 + step + 1 s (a day for a day's step), overtaken by every newer job."""
    q, clock = tq
    rated: dict[str, Any] = {"rate_limit": (1, SEC), "rate_key": "r"}
    clock.set_ms(T0 + step)
    a, b = q.enqueue("t", 1, **rated), q.enqueue("t", 2, **rated)
    assert _run(q) == [a]  # B set aside for the window
    clock.set_ms(T0)
    c = q.enqueue("t", 3, **rated)
    ran: list[str] = []
    for k in range(1, 4):  # three windows on
        clock.set_ms(T0 + k * (SEC + 1))
        ran += _run(q)
    assert ran[:1] == [b] and sorted(ran) == sorted([b, c])


@pytest.mark.parametrize("step", BACK)
def test_a_rate_held_job_alone_after_a_step_back_is_due_one_window_on_and_next_ms_says_so(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """No newer job of its key after the step (nothing reads the key's log): the first claim
    behind gives B its slot one window from now, and its next_ms says so (an idle worker slept
    toward the slot the clock ahead wrote); B runs at that slot, its run_at (T0 + step, the
    clock ahead's) notwithstanding."""
    q, clock = tq
    rated: dict[str, Any] = {"rate_limit": (1, SEC), "rate_key": "r"}
    clock.set_ms(T0 + step)
    a, b = q.enqueue("t", 1, **rated), q.enqueue("t", 2, **rated)
    assert _run(q) == [a]
    clock.set_ms(T0)
    batch = q.claim("w", limit=10, lease_ms=LEASE)
    assert list(batch.jobs) == [] and batch.next_ms == T0 + SEC
    clock.set_ms(T0 + SEC - 1)
    assert _run(q) == []
    clock.set_ms(T0 + SEC)
    assert _run(q) == [b]


@pytest.mark.parametrize("step", [DAY + 5, 2 * DAY])
def test_a_job_parked_after_a_step_back_of_over_a_day_is_kept_by_the_count_retention(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """docs/durability.md (Clock steps, Back): "a job parked after the step is scored no lower
    than the newest dead letter (the count retention, lowest first, deleted it at once
    before)". lua/lib/job.lua dead_score applies that only while the newest is at most a day
    ahead: a VM restored from a two-day-old snapshot (or a day and 5 ms) deletes every new
    dead letter at once, its job record with it (status() says JobNotFound), and the doc does
    not say so."""
    q, clock = tq
    q.set_dead_retention(max_count=3)
    clock.set_ms(T0 + step)
    old = [_park(q) for _ in range(3)]
    clock.set_ms(T0)
    new = _park(q)
    assert q.dead_ids()[0] == new, (q.dead_ids(), old)
    assert q.status(new) == JobState.DEAD


# --- what holds ---------------------------------------------------------------------------


@pytest.mark.parametrize("step", BACK)
def test_a_step_back_neither_lapses_a_running_lease_nor_reuses_a_token(
    tq: tuple[Queue, Clock], step: int
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    jid = q.enqueue("t", 1, max_attempts=3)
    [first] = _claim(q, "w1")
    clock.set_ms(T0 - step)
    assert _claim(q, "w2") == []  # still held: not handed to a second worker
    until, status = q.heartbeat([(jid, first.token)], lease_ms=LEASE)
    assert (until, status) == (T0 - step + LEASE, {jid: "held"})
    q.release([(jid, first.token)])
    [second] = _claim(q, "w2")
    assert second.id == jid and second.token != first.token
    assert q.complete_many([(jid, first.token, None)]) != ["done"]  # the old token: refused
    assert q.get_job(jid).state == JobState.LEASED
    q.complete(jid, second.token)
    assert q.get_job(jid).state == JobState.DONE


@pytest.mark.parametrize("step", [5 * MIN, DAY])
def test_a_lease_taken_by_a_clock_ahead_is_bounded_by_its_next_heartbeat(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """Forward then back: the lease (and its concurrency slot) ends at T0 + step + lease. The
    live worker's first heartbeat on the clock behind sets it to now + lease_ms, and the slot
    with it (flow_beat): once that worker dies, the key's next job runs a lease later, not a
    step later."""
    q, clock = tq
    keyed: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}
    clock.set_ms(T0 + step)
    a = q.enqueue("t", 1, **keyed)
    [ja] = _claim(q, "w1")
    clock.set_ms(T0)
    b = q.enqueue("t", 2, **keyed)
    until, status = q.heartbeat([(a, ja.token)], lease_ms=LEASE)
    assert (until, status) == (T0 + LEASE, {a: "held"})
    assert _claim(q, "w2") == []  # the key is full while A's lease holds
    clock.set_ms(T0 + LEASE + 1)  # w1 died after that heartbeat
    got = {j.id for j in _claim(q, "w2")}
    assert b in got  # the key's slot ended with the lowered lease


@pytest.mark.parametrize("step", [5 * MIN, DAY])
def test_a_dead_workers_lease_taken_by_a_clock_ahead_comes_back_the_step_later(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """Documented (docs/durability.md, Back: "a lease keeps its end (a dead worker's jobs come
    back the step later)"): with no heartbeat after the step back, the job stays leased until
    T0 + step + lease, not a lease; then it is reaped and runs, its first token refused."""
    q, clock = tq
    clock.set_ms(T0 + step)
    jid = q.enqueue("t", 1, max_attempts=3)
    [first] = _claim(q, "w1")
    clock.set_ms(T0 + LEASE + 1)
    assert _claim(q, "w2") == []
    clock.set_ms(T0 + step + LEASE + 1)
    [again] = _claim(q, "w2")
    assert again.id == jid and again.attempts == 2
    assert q.heartbeat([(jid, first.token)], lease_ms=LEASE)[1] == {jid: "stale"}


@pytest.mark.parametrize("step", BACK)
def test_no_job_is_claimed_before_its_run_at_by_the_clock_of_the_moment(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """A delayed job enqueued at T0 (run_at T0 + 10 s), and a job due at once enqueued by a
    clock a step ahead (run_at T0 + step): after the step back neither is claimed while the
    clock reads less than its run_at (they wait the step: documented), each is at its run_at."""
    q, clock = tq
    clock.set_ms(T0)
    delayed = q.enqueue("t", 1, delay_ms=10 * SEC)
    clock.set_ms(T0 + step)
    ahead = q.enqueue("t", 2)
    clock.set_ms(T0 - step)
    assert _run(q) == []
    run_at = {delayed: T0 + 10 * SEC, ahead: T0 + step}
    ran: list[str] = []
    for t in sorted({t + d for t in run_at.values() for d in (-1, 0)}):
        clock.set_ms(t)
        ran += _run(q)
        assert sorted(ran) == sorted(i for i, r in run_at.items() if r <= t), t
    assert q.counts().due == 0


@pytest.mark.parametrize("kind", ["every", "cron"])
@pytest.mark.parametrize("step", BACK)
def test_a_schedule_never_runs_a_slot_twice_and_resumes_after_a_step_back(
    tq: tuple[Queue, Clock], kind: str, step: int
) -> None:
    """One slot runs at `first`; the clock steps back. Silent (documented) until the clock
    passes the slot that ran, then one run a minute, each of a new slot."""
    q, clock = tq
    clock.set_ms(T0)
    if kind == "every":
        q.schedule("s", "t", every_ms=MIN)
    else:
        q.schedule("s", "t", cron="* * * * *")
    first = q.get_schedule("s").next_run_ms
    assert first is not None
    clock.set_ms(first)
    ran = _run(q)
    assert len(ran) == 1
    for at in (first - step, first - step + MIN, first - 1):
        clock.set_ms(at)
        assert _run(q) == []
    for k in range(1, 4):
        clock.set_ms(first + k * MIN)
        now_ran = _run(q)
        assert len(now_ran) == 1
        ran += now_ran
    assert len(set(ran)) == len(ran) == 4


@pytest.mark.parametrize("kind", ["every", "cron"])
@pytest.mark.parametrize("step", [5 * MIN, DAY])
def test_a_schedule_run_by_a_clock_ahead_is_not_run_again_after_the_step_back(
    tq: tuple[Queue, Clock], kind: str, step: int
) -> None:
    """Forward by a step (one late run, run_once), back again: the slots the clock ahead ran
    are not run again; the next run is the slot after them (documented: silent until then)."""
    q, clock = tq
    clock.set_ms(T0)
    if kind == "every":
        q.schedule("s", "t", every_ms=MIN)
    else:
        q.schedule("s", "t", cron="* * * * *")
    first = q.get_schedule("s").next_run_ms
    assert first is not None
    clock.set_ms(first + step)
    ran = _run(q)
    assert len(ran) == 1
    clock.set_ms(first + step + MIN)
    ran += _run(q)
    assert len(ran) == 2
    clock.set_ms(first + MIN)  # back by the step
    assert _run(q) == []
    nxt = q.get_schedule("s").next_run_ms
    assert nxt is not None and nxt > first + step + MIN
    clock.set_ms(nxt)
    ran += _run(q)
    assert len(ran) == 3 and len(set(ran)) == 3


@pytest.mark.parametrize("step", BACK)
def test_a_rate_key_lets_no_burst_through_across_a_forward_then_back_step(
    tq: tuple[Queue, Clock], step: int
) -> None:
    """2 per second: a step forward empties the window (2 more start: within the limit by that
    clock), the step back counts those starts as at now: nothing more starts in that window,
    also a job enqueued after the step. Then 2 a window: first the two set aside at T0 + step
    (they waited the whole step before: lib/flow.lua flow_rate_ahead), the fresh job after."""
    q, clock = tq
    rated: dict[str, Any] = {"rate_limit": (2, SEC), "rate_key": "r"}
    clock.set_ms(T0)
    for i in range(6):
        q.enqueue("t", i, **rated)
    assert len(_run(q)) == 2
    clock.set_ms(T0 + step)
    assert len(_run(q)) == 2
    clock.set_ms(T0 + 500)
    fresh = q.enqueue("t", 9, **rated)
    assert _run(q) == []
    clock.set_ms(T0 + 1_499)
    assert _run(q) == []
    clock.set_ms(T0 + 1_501)
    ran = _run(q)
    assert len(ran) == 2 and fresh not in ran
    clock.set_ms(T0 + 2_500)
    assert _run(q) == []
    clock.set_ms(T0 + 2_501)
    assert _run(q) == [fresh]


@pytest.mark.parametrize("step", BACK)
def test_a_concurrency_slot_is_freed_by_complete_after_a_step_back(
    tq: tuple[Queue, Clock], step: int
) -> None:
    q, clock = tq
    keyed: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}
    clock.set_ms(T0)
    a, b = q.enqueue("t", 1, **keyed), q.enqueue("t", 2, **keyed)
    [ja] = _claim(q)
    assert ja.id == a
    clock.set_ms(T0 - step)
    assert _claim(q) == []  # B is not due yet by this clock, and the key is full
    clock.set_ms(T0 + 1)
    assert _claim(q) == []  # due now, held by A's slot
    q.complete(a, ja.token)
    assert [j.id for j in _claim(q)] == [b]


@pytest.mark.parametrize("step", BACK)
def test_a_start_deadline_holds_across_a_step_back_and_passes_with_a_step_forward(
    tq: tuple[Queue, Clock], step: int
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    kept = q.enqueue("t", 1, start_within_ms=10 * SEC)
    late = q.enqueue("t", 2, start_within_ms=10 * SEC)
    clock.set_ms(T0 - step)
    assert _run(q) == []  # not due by this clock: not parked either
    assert q.status(kept) == JobState.SCHEDULED
    clock.set_ms(T0 + 5 * SEC)
    [j] = q.claim("w", limit=1, lease_ms=LEASE).jobs
    assert j.id == kept
    q.complete(j.id, j.token)
    clock.set_ms(T0 + step + 10 * SEC + 1)  # forward past the deadline
    assert _run(q) == []
    assert q.status(late) == JobState.DEAD


def test_a_dead_letter_parked_by_a_clock_a_day_ahead_is_trimmed_by_age_after_the_step(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Forward a day then back: a park on the clock behind is scored after the newest (kept
    from the count retention), so the age retention keeps it the step longer, and no longer:
    at T0 + DAY + max_age it is trimmed (not kept for good)."""
    q, clock = tq
    q.set_dead_retention(max_age_ms=MIN)
    clock.set_ms(T0 + DAY - 10)
    ahead = _park(q)
    clock.set_ms(T0)
    behind = _park(q)
    score = client.zscore(q.keys.dead, behind)
    assert score is not None and T0 + DAY - 10 < score <= T0 + DAY
    clock.set_ms(T0 + DAY + 2 * MIN)
    q.claim("w", limit=1, lease_ms=LEASE)  # applies the retention
    assert ahead not in q.dead_ids() and behind not in q.dead_ids()
