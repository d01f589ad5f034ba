"""Redefining a schedule whose run is due and not yet taken (a deploy: the workers restart and
the producer's start-up `q.schedule(...)` sends a changed payload). Upsert withdrew the pending
occurrence and placed the first slot after now, so the run was lost whatever the misfire policy
(a daily 09:00 run redefined at 09:00:30 next ran the day after). The due occurrence is kept
now, and the new definition applies from the slot after it. And a payload built in another key
order is the same definition (it replaced the pending run at every start-up). Server time is
the test clock (tq)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from scheduler import Queue
from tests.conftest import Clock

HOUR_MS = 3_600_000


def ms(year: int, month: int, day: int, hour: int, minute: int, second: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp() * 1000)


def pending_of(client: redis.Redis, q: Queue, name: str) -> str:
    return str(client.hget(q.keys.schedule(name), "pending"))


def claim_ids(q: Queue) -> list[Any]:
    return [(j.id, j.payload()) for j in q.claim("w", limit=10, lease_ms=60_000).jobs]


def test_a_due_daily_run_survives_a_redefinition(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(ms(2026, 1, 5, 8, 0))
    assert q.schedule("daily", "report", {"v": 1}, cron="0 9 * * *") == "created"
    nine = pending_of(client, q, "daily")
    assert nine.endswith(str(ms(2026, 1, 5, 9, 0)))
    clock.set_ms(ms(2026, 1, 5, 9, 0, 30))  # due, no worker took it yet
    assert q.schedule("daily", "report", {"v": 2}, cron="0 9 * * *") == "updated"
    assert pending_of(client, q, "daily") == nine  # kept
    assert claim_ids(q) == [(nine, {"v": 1})]  # today's run, as it was placed
    after = pending_of(client, q, "daily")
    assert after.endswith(str(ms(2026, 1, 6, 9, 0)))  # tomorrow's, of the new definition
    assert q.get_job(after).payload() == {"v": 2}


def test_missed_interval_runs_keep_their_catch_up_across_a_redefinition(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(10 * HOUR_MS + 1)
    q.schedule("hourly", "t", {"v": 1}, every_ms=HOUR_MS, misfire="catch_up:5")
    clock.set_ms(13 * HOUR_MS + 10)  # the 11:00, 12:00 and 13:00 runs missed
    assert q.schedule("hourly", "t", {"v": 2}, every_ms=HOUR_MS, misfire="catch_up:5") == "updated"
    ran = []
    for _ in range(5):
        got = claim_ids(q)
        if not got:
            break
        ran += got
    assert [job_id.rsplit(":", 1)[1] for job_id, _ in ran] == [
        str(h * HOUR_MS) for h in (11, 12, 13)
    ]


def test_a_future_pending_run_is_still_replaced(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(10 * HOUR_MS + 1)
    q.schedule("hourly", "t", {"v": 1}, every_ms=HOUR_MS)
    assert q.schedule("hourly", "t", {"v": 2}, every_ms=HOUR_MS) == "updated"
    # Not due yet: replaced by the new definition's (same slot, same id, the new payload).
    assert q.get_job(pending_of(client, q, "hourly")).payload() == {"v": 2}
    clock.set_ms(11 * HOUR_MS)
    assert [payload for _, payload in claim_ids(q)] == [{"v": 2}]


def test_the_same_payload_in_another_key_order_is_the_same_definition(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(10 * HOUR_MS + 1)
    assert q.schedule("s", "t", {"a": 1, "b": {"x": 1, "y": 2}}, every_ms=HOUR_MS) == "created"
    again = q.schedule("s", "t", {"b": {"y": 2, "x": 1}, "a": 1}, every_ms=HOUR_MS)
    assert again == "unchanged"
    assert q.schedule("s", "t", {"a": 1, "b": {"x": 1, "y": 3}}, every_ms=HOUR_MS) == "updated"


def test_remove_then_add_again_does_not_run_a_slot_that_already_ran(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Removed and defined again with a larger jitter (its offset moves the 10:00 slot to
    10:36): the 10:00 slot, which already ran, ran again once its done record had expired, since
    remove forgot the schedule's last run. It is kept a month now (schedule_ran:<name>)."""
    q, clock = tq
    clock.set_ms(10 * HOUR_MS - 1)
    q.schedule("hr", "t", every_ms=HOUR_MS)
    clock.set_ms(10 * HOUR_MS)
    ((ten, _),) = claim_ids(q)
    assert ten == f"schedule:hr:{10 * HOUR_MS}"
    q.complete(ten, q.get_job(ten).token or "", None)
    client.delete(q.keys.job(ten), q.keys.spec(ten))  # its done record expired
    clock.set_ms(10 * HOUR_MS + 5 * 60_000)
    assert q.remove_schedule("hr") == "removed"
    assert q.schedule("hr", "t", every_ms=HOUR_MS, jitter_ms=3_500_000) == "created"
    again = pending_of(client, q, "hr")
    assert int(again.rsplit(":", 1)[1]) == 11 * HOUR_MS, again  # the next slot, not 10:00's
    assert client.exists(q.keys.prefix + "schedule_ran:hr") == 0  # read and deleted


