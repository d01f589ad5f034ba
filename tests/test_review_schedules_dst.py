"""Review of recurring schedules as a user meets them: a 02:30 Europe/Berlin daily job on the
spring-forward and fall-back days (run, created, redefined, resumed and missed around the
change), runs that fail to max attempts, pause and resume, validation, and run_schedule_now
beside the regular slots. Real scripts on the test clock (tests/conftest.py `tq`): no test
waits for real time.

The two reschedule tests were strict xfails (a run-now job and a schedule run's retry refused
as the schedule's pending run), fixed since; the others guard behaviour checked here that held."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from scheduler import Backoff, BadArgument, Queue
from tests.conftest import Clock

MIN_MS = 60_000
HOUR_MS = 3_600_000
T0 = 1_000 * HOUR_MS  # a multiple of every interval used here
BERLIN = "Europe/Berlin"


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


def slot_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def pending_slot(q: Queue, name: str) -> int:
    pending = q.get_schedule(name).pending
    assert pending, f"{name} has no pending run"
    return slot_of(pending)


def work(q: Queue, clock: Clock, now_ms: int, done: Counter[str], *, fail: bool = False) -> None:
    """One worker pass at `now_ms`: claim everything due and complete (or fail) it, counting
    each claim in `done`. Nothing may be claimed before its run time."""
    clock.set_ms(now_ms)
    for _ in range(1_000):
        batch = q.claim("w", limit=10, lease_ms=30_000)
        for job in batch.jobs:
            assert job.run_at_ms is None or job.run_at_ms <= now_ms, job.id
            if fail:
                q.fail(job.id, job.token, ("Boom", "failed", ""))
            else:
                q.complete(job.id, job.token)
            done[job.id] += 1
        if not batch.jobs and not (0 <= batch.next_ms <= now_ms):
            return
    raise AssertionError("claims did not settle")


def every_quarter(q: Queue, clock: Clock, start: int, hours: int) -> Counter[str]:
    done: Counter[str] = Counter()
    for k in range(1, hours * 4 + 1):
        work(q, clock, start + k * 15 * MIN_MS, done)
    return done


# -- Europe/Berlin 02:30 daily across the two changes of 2026 ------------------------------------


@pytest.mark.parametrize(
    ("day", "expected"),
    [
        # 29 March: 02:30 does not exist; shifted by the gap to 03:30 CEST (01:30 UTC).
        ((2026, 3, 28), [ms(2026, 3, 29, 1, 30), ms(2026, 3, 30, 0, 30)]),
        # 25 October: 02:30 happens twice; its first pass, 02:30 CEST (00:30 UTC), only.
        ((2026, 10, 24), [ms(2026, 10, 25, 0, 30), ms(2026, 10, 26, 1, 30)]),
    ],
)
def test_a_0230_berlin_daily_runs_once_on_the_change_day_and_the_day_after(
    tq: tuple[Queue, Clock], day: tuple[int, int, int], expected: list[int]
) -> None:
    """Held: README "a local time that does not exist (spring forward) runs once, shifted
    forward by the gap (02:30 → 03:30); a local time that happens twice (fall back) runs
    once, at its first occurrence", with a worker claiming every 15 minutes for two days."""
    q, clock = tq
    start = ms(*day, 12)
    clock.set_ms(start)
    q.schedule("nightly", "t", cron="30 2 * * *", tz=BERLIN)
    done = every_quarter(q, clock, start, 48)
    assert sorted(slot_of(i) for i in done) == expected
    assert set(done.values()) == {1}


def test_defined_redefined_or_resumed_inside_the_gap_runs_todays_shifted_0330(
    tq: tuple[Queue, Clock],
) -> None:
    """Held: at 03:10 CEST on 29 March (01:10 UTC), after the gap, today's 02:30 is still to
    come (at 03:30 CEST): a schedule created, redefined or resumed then runs it, once."""
    q, clock = tq
    clock.set_ms(ms(2026, 3, 28, 12))
    q.schedule("paused", "t", cron="30 2 * * *", tz=BERLIN)
    assert q.pause_schedule("paused") == "paused"
    in_gap = ms(2026, 3, 29, 1, 10)
    clock.set_ms(in_gap)
    assert q.resume_schedule("paused") == "resumed"
    assert q.schedule("fresh", "t", cron="30 2 * * *", tz=BERLIN) == "created"
    assert q.schedule("fresh", "t", {"v": 2}, cron="30 2 * * *", tz=BERLIN) == "updated"
    today = ms(2026, 3, 29, 1, 30)
    assert pending_slot(q, "paused") == pending_slot(q, "fresh") == today
    done = every_quarter(q, clock, in_gap, 12)
    assert sorted(slot_of(i) for i in done) == [today, today]  # once per schedule
    assert set(done.values()) == {1}


