"""Review of recurring schedules over time: cron day fields read as classic cron, month-end
and leap-day crons after long outages, a spec-level oracle of the misfire policy across DST
changes (a 30-minute one included) with jitter, and how the next run is shown in the
schedule's zone. Real scripts on the test clock (tests/conftest.py `tq`).

A test marked xfail shows a defect (its reason says what a user sees); the others guard
behaviour checked here that held."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any, cast
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, Queue
from scheduler.cli.main import main
from scheduler.dashboard.render import fmt_time
from scheduler.dashboard.schedule_view import next_runs
from tests.conftest import Clock
from tests.test_schedules_review3 import _wall_slots

MIN_MS = 60_000
HOUR_MS = 3_600_000


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, tz: Any = UTC) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=tz).timestamp() * 1000)


def slot_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def work(q: Queue, clock: Clock, now_ms: int) -> list[int]:
    """One worker pass at `now_ms`: claim everything due and complete it; the slots run, in
    claim order. Checks that nothing is claimed before its run time."""
    clock.set_ms(now_ms)
    ran: list[int] = []
    for _ in range(1_000):
        batch = q.claim("w", limit=10, lease_ms=30_000)
        for job in batch.jobs:
            assert job.run_at_ms is None or job.run_at_ms <= now_ms, job.id
            q.complete(job.id, job.token)
            ran.append(slot_of(job.id))
        if not batch.jobs and not (0 <= batch.next_ms <= now_ms):
            return ran
    raise AssertionError("claims did not settle")


def pending_slot(q: Queue, name: str) -> int | None:
    p = q.get_schedule(name).pending
    return slot_of(p) if p else None


# -- cron day fields: classic cron's reading ------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "days"),
    [
        # classic cron: odd days of the month that are Mondays
        ("0 0 */2 * 1", ["06-15", "06-29", "07-13", "07-27", "08-03", "08-17"]),
        # classic cron: the 1st to the 7th that are a Sunday, Tuesday, Thursday or Saturday
        ("0 0 1-7 * */2", ["06-02", "06-04", "06-06", "06-07", "07-02", "07-04"]),
    ],
)
def test_a_star_day_field_beside_a_restricted_one_is_classic_crons_and_or_refused(
    tq: tuple[Queue, Clock], client: redis.Redis, expr: str, days: list[str]
) -> None:
    """README: "A day of month and a day of week both given match either, as in classic cron",
    and define() refuses the fields croniter reads otherwise than classic cron (cron_fields.py:
    the '1/2' day-of-week step was refused for exactly that). Classic cron (Vixie / cronie,
    entry.c `if (ch == '*') e->flags |= DOM_STAR`, cron.c: `(DOM_STAR|DOW_STAR) ? dom && dow :
    dom || dow`; crontab(5): "if both fields are restricted (i.e., do not contain the '*'
    character)") matches a day-of-month or day-of-week field that starts with '*' (a step
    '*/2', '*/1') AND the other one. croniter (implement_cron_bug=False, the default used by
    cron_slots.py) ORs them: '0 0 */2 * 1', meant as the odd-day Mondays (twice a month),
    runs on every odd day AND every Monday (about 19 times a month). Accepted and stored, no
    doctor warning. Either reading as classic cron or a BadArgument naming the field is
    right; here neither happens."""
    q, clock = tq
    clock.set_ms(ms(2026, 6, 1))  # a Monday, 00:00 UTC
    try:
        q.schedule("days", "t", cron=expr)
    except BadArgument:
        return  # refused as a misreading, as the others croniter reads its own way
    first = pending_slot(q, "days")
    assert first is not None
    slots = cast("list[bytes]", client.zrange(q.keys.schedule_slots("days"), 0, 4))
    buffered = [int(s) for s in slots]
    shown = [datetime.fromtimestamp(s / 1000, UTC).strftime("%m-%d") for s in [first, *buffered]]
    assert shown == days


def test_doctor_warns_of_a_stored_star_day_field_beside_a_restricted_one(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """One stored before the refusal (its cron written so by hand) keeps croniter's reading
    (either day): doctor names it, as it does the other misreads."""
    from scheduler.admin.doctor import check_queue

    q, _ = tq
    q.schedule("days", "t", cron="0 0 1-31/2 * 1")  # either: one reading, accepted
    assert check_queue(client, q.name) == []
    client.hset(q.keys.schedule("days"), "cron", "0 0 */2 * 1")
    (issue,) = check_queue(client, q.name)
    assert issue.code == "schedule-cron-misread" and "read two ways" in issue.message


# -- month-end and leap-day crons after a long outage -------------------------------------------


BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    ("expr", "created", "back", "misfire", "expect", "then"),
    [
        # the 31st: Jan, Mar, May, Jul, Aug missed by mid-September
        ("0 0 31 * *", (2026, 1, 1), (2026, 9, 15), "skip", [], (2026, 10, 31)),
        ("0 0 31 * *", (2026, 1, 1), (2026, 9, 15), "run_once", [(2026, 8, 31)], (2026, 10, 31)),
        (
            "0 0 31 * *",
            (2026, 1, 1),
            (2026, 9, 15),
            "catch_up:3",
            [(2026, 5, 31), (2026, 7, 31), (2026, 8, 31)],
            (2026, 10, 31),
        ),
        # 29 February: 2024 and 2028 missed by March 2028
        ("0 0 29 2 *", (2023, 1, 1), (2028, 3, 1), "skip", [], (2032, 2, 29)),
        ("0 0 29 2 *", (2023, 1, 1), (2028, 3, 1), "run_once", [(2028, 2, 29)], (2032, 2, 29)),
        (
            "0 0 29 2 *",
            (2023, 1, 1),
            (2028, 3, 1),
            "catch_up:3",
            [(2024, 2, 29), (2028, 2, 29)],
            (2032, 2, 29),
        ),
    ],
)
def test_month_end_and_leap_day_crons_after_a_long_outage_follow_the_policy(
    tq: tuple[Queue, Clock],
    expr: str,
    created: tuple[int, int, int],
    back: tuple[int, int, int],
    misfire: str,
    expect: list[tuple[int, int, int]],
    then: tuple[int, int, int],
) -> None:
    """Held: a Berlin midnight cron on the 31st (months without one skipped) or on 29 February
    (years without one skipped), workers away for months or years: skip runs none, run_once
    the latest missed date, catch_up:3 the latest three (or all when fewer), in order, each
    once at local midnight (CET or CEST as the date has it); then the next such date waits."""
    q, clock = tq
    clock.set_ms(ms(*created, tz=BERLIN))
    q.schedule("end", "t", cron=expr, tz="Europe/Berlin", misfire=misfire)
    ran = work(q, clock, ms(*back, tz=BERLIN))
    assert ran == [ms(*d, tz=BERLIN) for d in expect]
    assert pending_slot(q, "end") == ms(*then, tz=BERLIN)
    assert work(q, clock, ms(*back, tz=BERLIN) + HOUR_MS) == []


# -- the misfire policy across DST changes, against the README's words ----------------------------


_CHANGES = [
    ("Australia/Lord_Howe", (2026, 4, 5)),  # back 30 minutes (02:00 -> 01:30)
    ("Australia/Lord_Howe", (2026, 10, 4)),  # forward 30 minutes (02:00 -> 02:30)
    ("Europe/Berlin", (2026, 3, 29)),
    ("Europe/Berlin", (2026, 10, 25)),
    ("America/New_York", (2026, 11, 1)),
]
_EXPRS = ["*/20 0-4 * * *", "15 1,2 * * *", "0,30 * * * *", "45 1 * * *", "*/7 1-3 * * *"]


@pytest.mark.parametrize("seed", range(4))
def test_outages_across_a_dst_change_with_jitter_run_what_the_policy_says(
    tq: tuple[Queue, Clock], seed: int
) -> None:
    """Held: a cron schedule in a zone with a DST change (Lord Howe's 30-minute one, Berlin,
    New York), a jitter, and a random misfire policy, worked at random times over two days
    with outages: at each pass, the runs are exactly README's (the wall-clock slots, a gap's
    times shifted by it, a repeated time at its first pass; of the pending slot and those
    missed after it up to now - offset: skip runs the pending one only when nothing else was
    missed, run_once the latest, catch_up:3 the latest three in order), and the next pending
    run is the first slot whose run time is still ahead."""
    rng = random.Random(seed)
    q, clock = tq
    tz, day = _CHANGES[seed % len(_CHANGES)]
    expr = rng.choice(_EXPRS)
    misfire = rng.choice(["skip", "run_once", "catch_up:3"])
    zone = ZoneInfo(tz)
    start = ms(*day, tz=zone) - 20 * HOUR_MS + rng.randint(0, HOUR_MS)
    wall = _wall_slots(expr, tz, start, start + 3 * 24 * HOUR_MS)
    clock.set_ms(start)
    q.schedule("s", "t", cron=expr, tz=tz, misfire=misfire, jitter_ms=3 * MIN_MS)
    off = q.get_schedule("s").offset_ms
    pend = pending_slot(q, "s")
    assert pend == next(s for s in wall if s > start - off)
    keep = {"skip": 0, "run_once": 1}.get(misfire, 3)
    now = start
    while now < start + 2 * 24 * HOUR_MS:
        now += rng.choice([5, 20, 45, 90, 300, 600]) * MIN_MS + rng.randint(0, 59_999)
        ran = work(q, clock, now)
        assert pend is not None
        expect: list[int] = []
        if pend + off <= now:
            missed = [s for s in wall if pend <= s <= now - off]
            expect = (missed if len(missed) == 1 else []) if keep == 0 else missed[-keep:]
            pend = next(s for s in wall if s > now - off)
        why = (tz, expr, misfire, off, now)
        assert ran == expect, why
        assert pending_slot(q, "s") == pend, why


# -- the next run as shown, in the schedule's zone ------------------------------------------------


def test_the_next_runs_around_the_fold_are_shown_with_their_own_offsets(
    tq: tuple[Queue, Clock], redis_url: str
) -> None:
    """Held: a New York 01:30 daily schedule on the fall-back day: `schedules list` prints its
    next run at the first pass (05:30 UTC, 01:30-04:00 in New York), the dashboard's next runs
    are 01:30 EDT that day and 01:30 EST the days after (same wall time, the new offset)."""
    q, clock = tq
    clock.set_ms(ms(2026, 10, 31, 12))
    q.schedule("fold", "t", cron="30 1 * * *", tz="America/New_York")
    res = CliRunner().invoke(main, ["schedules", "list", "-q", q.name, "--url", redis_url])
    assert res.exit_code == 0, res.output
    assert (
        "next 2026-11-01T05:30:00+00:00 (2026-11-01T01:30:00-04:00 America/New_York)" in res.output
    )
    s = q.get_schedule("fold")
    shown = [fmt_time(t, s.tz) for t in next_runs(s, ms(2026, 10, 31, 12))]
    assert shown == [
        "2026-11-01 01:30:00 EDT",
        "2026-11-02 01:30:00 EST",
        "2026-11-03 01:30:00 EST",
    ]
