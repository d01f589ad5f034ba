"""A due run a redefinition kept (tests/test_schedule_redefine_due.py) keeps the time it was
placed at, while the schedule stores the new jitter's offset. Everything that judges or shows
that run reads its own time (its score in due or flow:held, its run_at_ms), never its slot plus
the stored offset:
- a second redefinition while it still waits keeps it again (before: judged not due by slot +
  the new, larger offset, it was withdrawn and its slot placed again later with the new payload);
- cancelled after its own time, its slot is recorded as run (ran_ms), so no later placing runs
  it again once its record expired;
- held by flow control, next_run_ms is its time in flow:held;
- the dashboard's next runs after it are its slot's successors at the stored offset (before:
  its due time plus whole intervals, the old offset).
Server time is the test clock (tq)."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.dashboard.schedule_view import next_runs
from tests.conftest import Clock

HOUR_MS = 3_600_000


def pending_of(client: redis.Redis, q: Queue, name: str) -> str:
    return str(client.hget(q.keys.schedule(name), "pending"))


def offset_of(client: redis.Redis, q: Queue, name: str) -> int:
    return int(str(client.hget(q.keys.schedule(name), "offset_ms")))


def kept_with_a_later_offset(q: Queue, clock: Clock, client: redis.Redis) -> tuple[str, int, int]:
    """An hourly schedule without jitter whose 10:00 run is due and waiting, redefined with a
    wide jitter: the run is kept, due at 10:00, while 10:00 + the new offset is still ahead.
    Returns (its id, its due time, its slot)."""
    clock.set_ms(9 * HOUR_MS + 1)
    q.schedule("hourly", "t", {"v": 1}, every_ms=HOUR_MS)
    kept = pending_of(client, q, "hourly")
    slot = int(kept.rsplit(":", 1)[1])
    clock.set_ms(slot + 5)
    q.schedule("hourly", "t", {"v": 2}, every_ms=HOUR_MS, jitter_ms=HOUR_MS - 1)
    assert pending_of(client, q, "hourly") == kept
    offset = offset_of(client, q, "hourly")
    assert offset > 1_000, offset  # slot + offset is still ahead: the case under test
    return kept, slot, slot


def test_a_kept_run_is_kept_again_by_the_next_redefinition(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    kept, due_at, slot = kept_with_a_later_offset(q, clock, client)
    clock.set_ms(slot + 500)  # still waiting; slot + the stored offset not reached
    q.schedule("hourly", "t", {"v": 3}, every_ms=HOUR_MS, jitter_ms=HOUR_MS - 1, max_attempts=2)
    assert pending_of(client, q, "hourly") == kept
    assert client.zscore(q.keys.due, kept) == due_at
    assert q.get_schedule("hourly").next_run_ms == due_at
    (job,) = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert (job.id, job.payload()) == (kept, {"v": 1})  # as it was placed
    nxt = pending_of(client, q, "hourly")
    assert nxt == f"schedule:hourly:{slot + HOUR_MS}"
    assert q.get_job(nxt).payload() == {"v": 3}


def test_a_kept_run_cancelled_after_its_time_is_recorded_as_run(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    kept, _, slot = kept_with_a_later_offset(q, clock, client)
    clock.set_ms(slot + 500)
    assert q.cancel(kept) == "due"
    assert int(str(client.hget(q.keys.schedule("hourly"), "ran_ms"))) == slot
    # Its record expires; a redefinition with another wide jitter places from after it, so the
    # cancelled 10:00 run never comes back.
    client.delete(q.keys.job(kept), q.keys.spec(kept))
    q.schedule("hourly", "t", {"v": 4}, every_ms=HOUR_MS, jitter_ms=HOUR_MS - 2)
    assert int(pending_of(client, q, "hourly").rsplit(":", 1)[1]) > slot


def test_a_held_kept_run_reports_its_time_in_flow_held(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(9 * HOUR_MS + 1)
    opts = {"every_ms": HOUR_MS, "concurrency_key": "k", "concurrency_limit": 1}
    q.schedule("held", "t", {"v": 1}, **opts)  # type: ignore[arg-type]
    blocker = q.enqueue("other", None, concurrency_key="k", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=1, lease_ms=3 * HOUR_MS).jobs] == [blocker]
    occ = pending_of(client, q, "held")
    slot = int(occ.rsplit(":", 1)[1])
    clock.set_ms(slot + 5)
    assert q.claim("w", limit=10).jobs == []  # due, set aside behind its key
    held_at = client.zscore(q.keys.flow_held, occ)
    assert held_at == slot and client.zscore(q.keys.due, occ) is None
    q.schedule("held", "t", {"v": 2}, jitter_ms=HOUR_MS - 1, **opts)  # type: ignore[arg-type]
    assert pending_of(client, q, "held") == occ  # kept: due and waiting
    assert slot + offset_of(client, q, "held") != held_at
    assert q.get_schedule("held").next_run_ms == held_at
    assert [s.next_run_ms for s in q.list_schedules()] == [held_at]


def test_the_dashboards_next_runs_of_a_kept_run_use_the_stored_offset_after_it(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    kept, due_at, slot = kept_with_a_later_offset(q, clock, client)
    s = q.get_schedule("hourly")
    assert s.pending == kept and s.next_run_ms == due_at
    assert next_runs(s, slot + 5) == [due_at, slot + HOUR_MS + s.offset_ms,
                                      slot + 2 * HOUR_MS + s.offset_ms]  # fmt: skip


def test_a_smaller_jitter_does_not_skip_the_waiting_run(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """A daily 09:00 run placed at 09:00 + its jitter's offset (an hourly one alike), redefined
    before then without jitter: its slot is overdue under the new definition. Placed from now,
    it was skipped (the next run the day after); it runs now, with the new definition."""
    q, clock = tq
    for kind, opts in (("cron", {"cron": "0 9 * * *"}), ("every", {"every_ms": HOUR_MS})):
        name = f"daily-{kind}"
        clock.set_ms(8 * HOUR_MS)
        q.schedule(name, "t", {"v": 1}, jitter_ms=HOUR_MS - 1, **opts)
        pending = pending_of(client, q, name)
        slot = int(pending.rsplit(":", 1)[1])
        offset = offset_of(client, q, name)
        assert offset > 60_000, offset
        if kind == "cron":
            assert slot == 9 * HOUR_MS, slot
        clock.set_ms(slot + offset // 2)  # before its time: waiting, not due
        assert q.schedule(name, "t", {"v": 2}, **opts) == "updated"
        assert pending_of(client, q, name) == pending  # the same slot, not tomorrow's
        assert client.zscore(q.keys.due, pending) == slot  # due at once, by the new offset
        assert q.get_job(pending).payload() == {"v": 2}


def test_a_changed_cron_does_not_run_the_old_slot(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """The withdrawn slot runs only if it is one of the new definition's: a cron moved from
    09:00 to 09:30 places 09:30, not the old 09:00 that is now past."""
    q, clock = tq
    clock.set_ms(8 * HOUR_MS)
    q.schedule("moved", "t", cron="0 9 * * *", jitter_ms=HOUR_MS - 1)
    offset = offset_of(client, q, "moved")
    clock.set_ms(9 * HOUR_MS + offset // 2)
    q.schedule("moved", "t", cron="30 9 * * *")
    nxt = int(pending_of(client, q, "moved").rsplit(":", 1)[1])
    assert nxt > 9 * HOUR_MS and nxt % (24 * HOUR_MS) == 9 * HOUR_MS + 30 * 60_000, nxt


def test_a_kept_run_meets_the_new_crons_missed_times_after_two_redefinitions(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """An hourly cron's 09:00 run, kept by a redefinition that gave the schedule a wide jitter
    (stored offset ~24 min; the run stays due at 09:00), is still waiting at 09:20 when a
    deploy makes it a 5-minute cron with catch_up. The upsert keeps it (due by its own time);
    the client's buffer must judge it the same way and hold the new cron's times missed after
    it (09:05 .. 09:20), which its claim then runs. Before, the client judged it by 09:00 + the
    stored offset (not yet due), so the buffer started at 09:20 and catch_up lost 09:05 ..
    09:15."""
    q, clock = tq
    clock.set_ms(8 * HOUR_MS + 30 * 60_000)
    q.schedule("s", "t", {"v": 1}, cron="0 * * * *")
    kept = pending_of(client, q, "s")
    slot = int(kept.rsplit(":", 1)[1])
    assert slot == 9 * HOUR_MS
    clock.set_ms(slot + 60_000)
    q.schedule("s", "t", {"v": 2}, cron="0 * * * *", jitter_ms=50 * 60_000)
    assert pending_of(client, q, "s") == kept
    assert offset_of(client, q, "s") > 20 * 60_000  # slot + offset is past 09:20
    clock.set_ms(slot + 20 * 60_000)
    q.schedule("s", "t", {"v": 3}, cron="*/5 * * * *", misfire="catch_up:10")
    assert pending_of(client, q, "s") == kept
    (job,) = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert job.id == kept
    nxt = pending_of(client, q, "s")
    assert nxt == f"schedule:s:{slot + 5 * 60_000}", nxt
    assert client.zscore(q.keys.due, nxt) is not None