def test_after_the_first_pass_ran_no_redefine_resume_or_readd_runs_the_second_pass(
    tq: tuple[Queue, Clock],
) -> None:
    """Held: on 25 October the 02:30 CEST run (00:30 UTC) is done; at 02:15 CET, in the
    repeated hour (01:15 UTC), a deploy redefines it, an operator pauses and resumes it, and
    another removes and defines it again: 02:30 CET (01:30 UTC) is not run a second time."""
    q, clock = tq
    clock.set_ms(ms(2026, 10, 24, 12))
    q.schedule("nightly", "t", cron="30 2 * * *", tz=BERLIN)
    done: Counter[str] = Counter()
    work(q, clock, ms(2026, 10, 25, 0, 31), done)
    first_pass = ms(2026, 10, 25, 0, 30)
    assert [slot_of(i) for i in done] == [first_pass]
    clock.set_ms(ms(2026, 10, 25, 1, 15))
    assert q.schedule("nightly", "t", {"v": 2}, cron="30 2 * * *", tz=BERLIN) == "updated"
    assert q.pause_schedule("nightly") == "paused"
    assert q.resume_schedule("nightly") == "resumed"
    assert q.remove_schedule("nightly") == "removed"
    assert q.schedule("nightly", "t", {"v": 2}, cron="30 2 * * *", tz=BERLIN) == "created"
    tomorrow = ms(2026, 10, 26, 1, 30)
    assert pending_slot(q, "nightly") == tomorrow
    done += every_quarter(q, clock, ms(2026, 10, 25, 1, 15), 25)
    assert sorted(slot_of(i) for i in done) == [first_pass, tomorrow]
    assert set(done.values()) == {1}


@pytest.mark.parametrize("misfire", ["skip", "run_once", "catch_up:3"])
def test_a_worker_down_through_the_repeated_hour_runs_the_first_pass_once(
    tq: tuple[Queue, Clock], misfire: str
) -> None:
    """Held: no worker from 23:00 UTC on 24 October to 02:50 CET on the 25th (01:50 UTC, in
    the second pass of 02:xx): the 02:30 run is late, but no later time was missed, so every
    policy runs it, once, and the next is the 26th."""
    q, clock = tq
    clock.set_ms(ms(2026, 10, 24, 23))
    q.schedule("nightly", "t", cron="30 2 * * *", tz=BERLIN, misfire=misfire)
    back = ms(2026, 10, 25, 1, 50)
    done: Counter[str] = Counter()
    work(q, clock, back, done)
    done += every_quarter(q, clock, back, 26)
    assert sorted(slot_of(i) for i in done) == [ms(2026, 10, 25, 0, 30), ms(2026, 10, 26, 1, 30)]
    assert set(done.values()) == {1}


# -- failures, pause and resume, validation ------------------------------------------------------