@pytest.mark.parametrize(
    ("misfire", "ran_hours"),
    [("catch_up:5", [11, 12, 13]), ("run_once", [13]), ("skip", [])],
)
def test_missed_cron_runs_follow_the_misfire_policy_across_a_redefinition(
    tq: tuple[Queue, Clock], misfire: str, ran_hours: list[int]
) -> None:
    """As for an interval schedule above: the kept 11:00 run is late, the 12:00 and 13:00 runs
    were missed after it, and its claim applies the misfire policy to the three. The new cron
    definition's buffer started at now, so the claim saw no missed slot: the stale 11:00 run
    ran alone under every policy (found by tests/test_schedule_model.py)."""
    q, clock = tq
    clock.set_ms(10 * HOUR_MS + 1)
    q.schedule("hourly", "t", {"v": 1}, cron="0 * * * *", misfire=misfire)
    clock.set_ms(13 * HOUR_MS + 10)  # the 11:00, 12:00 and 13:00 runs missed
    assert q.schedule("hourly", "t", {"v": 2}, cron="0 * * * *", misfire=misfire) == "updated"
    ran = []
    for _ in range(5):
        got = claim_ids(q)
        if not got:
            break
        ran += got
    assert [job_id.rsplit(":", 1)[1] for job_id, _ in ran] == [str(h * HOUR_MS) for h in ran_hours]
    # Then the 14:00 run, of the new definition.
    assert pending_of(client=q.client, q=q, name="hourly") == f"schedule:hourly:{14 * HOUR_MS}"


@pytest.mark.parametrize("jitter_before, jitter_after", [(0, 1_800_000), (1_800_000, 0)])
def test_a_kept_run_whose_jitter_changed_reports_when_it_is_due(
    tq: tuple[Queue, Clock], client: redis.Redis, jitter_before: int, jitter_after: int
) -> None:
    """The kept run keeps its time (it is due: it runs as it was placed) while the schedule
    stores the new jitter's offset: next_run_ms is the run's own due time, not its slot plus
    the new offset (before: 10:00 + the new offset, a time the run did not have). Its claim
    records the slot as run, so a later redefinition never places it again."""
    q, clock = tq
    clock.set_ms(9 * HOUR_MS + 1)
    q.schedule("hourly", "t", {"v": 1}, every_ms=HOUR_MS, jitter_ms=jitter_before)
    kept = pending_of(client, q, "hourly")
    slot = int(kept.rsplit(":", 1)[1])
    due_at = client.zscore(q.keys.due, kept)
    assert due_at is not None
    clock.set_ms(int(due_at) + 5)  # due, not taken yet
    q.schedule("hourly", "t", {"v": 2}, every_ms=HOUR_MS, jitter_ms=jitter_after)
    assert pending_of(client, q, "hourly") == kept
    offset = int(str(client.hget(q.keys.schedule("hourly"), "offset_ms")))
    assert offset != int(due_at) - slot  # the jitter did change the offset
    for s in (q.get_schedule("hourly"), *q.list_schedules()):
        assert s.next_run_ms == int(due_at)
    assert [job_id for job_id, _ in claim_ids(q)] == [kept]
    assert int(str(client.hget(q.keys.schedule("hourly"), "ran_ms"))) == slot
    nxt = pending_of(client, q, "hourly")
    assert nxt.endswith(str(slot + HOUR_MS))
    assert q.get_schedule("hourly").next_run_ms == client.zscore(q.keys.due, nxt)
    assert q.get_schedule("hourly").next_run_ms == slot + HOUR_MS + offset
