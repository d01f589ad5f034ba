"""Schedules against hand edits and the edges of time: the fixes that came with the review of
tests/test_review_schedules.py (a hash that cannot be read whole is cleared by remove, pause and
a redefinition; a refill request no client can serve is dropped; a slot that left due is never
placed again; cron slots stop at 2200; R and H fields are refused)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
import redis

from scheduler import BadArgument, Queue
from scheduler.schedules.cron_slots import (
    BUFFER_SLOTS,
    MAX_CATCH_UP,
    cron_slots_after,
    cron_slots_upto,
    refill_slots,
)
from tests.conftest import Clock

MIN_MS = 60_000


def _ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp() * 1000)


def _claim_all(q: Queue) -> list[str]:
    ran = []
    for job in q.claim("w", limit=100).jobs:
        q.complete(job.id, job.token)
        ran.append(job.id)
    return ran


def test_refill_computes_at_most_max_catch_up_overdue_slots() -> None:
    """A hand-edited misfire_n of 10^6 would make the claiming worker compute 10^6 past slots."""
    cursor = _ms(2024, 1, 1)
    fields = {"cron": "* * * * *", "tz": "UTC", "cursor_ms": str(cursor), "misfire_n": "1000000"}
    slots = refill_slots(fields, None, cursor + 5_000 * MIN_MS)
    assert len(slots) == MAX_CATCH_UP + 1 + BUFFER_SLOTS


@pytest.mark.parametrize(("field", "value"), [("digest", None), ("cron", "not a cron")])
def test_a_refill_request_no_client_can_serve_is_dropped(
    tq: tuple[Queue, Clock], client: redis.Redis, field: str, value: str | None
) -> None:
    """Else every claim of the queue asks for it again, forever."""
    q, clock = tq
    clock.set_ms(_ms(2024, 1, 1) + 1)
    q.schedule("c", "t", cron="* * * * *")
    if value is None:
        client.hdel(q.keys.schedule("c"), field)
    else:
        client.hset(q.keys.schedule("c"), field, value)
    client.sadd(q.keys.schedules_refill, "c")
    q.claim("w", limit=10)
    assert not client.sismember(q.keys.schedules_refill, "c")


def test_a_refill_request_for_a_zone_no_client_loads_is_dropped_after_its_bound(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """A zone this host cannot load may be one another worker's newer tz database has: the
    request stays (lua/schedule_refill.lua 'later'), for 50 answers and 10 minutes, not for
    ever."""
    q, clock = tq
    base = _ms(2024, 1, 1)
    clock.set_ms(base + 1)
    q.schedule("c", "t", cron="* * * * *")
    client.hset(q.keys.schedule("c"), "tz", "Mars/Base")
    client.sadd(q.keys.schedules_refill, "c")
    for i in range(60):
        clock.set_ms(base + 1 + i * 1_000)
        q.claim("w", limit=10)
    assert client.sismember(q.keys.schedules_refill, "c")
    clock.set_ms(base + 11 * MIN_MS)
    q.claim("w", limit=10)
    assert not client.sismember(q.keys.schedules_refill, "c")


def test_a_slots_key_of_another_type_leaves_the_refill_set_and_stays(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    base = _ms(2024, 1, 1)
    clock.set_ms(base + 1)
    q.schedule("bad", "t", cron="* * * * *")
    client.delete(q.keys.schedule_slots("bad"))
    client.set(q.keys.schedule_slots("bad"), "hand-edited")
    clock.set_ms(base + 200 * MIN_MS)
    _claim_all(q)
    _claim_all(q)
    assert not client.sismember(q.keys.schedules_refill, "bad")
    assert client.get(q.keys.schedule_slots("bad")) == "hand-edited"  # left for an operator


def test_pause_and_remove_clear_a_schedule_missing_its_task(q: Queue, client: redis.Redis) -> None:
    q.schedule("s", "t", every_ms=60 * MIN_MS)
    occurrence = q.get_schedule("s").pending
    client.hdel(q.keys.schedule("s"), "task")
    assert q.pause_schedule("s") == "paused"
    assert client.zscore(q.keys.due, occurrence) is None
    assert not client.exists(q.keys.job(occurrence))
    with pytest.raises(BadArgument, match="unreadable"):
        q.resume_schedule("s")
    assert client.hget(q.keys.schedule("s"), "paused") == "1"  # nothing changed
    assert q.remove_schedule("s") == "removed"
    assert not client.exists(q.keys.schedule("s"))
    assert not client.sismember(q.keys.schedules, "s")


def test_a_redefinition_repairs_a_schedule_missing_its_task(q: Queue, client: redis.Redis) -> None:
    q.schedule("s", "t", every_ms=60 * MIN_MS)
    old = q.get_schedule("s").pending
    client.hdel(q.keys.schedule("s"), "task")
    assert q.schedule("s", "t2", every_ms=60 * MIN_MS) == "updated"
    new = q.get_schedule("s").pending
    assert client.hget(q.keys.job(new), "task") == "t2"
    due = [str(i) for i in client.zrange(q.keys.due, 0, -1)]
    assert [i for i in due if i.startswith("schedule:s:")] == [new]
    assert old == new or not client.exists(q.keys.job(old))


def test_pause_withdraws_a_pending_occurrence_key_of_another_type(
    q: Queue, client: redis.Redis
) -> None:
    q.schedule("s", "t", every_ms=60 * MIN_MS, priority=3)
    occurrence = q.get_schedule("s").pending
    client.delete(q.keys.job(occurrence))
    client.set(q.keys.job(occurrence), "hand-edited")
    assert q.pause_schedule("s") == "paused"
    assert client.zscore(q.keys.due, occurrence) is None
    assert client.zscore(q.keys.prefix + "flow:pdue:3", occurrence) is None
    assert client.get(q.keys.job(occurrence)) == "hand-edited"  # left for doctor
    assert q.get_schedule("s").pending == ""


@pytest.mark.parametrize("action", ["pause", "remove", "redefine"])
def test_a_retry_of_a_run_claimed_while_its_schedule_was_unreadable_is_left_to_run(
    tq: tuple[Queue, Clock], client: redis.Redis, action: str
) -> None:
    """Claimed while the hash could not be read, the run stays the hash's `pending` (nothing
    re-armed); it failed and waits in due for its retry. Pause, remove and the redefinition
    that repairs the hash withdraw the pending occurrence "not yet claimed" (a run already
    claimed finishes normally): they deleted this retry, hash and all."""
    q, clock = tq
    clock.set_ms(1_000_000)
    q.schedule("tick", "t", every_ms=MIN_MS)
    run = q.get_schedule("tick").pending
    client.hset(q.keys.schedule("tick"), "every_ms", "garbage")
    clock.set_ms(1_200_000)
    (job,) = q.claim("w", limit=5).jobs
    assert job.id == run
    q.fail(job.id, job.token, RuntimeError("boom"))
    assert client.hget(q.keys.job(run), "state") == "due"
    if action == "pause":
        assert q.pause_schedule("tick") == "paused"
    elif action == "remove":
        assert q.remove_schedule("tick") == "removed"
    else:
        assert q.schedule("tick", "t", every_ms=MIN_MS) == "updated"
    assert client.zscore(q.keys.due, run) is not None
    assert client.hget(q.keys.job(run), "attempts") == "1"
    clock.set_ms(1_300_000)
    ran = _claim_all(q)
    assert run in ran and ran.count(run) == 1
    if action != "redefine":
        assert q.claim("w", limit=5).jobs == []  # nothing armed
    assert client.hget(q.keys.job(run), "state") == "done"


def test_a_cancelled_slot_is_not_placed_again_after_its_record_expired(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q0, clock = tq
    q = Queue(client, q0.name, result_ttl_ms=1, _clock="test")
    period = 10 * MIN_MS
    base = 1_000 * period
    clock.set_ms(base + 1)
    q.schedule("tick", "t", every_ms=period)
    first = q.get_schedule("tick").pending
    clock.set_ms(base + period + 1_000)
    assert q.cancel(first) == "due"
    deadline = time.monotonic() + 5
    while client.exists(q.keys.job(first)) and time.monotonic() < deadline:
        time.sleep(0.005)  # the cancelled record's 1 ms expiry
    assert q.schedule("tick", "t", every_ms=period, jitter_ms=9 * MIN_MS) == "updated"
    assert q.get_schedule("tick").pending != first


def test_cron_refuses_random_and_hashed_fields_but_not_names(q: Queue) -> None:
    for expr in ("R * * * *", "0 r * * *", "H * * * *", "H(0-29) * * * *", "0 0 * * R/2"):
        with pytest.raises(BadArgument, match="random"):
            q.schedule("x", "t", cron=expr)
    assert q.schedule("names", "t", cron="0 9 * MAR THU") == "created"


def test_an_empty_list_item_in_cron_is_malformed_not_random(q: Queue) -> None:
    """'0 9 * * 1,' (a trailing comma): the R / H check read the empty item's first letter,
    '', as one of 'hHrR' (the empty string is in every string) and refused it as a random or
    hashed field, which it is not; the CLI printed that too."""
    for expr in ("0 9 * * 1,", "0 9 * * ,", "0,,5 9 * * *"):
        with pytest.raises(BadArgument, match="malformed cron") as caught:
            q.schedule("x", "t", cron=expr)
        assert "random" not in str(caught.value)
    assert q.list_schedules() == []


def test_a_zone_each_host_reads_its_own_way_is_refused(q: Queue) -> None:
    """tz='localtime' (and 'posixrules', 'right/...', 'posix/...' files) was accepted: the
    slots are computed by the producer at definition and by each claiming worker at refill,
    each from its own host's /etc/localtime (or zone files), so hosts in other zones ran the
    schedule at other times. Refused at definition, nothing stored; a stored one still runs."""
    for tz in ("localtime", "posixrules", "right/UTC", "posix/Europe/Berlin"):
        with pytest.raises(BadArgument, match="IANA"):
            q.schedule("x", "t", cron="0 9 * * *", tz=tz)
    assert q.list_schedules() == []
    assert q.schedule("x", "t", cron="0 9 * * *", tz="Europe/Berlin") == "created"


def test_a_cron_with_no_time_left_before_2200_is_refused(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(_ms(2199, 6, 1))
    with pytest.raises(BadArgument, match="2200"):
        q.schedule("leap", "t", cron="0 0 29 2 *")


def test_a_cron_buffer_that_reaches_2200_ends_the_schedule_quietly(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """The last leap day before 2200 runs; then the schedule has ended: no refill request
    stays behind to make every claim ask again."""
    q, clock = tq
    clock.set_ms(_ms(2195, 1, 1))
    assert q.schedule("leap", "t", cron="0 0 29 2 *") == "created"
    last = q.get_schedule("leap").pending
    assert last == f"schedule:leap:{_ms(2196, 2, 29)}"
    clock.set_ms(_ms(2196, 2, 29) + 1)
    assert _claim_all(q) == [last]
    _claim_all(q)
    assert not client.sismember(q.keys.schedules_refill, "leap")
    assert q.get_schedule("leap").pending == ""


def test_cron_slots_after_the_second_pass_of_the_repeated_hour() -> None:
    """02:05 CET on 27 Oct 2024 in Berlin: the slots of the repeated hour ran in its first
    pass (cron_slots.py docstring), the next ones are from 03:00 CET."""
    after = _ms(2024, 10, 27, 1, 5)
    assert cron_slots_after("* * * * * */2", "Europe/Berlin", after, 2) == [
        _ms(2024, 10, 27, 2, 0, 0),
        _ms(2024, 10, 27, 2, 0, 2),
    ]
    assert cron_slots_after("30 * * * *", "Europe/Berlin", after, 1) == [_ms(2024, 10, 27, 2, 30)]


def test_a_half_hour_spring_forward_runs_the_times_after_the_gap_too() -> None:
    """Lord Howe Island springs forward 30 minutes (02:00 -> 02:30, +10:30 -> +11:00, on 6 Oct
    2024). '*/7 * * * *': 02:00-02:28 do not exist and run shifted by the gap (02:30-02:58);
    02:35-02:56 exist and run as they are (cron_slots.py docstring). The slots kept only times
    after the last one found, so the shifted ones hid the real ones from cron_slots_after and
    the real ones the shifted ones from cron_slots_upto: the two disagreed, each lost four."""
    zone = ZoneInfo("Australia/Lord_Howe")

    def at(h: int, mi: int) -> int:
        return int(datetime(2024, 10, 6, h, mi, tzinfo=zone).timestamp() * 1000)

    minutes = [30, 35, 37, 42, 44, 49, 51, 56, 58]
    want = [at(1, 56)] + [at(2, m) for m in minutes] + [at(3, 0), at(3, 7)]
    assert len(set(want)) == len(want) and want == sorted(want)
    expr, tz = "*/7 * * * *", "Australia/Lord_Howe"
    assert cron_slots_after(expr, tz, at(1, 50), len(want)) == want
    assert cron_slots_upto(expr, tz, at(3, 7), len(want)) == want
    # From within the gap's length after it: 02:07 (02:37) comes before 02:34 on the wall.
    assert cron_slots_after(expr, tz, at(2, 34), 3) == [at(2, 35), at(2, 37), at(2, 42)]


def test_the_catch_up_bound_is_the_same_in_lua() -> None:
    from scheduler.core.scripts import lua_dir

    text = (lua_dir() / "lib" / "schedule.lua").read_text()
    assert f"local SCHED_CATCH_UP_MAX = {MAX_CATCH_UP}\n" in text