def test_runs_that_fail_to_max_attempts_do_not_stop_the_schedule(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: an hourly schedule whose every attempt fails (max_attempts=2, a 40 min retry):
    each slot still gets its run, each run is parked after its second attempt, and the next
    occurrence stays armed."""
    q, clock = tq
    clock.set_ms(T0 - 1)
    slow = Backoff(base_ms=40 * MIN_MS, factor=1.0, cap_ms=40 * MIN_MS, jitter=0.0)
    q.schedule("flaky", "t", every_ms=HOUR_MS, max_attempts=2, backoff=slow)
    done: Counter[str] = Counter()
    for k in range(0, 4 * 4):  # to T0 + 3h45
        work(q, clock, T0 + k * 15 * MIN_MS, done, fail=True)
    slots = [T0 + i * HOUR_MS for i in range(4)]
    assert sorted(slot_of(i) for i in done) == slots
    assert set(done.values()) == {2}
    for s in slots:
        assert client.hget(q.keys.job(f"schedule:flaky:{s}"), "state") == "dead"
    assert pending_slot(q, "flaky") == T0 + 4 * HOUR_MS


def test_resume_starts_at_the_next_future_slot_whatever_the_misfire_policy(
    tq: tuple[Queue, Clock],
) -> None:
    """Held: README "`pause` withdraws the pending run not yet claimed, even one already due
    and waiting for a worker; `resume` starts at the next future slot, so a run withdrawn by a
    pause is not made up": catch_up:3 makes up nothing, cron or interval."""
    q, clock = tq
    clock.set_ms(T0 - 10)
    q.schedule("every", "t", every_ms=HOUR_MS, misfire="catch_up:3")
    q.schedule("cron", "t", cron="0 * * * *", misfire="catch_up:3")
    clock.set_ms(T0 + 10)  # both runs due, no worker yet
    assert (q.pause_schedule("every"), q.pause_schedule("cron")) == ("paused", "paused")
    assert q.counts().due == 0
    clock.set_ms(T0 + 3 * HOUR_MS + 20 * MIN_MS)
    assert (q.resume_schedule("every"), q.resume_schedule("cron")) == ("resumed", "resumed")
    done = every_quarter(q, clock, T0 + 3 * HOUR_MS + 20 * MIN_MS, 2)
    later = [T0 + 4 * HOUR_MS, T0 + 5 * HOUR_MS]
    assert sorted(slot_of(i) for i in done) == sorted(later + later)


@pytest.mark.parametrize(
    "definition",
    [
        {"name": "two words", "cron": "0 9 * * *"},
        {"name": "a:b", "cron": "0 9 * * *"},
        {"name": "x" * 65, "cron": "0 9 * * *"},
        {"name": "ok", "cron": "61 * * * *"},
        {"name": "ok", "cron": "0 9 30 2 *"},
        {"name": "ok", "cron": "0 9 * *"},
        {"name": "ok", "cron": "0 9 * * *", "tz": "Mars/Olympus"},
        {"name": "ok", "cron": "0 9 * * *", "tz": "localtime"},
        {"name": "ok", "cron": "0 9 * * *", "misfire": "catch_up:0"},
        {"name": "ok", "cron": "0 9 * * *", "jitter_ms": 2 * 86_400_000},
        {"name": "ok", "every_ms": HOUR_MS, "tz": BERLIN},
    ],
)
def test_a_bad_name_or_cron_is_refused_with_bad_argument_and_nothing_written(
    tq: tuple[Queue, Clock], client: redis.Redis, definition: dict[str, Any]
) -> None:
    """Held: README "Refused with `BadArgument`, nothing stored"."""
    q, _ = tq
    before = sorted(client.scan_iter(match=q.keys.pattern()))
    kw = dict(definition)
    name = kw.pop("name")
    with pytest.raises(BadArgument):
        q.schedule(name, "t", **kw)
    assert sorted(client.scan_iter(match=q.keys.pattern())) == before
    assert q.list_schedules() == []


def test_run_now_beside_the_slots_changes_nothing_of_the_schedule(tq: tuple[Queue, Clock]) -> None:
    """Held: docs/guide/schedules.md "The schedule is not changed ... The extra run does not
    count as a slot for the misfire policy, and its claim arms nothing": the slots run as
    they would have, the extra run once."""
    q, clock = tq
    clock.set_ms(T0 + 10)
    q.schedule("report", "t", every_ms=HOUR_MS)
    before = q.get_schedule("report")
    extra = q.run_schedule_now("report")
    assert q.get_schedule("report") == before
    done = every_quarter(q, clock, T0 + 10, 3)
    assert done[extra] == 1
    slots = sorted(slot_of(i) for i in done if i != extra)
    assert slots == [T0 + i * HOUR_MS for i in (1, 2, 3)]
    assert set(done.values()) == {1}


# -- reschedule of a schedule's jobs (strict xfails once) -----------------------------------------


def test_an_extra_run_from_run_schedule_now_can_be_moved_like_any_job(
    tq: tuple[Queue, Clock],
) -> None:
    """docs/guide/schedules.md: the run-now job "has an ordinary job id ... it is no slot of the
    schedule" and "is one of its own: pausing, removing or redefining the schedule afterwards
    leaves it". An operator who wants it an hour later calls reschedule: it moves (it
    answered 'schedule', advice that cannot move it, and the run stayed due now)."""
    q, clock = tq
    clock.set_ms(T0 + 10)
    q.schedule("report", "t", every_ms=HOUR_MS)
    extra = q.run_schedule_now("report")
    assert q.reschedule(extra, delay_ms=HOUR_MS) == "rescheduled"


def test_a_schedule_runs_retry_waiting_out_its_backoff_can_be_run_now(
    tq: tuple[Queue, Clock],
) -> None:
    """A nightly report failed (a bug since fixed) and waits out a 1 h backoff. `jobs
    reschedule --now` (docs/cli.md: "scheduled, due, or waiting out a retry") runs it now (it
    answered 'schedule', "redefine or pause the schedule instead", which never moves a retry:
    the operator waited the hour, or used `schedules run` and got the report twice)."""
    q, clock = tq
    midnight = ms(2026, 3, 2)
    clock.set_ms(midnight - 10)
    hour = Backoff(base_ms=HOUR_MS, factor=1.0, cap_ms=HOUR_MS, jitter=0.0)
    q.schedule("nightly", "t", cron="0 0 * * *", backoff=hour)
    clock.set_ms(midnight + 5)
    (job,) = q.claim("w", limit=1, lease_ms=30_000).jobs
    assert q.fail(job.id, job.token, ("Bug", "fixed since", "")).status == "retry"
    assert q.reschedule(job.id, delay_ms=0) == "rescheduled"
