"""croniter's readings that no cron user means (scheduler/schedules/cron_fields.py): a reversed
range ('0 5-2 * * *', weekdays '5-1', 'dec-jan') wraps around, a range of one value ('3-3') is
read as every value, and a step that leaves one value ('*/90' minutes: hourly, '0 */30 * * *':
daily) silently means that one value. The docs promise no wrap-around, so each is refused as
malformed (BadArgument naming the part, nothing stored); what croniter already refused (step 0,
out-of-range values, 'L' / '#' where they mean nothing, 7 fields) stays refused, and the forms
it reads right (L, W, #, names, 0-7, 6 fields with seconds) stay taken."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, Queue
from scheduler.cli.main import main
from scheduler.schedules.cron_slots import check_cron, cron_slots_after, cron_slots_upto
from tests.conftest import dump_queue

REVERSED = [
    "0 5-2 * * *",  # croniter: hours 0-2 and 5-23
    "0 0 * * 5-1",  # Fri..Mon
    "0 0 * * fri-mon",
    "0 0 * * sat-sun",
    "0 0 * * 7-1",
    "0 0 20-5 * *",
    "0 0 1 11-2 *",
    "0 0 * dec-jan *",  # Dec and Jan
    "50-10 * * * *",
    "* * * * * 50-10",  # the seconds field
    "0 0 * * 5-1/2",
    "0 0 1,20-5 * *",
]
ONE_VALUE = [
    "5-5 * * * *",  # croniter: every minute
    "0 3-3 * * *",  # croniter: hourly
    "0 0 1-1 * *",  # croniter: daily
    "0 0 * 3-3 *",
    "0 0 * * 7-7",
    "5-5/2 * * * *",  # croniter: every even minute
    "* * * * * 5-5",
]
ONE_STEP = [
    "*/90 * * * *",  # minute 0 only: hourly, not every 90 minutes
    "0 */30 * * *",  # hour 0 only: daily
    "0 0 */31 * *",
    "0 0 * */12 *",
    "0 0 * * */7",
    "0-5/10 * * * *",
    "30/30 * * * *",
    "* * * * * */60",
]
ALREADY_REFUSED = [
    "*/0 * * * *", "0/0 * * * *", "0-59/0 * * * *", "60 * * * *", "0 24 * * *", "0 0 32 * *",
    "0 0 0 * *", "0 0 * 13 *", "0 0 * 0 *", "0 0 * * 8", "0 0 * * 5L", "0 0 * * L",
    "0 0 * * 5#6", "0 0 * * 1#0", "0 0 LW * *", "0 0 L-2 * *", "@daily", "0 0 * * * * 2030",
    "* * * * * 60", "* * * * * */0", "0 0 * * -1", "*/-1 * * * *",
]  # fmt: skip


@pytest.mark.parametrize("expr", REVERSED + ONE_VALUE + ONE_STEP + ALREADY_REFUSED)
def test_a_cron_croniter_misreads_is_refused_as_malformed(expr: str) -> None:
    with pytest.raises(BadArgument, match="cron") as info:
        check_cron(expr, "UTC")
    if expr not in ALREADY_REFUSED:
        assert f"cron {expr!r}: the " in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("0 5-2 * * *", r"range '5-2' in the hour field is reversed.*'5-23,0-2'"),
        ("0 0 * * fri-mon", r"range 'fri-mon' in the day-of-week field is reversed"),
        ("0 3-3 * * *", r"range '3-3' in the hour field is one value: write '3'"),
        ("*/90 * * * *", r"step 90 in the minute field leaves one value.*every_ms"),
    ],
)
def test_the_refusal_says_what_to_write(expr: str, why: str) -> None:
    with pytest.raises(BadArgument, match=why):
        check_cron(expr, "UTC")


def _days(expr: str, n: int) -> list[str]:
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    slots = cron_slots_after(expr, "UTC", start, n)
    return [datetime.fromtimestamp(s / 1000, UTC).strftime("%a %d %H:%M:%S") for s in slots]


@pytest.mark.parametrize("expr", ["0 0 0-0 * *", "70-60 * * * *", "0 0 * * 9-8", "0 0 * 13-12 *"])
def test_a_range_out_of_its_field_is_malformed_not_given_a_hint(expr: str, redis_url: str) -> None:
    """A range end outside its field is refused as such, not given a hint naming the bad value
    ('write 0'); croniter itself read '0-0' of the days of the month as every day."""
    with pytest.raises(BadArgument, match=r"is out of the [a-z-]+ field's range") as info:
        check_cron(expr, "UTC")
    assert "write" not in str(info.value)
    cmd = ["schedules", "add", "s", "t", "--cron", expr, "-q", "cron-range", "--url", redis_url]
    res = CliRunner().invoke(main, cmd)
    assert res.exit_code == 2 and "out of" in res.output, res.output  # not "never fires"


@pytest.mark.parametrize(
    ("expr", "first"),
    [
        ("0 0 * * 1-5", ["Fri 02", "Mon 05", "Tue 06"]),
        ("0 0 * * mon-fri", ["Fri 02", "Mon 05", "Tue 06"]),
        ("0 0 * * 5-7", ["Fri 02", "Sat 03", "Sun 04", "Fri 09"]),
        ("0 0 * * 6-7", ["Sat 03", "Sun 04", "Sat 10"]),
        ("0 0 * * 0-7", ["Fri 02", "Sat 03", "Sun 04"]),
        ("0 0 * * sun/2", ["Sat 03", "Sun 04", "Tue 06"]),
        ("0 0 L * *", ["Sat 31"]),
        ("0 0 1-L * *", ["Fri 02", "Sat 03"]),
        ("0 0 15W * *", ["Thu 15"]),
        ("0 0 * * 5#2", ["Fri 09"]),
        ("0 0 ? * *", ["Fri 02"]),
        ("30/15 9 * * *", ["Thu 01", "Thu 01", "Fri 02"]),
        ("*/59 0 * * *", ["Thu 01", "Fri 02"]),
        ("0 9 * MAR THU", ["Thu 05"]),
    ],
)
def test_the_forms_croniter_reads_right_are_still_taken(expr: str, first: list[str]) -> None:
    check_cron(expr, "UTC")
    assert [d[:6] for d in _days(expr, len(first))] == first


def test_a_step_within_its_range_and_seconds_last_are_taken() -> None:
    assert _days("30/15 9 * * *", 2) == ["Thu 01 09:30:00", "Thu 01 09:45:00"]
    assert _days("0 0 * * * */30", 2) == ["Thu 01 00:00:30", "Fri 02 00:00:00"]
    check_cron("0 0 1-31/30 * *", "UTC")  # 1 and 31: two values


def test_a_refused_cron_stores_nothing_and_the_cli_exits_2(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    before = dump_queue(client, q)
    for expr in ("0 5-2 * * *", "0 0 * * 5-1", "0 3-3 * * *", "*/90 * * * *"):
        with pytest.raises(BadArgument, match=r"field (is|leaves)"):
            q.schedule("wrap", "t", cron=expr)
        res = CliRunner().invoke(
            main,
            ["schedules", "add", "wrap", "t", "--cron", expr, "-q", q.name, "--url", redis_url],
        )
        assert res.exit_code == 2 and f"cron {expr!r}: the " in res.output, res.output
    assert dump_queue(client, q) == before


def test_a_day_of_month_and_a_day_of_week_match_either_as_the_readme_says() -> None:
    """README: `0 0 1-7 * 1` is the 1st to the 7th and every Monday (classic cron's OR), the
    first Monday of each month `0 0 * * 1#1`."""
    either = _days("0 0 1-7 * 1", 9)
    assert [d[:6] for d in either] == [
        "Fri 02", "Sat 03", "Sun 04", "Mon 05", "Tue 06", "Wed 07", "Mon 12", "Mon 19", "Mon 26"
    ]  # fmt: skip
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    firsts = cron_slots_after("0 0 * * 1#1", "UTC", start, 3)
    assert [datetime.fromtimestamp(s / 1000, UTC).strftime("%m-%d") for s in firsts] == [
        "01-05", "02-02", "03-02"
    ]  # fmt: skip


def test_doctor_warns_of_a_stored_cron_croniter_misreads(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    """A schedule defined before these refusals (here its cron field written so by hand) keeps
    croniter's reading: doctor names it, a warning (it runs, just not when its text says)."""
    from scheduler.admin.doctor import check_queue

    q.schedule("wrap", "t", cron="0 22 * * *")
    q.schedule("fine", "t", cron="0 6 * * 1-5")
    assert check_queue(client, q.name) == []
    client.hset(q.keys.schedule("wrap"), "cron", "0 22-2 * * *")
    (issue,) = check_queue(client, q.name)
    assert (issue.code, issue.severity) == ("schedule-cron-misread", "warning")
    assert "'22-2' in the hour field is reversed" in issue.message and "wrap" in issue.message
    assert "schedules add wrap" in issue.fix or "define it again" in issue.fix
    res = CliRunner().invoke(main, ["doctor", "-q", q.name, "--no-server", "--url", redis_url])
    assert res.exit_code == 0 and "schedule-cron-misread" in res.output, res.output


def test_slots_back_past_year_one_end_there_instead_of_raising() -> None:
    # 29 February, the latest 600 slots before 2026: 491 leap days back to year 4. croniter
    # raised a plain ValueError ("year 0 is out of range") to the schedule's redefinition.
    upto = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
    slots = cron_slots_upto("0 0 29 2 *", "UTC", upto, 600)
    days = [datetime.fromtimestamp(ms / 1000, UTC) for ms in slots]
    assert len(slots) == 491 and slots == sorted(set(slots))
    assert days[0].year == 4 and days[-1] == datetime(2024, 2, 29, tzinfo=UTC)
    assert all((d.month, d.day, d.hour, d.minute) == (2, 29, 0, 0) for d in days)
