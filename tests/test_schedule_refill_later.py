"""A cron refill a worker cannot compute because its host cannot load the zone (an older tz
database, EMFILE): the request stays for the next claim, any worker's, a bounded number of
times (lua/schedule_refill.lua 'later'), then is dropped; doctor then reports the schedule
starved, and the same definition sent again refills it (operations/schedules.py)."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest
import redis

from scheduler import Queue
from scheduler.admin.doctor import check_queue
from scheduler.operations.schedule_refill import refill
from tests.conftest import Clock

MIN_MS = 60_000
BASE = 1_000 * 600_000
WHERE = "scheduler.schedules.cron_slots.ZoneInfo"


def _no_zone(key: str) -> Any:
    raise ZoneInfoNotFoundError(f"No time zone found with key {key}")


def _emfile(key: str) -> Any:
    raise OSError(24, "Too many open files")


def _starve(q: Queue, clock: Clock, monkeypatch: pytest.MonkeyPatch, fail: Any) -> int:
    """A New York every-minute schedule, then workers back after 200 minutes on a host where
    the zone fails: the claim drops the stale run (run_once) and asks for a refill."""
    clock.set_ms(BASE + 1)
    q.schedule("c", "t", cron="* * * * *", tz="America/New_York")
    monkeypatch.setattr(WHERE, fail)
    now = BASE + 200 * MIN_MS + 1_000
    clock.set_ms(now)
    assert q.claim("w", limit=10).jobs == []
    return now


@pytest.mark.parametrize("fail", [_no_zone, _emfile], ids=["no-zone", "emfile"])
def test_a_refill_this_host_cannot_compute_stays_asked_for_and_another_does_it(
    tq: tuple[Queue, Clock], client: redis.Redis, monkeypatch: pytest.MonkeyPatch, fail: Any
) -> None:
    q, clock = tq
    now = _starve(q, clock, monkeypatch, fail)
    for _ in range(5):
        assert q.claim("w", limit=10).jobs == []
    assert client.sismember(q.keys.schedules_refill, "c")
    assert check_queue(client, q.name) == []  # asked for: nothing to report yet
    monkeypatch.setattr(WHERE, ZoneInfo)  # another worker: its claim refills, the next runs
    assert q.claim("w", limit=10).next_ms <= now
    (job,) = q.claim("w", limit=10).jobs
    assert job.id == f"schedule:c:{now - 1_000}"
    assert not client.hexists(q.keys.schedule("c"), "refill_tries")


def test_a_zone_no_worker_can_load_is_given_up_then_reported_and_repaired_by_a_resend(
    tq: tuple[Queue, Clock], client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded: 50 answers and 10 minutes, then the request is dropped (no claim asks again);
    doctor reports it (schedule-starved); the same definition sent again from a host that
    loads the zone places the run ('repaired')."""
    q, clock = tq
    now = _starve(q, clock, monkeypatch, _no_zone)
    for i in range(60):
        clock.set_ms(now + i * 1_000)
        q._run(refill(q.keys, now + i * 1_000))
    assert client.sismember(q.keys.schedules_refill, "c")  # 60 answers, not yet 10 minutes
    clock.set_ms(now + 11 * MIN_MS)
    q._run(refill(q.keys, now + 11 * MIN_MS))
    assert not client.sismember(q.keys.schedules_refill, "c")
    assert q.get_schedule("c").pending == ""
    (issue,) = check_queue(client, q.name)
    assert issue.code == "schedule-starved", issue
    assert "define it again" in issue.fix
    monkeypatch.setattr(WHERE, ZoneInfo)
    assert q.schedule("c", "t", cron="* * * * *", tz="America/New_York") == "repaired"
    assert q.get_schedule("c").pending
    assert check_queue(client, q.name) == []
    # Sent again while its run waits: unchanged, as ever.
    assert q.schedule("c", "t", cron="* * * * *", tz="America/New_York") == "unchanged"


def test_a_stale_index_name_is_reported_and_remove_drops_it(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("x", "t", every_ms=MIN_MS)
    client.delete(q.keys.schedule("x"))
    (issue,) = [i for i in check_queue(client, q.name) if i.code == "schedule-no-hash"]
    assert f"schedules remove -q {q.name} x" in issue.fix
    assert q.remove_schedule("x") == "removed"  # the name the list shows flagged is gone
    assert not client.sismember(q.keys.schedules, "x")
    assert q.remove_schedule("x") == "missing"
    assert "schedule-no-hash" not in [i.code for i in check_queue(client, q.name)]


def test_doctors_remedy_for_a_slot_buffer_of_another_type_restarts_the_schedule(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """wrong-type for schedule:<name>:slots: pause then resume writes the buffer again."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("x", "t", cron="* * * * *")
    client.delete(q.keys.schedule_slots("x"))
    client.set(q.keys.schedule_slots("x"), "edited by hand")
    (issue,) = check_queue(client, q.name)
    assert (issue.code, q.keys.schedule_slots("x") in issue.message) == ("wrong-type", True)
    assert f"schedules pause -q {q.name} x" in issue.fix and "resume" in issue.fix
    assert q.pause_schedule("x") == "paused"
    assert q.resume_schedule("x") == "resumed"
    assert client.type(q.keys.schedule_slots("x")) == "zset"
    assert check_queue(client, q.name) == []
    clock.set_ms(BASE + 2 * MIN_MS)
    assert [j.id for j in q.claim("w", limit=10).jobs] == [f"schedule:x:{BASE + 2 * MIN_MS}"]
