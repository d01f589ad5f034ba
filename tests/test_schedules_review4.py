"""Fourth review of recurring schedules, under operations: a queue paused and resumed, a queue
moved (`queue move`), a definition changed or removed while a run is leased, many schedules due
at one instant, overlap (concurrency_limit=1), America/New_York's DST gap and fold, and the
misfire policy after a long worker outage. Real scripts on the test clock (tests/conftest.py
`tq`).

A test that fails shows a defect (its docstring says what a user sees); the others guard
behaviour checked here that held."""

from __future__ import annotations

import os
import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.queue_move import MoveRefused, move_queue
from scheduler.cli.main import main
from tests.conftest import Clock, delete_queue, new_queue
from tests.fixtures.slot_move import queue_on_the_move
from tests.test_schedules_review3 import _Explorer, _wall_slots

MIN_MS = 60_000
HOUR_MS = 3_600_000
BASE = 1_000 * 600_000  # a multiple of every interval used here
NY = ZoneInfo("America/New_York")


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, tz: Any = UTC) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=tz).timestamp() * 1000)


def slot_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def fresh_runs(client: redis.Redis, q: Queue, name: str) -> list[str]:
    """Never-claimed runs of `name` waiting in due."""
    out = []
    for jid in map(str, client.zrange(q.keys.due, 0, -1)):
        sched, fence = client.hmget(q.keys.job(jid), "schedule", "fence")
        if sched == name and fence is None:
            out.append(jid)
    return out


def work(q: Queue, clock: Clock, client: redis.Redis, now_ms: int, done: Counter[str]) -> list[str]:
    """One worker pass at `now_ms`: claim everything due and complete it; checks that no run
    is claimed before its run time. Returns the ids run (in claim order)."""
    clock.set_ms(now_ms)
    ran: list[str] = []
    for _ in range(10_000):
        batch = q.claim("w", limit=10, lease_ms=30_000)
        for job in batch.jobs:
            run_at = int(client.hget(q.keys.job(job.id), "run_at_ms") or 0)
            assert run_at <= now_ms, f"{job.id} claimed at {now_ms}, before its run_at {run_at}"
            q.complete(job.id, job.token)
            done[job.id] += 1
            ran.append(job.id)
        if len(batch.jobs) < 10 and not (0 <= batch.next_ms <= now_ms):
            return ran
    raise AssertionError("claims did not settle")


# -- America/New_York: the DST gap and fold --------------------------------------------------------


def test_new_york_0230_on_the_spring_forward_day_runs_once_at_0330_edt(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: 02:30 does not exist in New York on 8 March 2026; README: it runs once, shifted
    forward by the gap (03:30 EDT = 07:30 UTC), and the next day at 02:30 EDT again."""
    q, clock = tq
    start = ms(2026, 3, 7, 12)
    clock.set_ms(start)
    q.schedule("gap", "t", cron="30 2 * * *", tz="America/New_York")
    done: Counter[str] = Counter()
    for quarter in range(0, 4 * 60):
        work(q, clock, client, start + quarter * 15 * MIN_MS, done)
    # 02:30 EST does not exist on the 8th: 03:30 EDT (07:30 UTC); the 9th at 02:30 EDT.
    assert sorted(slot_of(i) for i in done) == [ms(2026, 3, 8, 7, 30), ms(2026, 3, 9, 6, 30)]
    assert set(done.values()) == {1}


def test_new_york_0130_on_the_fall_back_day_runs_once_at_its_first_pass(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: 01:30 happens twice in New York on 1 November 2026; README: it runs once, at its
    first occurrence (01:30 EDT = 05:30 UTC), not again at 01:30 EST (06:30 UTC)."""
    q, clock = tq
    start = ms(2026, 10, 31, 12)
    clock.set_ms(start)
    q.schedule("fold", "t", cron="30 1 * * *", tz="America/New_York")
    done: Counter[str] = Counter()
    for quarter in range(0, 4 * 48):
        work(q, clock, client, start + quarter * 15 * MIN_MS, done)
    assert sorted(slot_of(i) for i in done) == [ms(2026, 11, 1, 5, 30), ms(2026, 11, 2, 6, 30)]
    assert set(done.values()) == {1}


def test_half_hourly_new_york_runs_across_the_gap_and_fold_once_each(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: '*/30 1-3 * * *' in New York. Spring day: 01:00, 01:30 EST, then 02:00 and 02:30
    (shifted onto 03:00 and 03:30 EDT, which exist too) run once each instant. Fall day: the
    first pass of 01:00 and 01:30 (EDT) only, then 02:00 and 02:30 EST."""
    q, clock = tq
    for day, expect in [
        (
            (2026, 3, 8),
            [ms(2026, 3, 8, h, m) for h, m in ((6, 0), (6, 30), (7, 0), (7, 30))],
        ),
        (
            (2026, 11, 1),
            [ms(2026, 11, 1, h, m) for h, m in ((5, 0), (5, 30), (7, 0), (7, 30), (8, 0), (8, 30))],
        ),
    ]:
        start = ms(*day, 0)
        clock.set_ms(start)
        q.schedule("hh", "t", cron="*/30 1-3 * * *", tz="America/New_York")
        done: Counter[str] = Counter()
        for five in range(0, 12 * 12):
            work(q, clock, client, start + five * 5 * MIN_MS, done)
        assert sorted(slot_of(i) for i in done) == expect, day
        assert set(done.values()) == {1}
        q.remove_schedule("hh")


# -- a whole queue paused and resumed ------------------------------------------------------------


@pytest.mark.parametrize(
    ("misfire", "expect"), [("skip", []), ("run_once", [10]), ("catch_up:3", [8, 9, 10])]
)
def test_runs_missed_while_the_queue_was_paused_meet_the_misfire_policy(
    tq: tuple[Queue, Clock], client: redis.Redis, misfire: str, expect: list[int]
) -> None:
    """Held: a queue paused over ten minutes of an every-minute schedule leases nothing (its
    pending run waits); resumed, the runs missed meet the policy as after an outage: none,
    the latest once, or the latest three in order, none before its time; then the next future
    slot is pending, once."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("m", "t", every_ms=MIN_MS, misfire=misfire)
    done: Counter[str] = Counter()
    assert q.pause() == "paused"
    assert work(q, clock, client, BASE + 10 * MIN_MS + 30_000, done) == []
    assert fresh_runs(client, q, "m") == [f"schedule:m:{BASE + MIN_MS}"]
    assert q.resume() == "resumed"
    ran = work(q, clock, client, BASE + 10 * MIN_MS + 30_000, done)
    assert [(slot_of(i) - BASE) // MIN_MS for i in ran] == expect
    assert fresh_runs(client, q, "m") == [f"schedule:m:{BASE + 11 * MIN_MS}"]
    assert set(done.values()) <= {1}


def test_a_schedule_paused_and_resumed_inside_a_queue_pause_does_not_make_up_runs(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: README: `resume` starts at the next future slot. A schedule paused and resumed
    while its queue is paused has one pending run, at the next future slot, and the queue's
    resume runs nothing missed."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("m", "t", every_ms=MIN_MS, misfire="catch_up:5")
    q.pause()
    clock.set_ms(BASE + 5 * MIN_MS + 1)
    assert q.pause_schedule("m") == "paused"
    assert fresh_runs(client, q, "m") == []
    clock.set_ms(BASE + 9 * MIN_MS + 1)
    assert q.resume_schedule("m") == "resumed"
    q.resume()
    done: Counter[str] = Counter()
    assert work(q, clock, client, BASE + 9 * MIN_MS + 2, done) == []
    assert fresh_runs(client, q, "m") == [f"schedule:m:{BASE + 10 * MIN_MS}"]


# -- a run leased while its schedule is removed, redefined or paused -----------------------------


def test_removed_while_its_run_is_leased_the_run_finishes_and_arms_nothing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: README: remove deletes the schedule and its pending run; a run already leased
    finishes and inserts nothing; defined again, the leased slot is not placed again."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("r", "t", every_ms=MIN_MS)
    clock.set_ms(BASE + MIN_MS)
    (job,) = q.claim("w", limit=5, lease_ms=30_000).jobs
    assert job.id == f"schedule:r:{BASE + MIN_MS}"
    assert fresh_runs(client, q, "r") == [f"schedule:r:{BASE + 2 * MIN_MS}"]
    assert q.remove_schedule("r") == "removed"
    assert fresh_runs(client, q, "r") == []
    q.complete(job.id, job.token)
    assert fresh_runs(client, q, "r") == []
    assert q.list_schedules() == []
    assert q.schedule("r", "t", every_ms=MIN_MS) == "created"
    assert fresh_runs(client, q, "r") == [f"schedule:r:{BASE + 2 * MIN_MS}"]


def test_redefined_while_its_run_is_leased_one_run_is_pending_and_the_slot_runs_once(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: a redefinition (cron instead of every minute, the same instants) while a run is
    leased replaces the pending run; the leased slot is not placed again even after its lease
    lapses and its retry runs; one pending run afterwards."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("r", "t", every_ms=MIN_MS, max_attempts=3)
    clock.set_ms(BASE + MIN_MS)
    (job,) = q.claim("w", limit=5, lease_ms=1_000).jobs
    clock.set_ms(BASE + MIN_MS + 500)
    assert q.schedule("r", "t2", cron="* * * * *", max_attempts=3) == "updated"
    assert fresh_runs(client, q, "r") == [f"schedule:r:{BASE + 2 * MIN_MS}"]
    done: Counter[str] = Counter()
    # Its lease lapses: the retry runs (the old task), the new pending waits for its time.
    ran = work(q, clock, client, BASE + MIN_MS + 5_000, done)
    assert ran == [job.id]
    assert client.hget(q.keys.job(job.id), "task") == "t"
    ran = work(q, clock, client, BASE + 2 * MIN_MS, done)
    ran += work(q, clock, client, BASE + 3 * MIN_MS, done)
    assert [slot_of(i) - BASE for i in ran] == [2 * MIN_MS, 3 * MIN_MS]
    assert set(done.values()) == {1}
    assert fresh_runs(client, q, "r") == [f"schedule:r:{BASE + 4 * MIN_MS}"]


# -- many schedules due at one instant, and overlap ------------------------------------------------


def test_two_hundred_schedules_due_at_one_instant_each_run_once_and_rearm(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: 100 interval and 100 cron schedules with the same minute, all due at once, run
    once each, whatever the claim batches, and each has its next run pending."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    names = [f"s{i:03d}" for i in range(200)]
    for i, n in enumerate(names):
        kw: dict[str, Any] = {"every_ms": MIN_MS} if i % 2 else {"cron": "* * * * *"}
        q.schedule(n, "t", **kw)
    done: Counter[str] = Counter()
    ran = work(q, clock, client, BASE + MIN_MS + 10, done)
    assert sorted(ran) == sorted(f"schedule:{n}:{BASE + MIN_MS}" for n in names)
    for n in names:
        assert fresh_runs(client, q, n) == [f"schedule:{n}:{BASE + 2 * MIN_MS}"]


def test_with_concurrency_limit_1_a_long_run_holds_the_next_and_run_once_runs_the_latest(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: docs/flow-control.md: with concurrency_limit=1 the next run waits while one is
    leased; when it ends, the held run meets the misfire policy (run_once: the latest missed
    slot runs, once). No two runs of the schedule are leased at once."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("o", "t", every_ms=MIN_MS, concurrency_key="o", concurrency_limit=1)
    clock.set_ms(BASE + MIN_MS)
    (long,) = q.claim("w", limit=5, lease_ms=HOUR_MS).jobs
    for k in range(2, 6):
        clock.set_ms(BASE + k * MIN_MS + 1)
        assert q.claim("w", limit=5, lease_ms=HOUR_MS).jobs == []
    q.complete(long.id, long.token)
    done: Counter[str] = Counter()
    ran = work(q, clock, client, BASE + 5 * MIN_MS + 2, done)
    assert [(slot_of(i) - BASE) // MIN_MS for i in ran] == [5]
    assert fresh_runs(client, q, "o") == [f"schedule:o:{BASE + 6 * MIN_MS}"]


# -- the misfire policy after a long worker outage -------------------------------------------------


@pytest.mark.parametrize(
    ("misfire", "expect_utc"),
    [
        ("skip", []),
        ("run_once", [(7, 0)]),
        ("catch_up:3", [(4, 0), (5, 0), (7, 0)]),
    ],
)
def test_an_hourly_new_york_schedule_back_after_three_days_past_the_fold(
    tq: tuple[Queue, Clock], client: redis.Redis, misfire: str, expect_utc: list[tuple[int, int]]
) -> None:
    """Held: workers away 79 hours (over the 64 buffered slots), back at 02:10 EST on the fall
    back day: the latest missed wall-clock hours are 00:00 EDT, 01:00 EDT (01:00 EST is the
    repeated pass, not a slot) and 02:00 EST; the policy runs none, the latest, or the latest
    three in order, none before its time, then 03:00 EST is pending."""
    q, clock = tq
    clock.set_ms(ms(2026, 10, 29, 0) + 1)
    q.schedule("ny", "t", cron="0 * * * *", tz="America/New_York", misfire=misfire)
    done: Counter[str] = Counter()
    ran = work(q, clock, client, ms(2026, 11, 1, 7, 10), done)
    assert [slot_of(i) for i in ran] == [ms(2026, 11, 1, h, m) for h, m in expect_utc]
    assert fresh_runs(client, q, "ny") == [f"schedule:ny:{ms(2026, 11, 1, 8, 0)}"]


def test_catch_up_with_jitter_after_an_outage_runs_nothing_early(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: an every-10-minutes schedule with a 4-minute jitter and catch_up:4, workers back
    after 3 hours: four late runs, each of a missed slot whose run time (slot + offset) has
    passed, then the next slot not yet due."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("j", "t", every_ms=10 * MIN_MS, jitter_ms=4 * MIN_MS, misfire="catch_up:4")
    offset = next(s.offset_ms for s in q.list_schedules())
    back = BASE + 180 * MIN_MS + 30_000
    done: Counter[str] = Counter()
    ran = work(q, clock, client, back, done)
    assert len(ran) == 4
    assert all(slot_of(i) + offset <= back for i in ran)
    assert [slot_of(i) for i in ran] == sorted(slot_of(i) for i in ran)
    (nxt,) = fresh_runs(client, q, "j")
    assert slot_of(nxt) + offset > back
    assert slot_of(nxt) - slot_of(ran[-1]) == 10 * MIN_MS


# -- a queue with schedules moved (`queue move`): what the user is told ------------------------


def test_queue_move_of_a_source_with_schedules_is_refused_with_the_remedy(
    client: redis.Redis, redis_url: str
) -> None:
    """Held: docs/cluster.md: a source with schedules is refused (exit 1) unless
    --skip-schedules, nothing moved; with it, the schedule's pending run stays and is counted
    as `schedule` in the report, the schedule keeps its run in the source."""
    src, dst = new_queue(client, "r4s-"), new_queue(client, "r4d-")
    try:
        src.schedule("hourly", "t", every_ms=HOUR_MS)
        src.schedule("nightly", "t", cron="0 3 * * *", tz="America/New_York")
        jid = src.enqueue("t", {"a": 1})
        args = ["queue", "move", "--from", src.name, "--to", dst.name, "--url", redis_url]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1, res.output
        assert "2 schedule(s)" in res.output and "--skip-schedules" in res.output
        assert src.status(jid) == "due"
        with pytest.raises(MoveRefused, match="schedule"):
            move_queue(client, src.name, dst.name)
        res = CliRunner().invoke(main, [*args, "--skip-schedules", "--json"])
        assert res.exit_code == 0, res.output
        assert '"schedule": 2' in res.output
        assert dst.status(jid) == "due"
        pend = {s.name: s.pending for s in src.list_schedules()}
        assert all(pend.values()) and all(
            src.status(p) in ("due", "scheduled") for p in pend.values()
        )
    finally:
        delete_queue(client, src)
        delete_queue(client, dst)


def test_a_queue_pause_costs_at_most_n_dead_letters_to_a_start_window(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Held: docs/guide/schedules.md: after an outage (here a queue paused ten minutes) the
    misfire policy decides first; the runs it keeps must still start within their window: with
    catch_up:3 and a 10 s window at most three dead letters ('start deadline passed', never
    started), nothing leased, then the next future run pending."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("w", "t", every_ms=MIN_MS, misfire="catch_up:3", start_within_ms=10_000)
    q.pause()
    clock.set_ms(BASE + 10 * MIN_MS + 30_000)
    q.resume()
    done: Counter[str] = Counter()
    assert work(q, clock, client, BASE + 10 * MIN_MS + 30_000, done) == []
    dead = sorted(map(str, client.zrange(q.keys.dead, 0, -1)))
    assert [(slot_of(i) - BASE) // MIN_MS for i in dead] == [8, 9, 10]
    assert {client.hget(q.keys.job(i), "attempts") for i in dead} == {"0"}
    assert fresh_runs(client, q, "w") == [f"schedule:w:{BASE + 11 * MIN_MS}"]


def test_a_schedule_name_left_in_the_index_without_its_hash_does_not_block_queue_move(
    client: redis.Redis, redis_url: str
) -> None:
    """Defect: a schedule whose hash is gone (deleted in redis-cli to get rid of it, or
    evicted) leaves its name in the queue's `schedules` SET. `schedules list` shows "no
    schedules", `schedules remove x` answers "x: missing" (exit 1), doctor reports nothing,
    yet `queue move` refuses (exit 1) with "queue 'src' has 1 schedule(s): define them on
    'dst', remove them here, then move": a remedy the user cannot follow (only
    --skip-schedules or a hand SREM gets past it). The check counts the index
    (scheduler/admin/queue_move_check.py check_move: SCARD of `schedules`), the list and
    remove read the hashes; schedule_remove.lua returns 'missing' before its SREM."""
    src, dst = new_queue(client, "r4s-"), new_queue(client, "r4d-")
    try:
        src.schedule("x", "t", every_ms=HOUR_MS)
        src.enqueue("t", {"a": 1})
        client.delete(src.keys.schedule("x"))
        cli = CliRunner()
        url = ["--url", redis_url]
        # Listed flagged (what `queue move` counts is what the list shows), and its remove
        # answers 'removed': it drops the name the list showed.
        out = cli.invoke(main, ["schedules", "list", "-q", src.name, *url]).output
        assert "UNREADABLE" in out and "x" in out, out
        res = cli.invoke(main, ["schedules", "remove", "x", "-q", src.name, *url])
        assert res.exit_code == 0 and "removed" in res.output, res.output
        res = cli.invoke(main, ["schedules", "remove", "x", "-q", src.name, *url])
        assert res.exit_code == 1 and "missing" in res.output, res.output
        res = cli.invoke(main, ["queue", "move", "--from", src.name, "--to", dst.name, *url])
        assert res.exit_code == 0, res.output
    finally:
        delete_queue(client, src)
        delete_queue(client, dst)


def test_doctors_fix_for_a_schedule_key_of_another_type_can_be_followed(
    client: redis.Redis, redis_url: str
) -> None:
    """Defect: a schedule key edited by hand into another type (here a string). `scheduler
    doctor` reports it (wrong-type: "... is a string, not a schedule hash: its runs stopped")
    with the fix "remove it and define it again (`scheduler schedules remove`, then add it)".
    Followed: `schedules remove x` answers "x: missing" (exit 1) and leaves the key, and
    `schedules add x` is refused ("schedule:x is not a hash"), so the fix cannot be done with
    the tool; `queue move` meanwhile refuses the queue for its "1 schedule(s)". Cause:
    lua/lib/schedule.lua sched_husk returns nil when HMGET fails on another type, so
    schedule_remove.lua answers 'missing' before its DEL (scheduler/admin/doctor_keys.py
    gives the remedy)."""
    q = new_queue(client, "r4w-")
    try:
        q.schedule("x", "t", every_ms=HOUR_MS)
        client.delete(q.keys.schedule("x"))
        client.set(q.keys.schedule("x"), "edited by hand")
        cli, url = CliRunner(env={"REDIS_URL": None}), ["-q", q.name, "--url", redis_url]
        res = cli.invoke(main, ["doctor", *url])
        assert "not a schedule hash" in res.output
        # The line names the URL doctor was given (admin/redis_cli.py with_url).
        assert f"`scheduler schedules remove --url {redis_url}`, then add it" in res.output
        res = cli.invoke(main, ["schedules", "remove", "x", *url])
        assert res.exit_code == 0, res.output
        res = cli.invoke(main, ["schedules", "add", "x", "t", "--every", "1h", *url])
        assert res.exit_code == 0, res.output
        assert [s.name for s in q.list_schedules()] == ["x"]
    finally:
        delete_queue(client, q)


def test_a_cron_buffer_key_of_another_type_is_reported_not_a_silent_stop(
    tq: tuple[Queue, Clock], client: redis.Redis, redis_url: str
) -> None:
    """Defect: a cron schedule's slot buffer (`schedule:<name>:slots`) edited by hand into
    another type stops the schedule after its next claim (starved, the refill answers
    'unreadable' and is dropped) until an operator pauses and resumes it or changes its
    definition, and nothing tells them to: `schedules list` shows
    `next -` with no UNREADABLE mark (Schedule.unreadable is ''), defining it again with the
    same definition answers 'unchanged' (the client's shortcut: starved counts as unchanged)
    and repairs nothing, and `scheduler doctor` reports no finding, where README says a key
    of another type is reported by doctor (`wrong-type`). scheduler/admin/doctor_keys.py
    checks each schedule hash, not its slots key."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("x", "t", cron="* * * * *")
    client.delete(q.keys.schedule_slots("x"))
    client.set(q.keys.schedule_slots("x"), "edited by hand")
    done: Counter[str] = Counter()
    assert len(work(q, clock, client, BASE + MIN_MS, done)) == 1
    assert work(q, clock, client, BASE + 3 * MIN_MS, done) == []  # stopped
    assert q.get_schedule("x").pending == ""
    res = CliRunner().invoke(main, ["doctor", "-q", q.name, "--url", redis_url, "--json"])
    assert q.keys.schedule_slots("x") in res.output, res.output


def test_a_refill_one_worker_could_not_compute_does_not_stop_the_schedule_for_good(
    tq: tuple[Queue, Clock], client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: after an outage longer than a cron schedule's 64 buffered slots, the claiming
    worker tops the buffer up. If that one host cannot load the schedule's zone at that moment
    (its zoneinfo lacks the name: an older tz database, or an OSError such as EMFILE while
    reading the file), refill_slots raises, scheduler/operations/schedule_refill.py
    _refill_args catches it (UNREADABLE: BadArgument is a ValueError) and sends the refill
    with no slots, and lua/schedule_refill.lua drops the request as if the definition were
    unreadable. The schedule is starved with nothing asking for a refill: no other worker
    ever tops it up, and the producer's restart with the same definition answers 'unchanged'
    (the starved shortcut in ScheduleOps._unchanged). The schedule stops until an operator
    happens to pause and resume it or change its definition, and nothing tells them:
    `schedules list` shows `next -`, not UNREADABLE, and doctor says nothing. A failure of
    the client's own computation should leave the request for the next claim (or the same
    definition should re-place a starved schedule with no refill asked for)."""
    q, clock = tq
    clock.set_ms(BASE + 1)
    definition: dict[str, Any] = {"cron": "* * * * *", "tz": "America/New_York"}
    q.schedule("c", "t", **definition)
    where = "scheduler.schedules.cron_slots.ZoneInfo"

    def host_without_the_zone(key: str) -> Any:
        raise ZoneInfoNotFoundError(f"No time zone found with key {key}")

    monkeypatch.setattr(where, host_without_the_zone)
    done: Counter[str] = Counter()
    work(q, clock, client, BASE + 200 * MIN_MS + 1_000, done)  # that worker's claims
    monkeypatch.setattr(where, ZoneInfo)  # the fleet's other workers, or that one fixed
    assert q.schedule("c", "t", **definition) in ("unchanged", "repaired", "updated")
    ran = work(q, clock, client, BASE + 202 * MIN_MS + 1_000, done)
    ran += work(q, clock, client, BASE + 203 * MIN_MS + 1_000, done)
    assert ran, q.get_schedule("c")


# -- a queue's hash slot being moved between cluster nodes -----------------------------------------

SAYS = "is being migrated to another Redis Cluster node"


@pytest.mark.parametrize("most", [4, None], ids=["keys-split", "all-moved"])
@pytest.mark.parametrize(
    "args",
    [
        ["schedules", "list"],
        ["schedules", "add", "nightly", "t", "--every", "2h"],
        ["schedules", "pause", "nightly"],
        ["schedules", "resume", "nightly"],
        ["schedules", "remove", "nightly"],
        ["schedules", "run", "nightly"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_schedule_commands_on_a_queue_whose_slot_is_moving_say_so_and_write_nothing(
    cluster_url: str, queue_name: str, args: list[str], most: int | None
) -> None:
    """Held: docs/cluster.md / README exit codes: while a queue's slot is being moved, a
    schedule command is refused for now (exit 3) with a line saying the slot is being
    migrated, not a traceback (every script names the queue's prefix, a key that never exists,
    among its keys: a split slot answers TRYAGAIN or ASK to each, none runs half there)."""
    with queue_on_the_move(cluster_url, queue_name, jobs=2, every_ms=HOUR_MS, most=most):
        res = CliRunner().invoke(main, [*args, "-q", queue_name, "--url", cluster_url])
        assert res.exit_code == 3, res.output
        assert SAYS in res.output, res.output
        assert "Traceback" not in res.output


# -- a random-sequence explorer with the whole queue paused and resumed ----------------------------


class _PausingExplorer(_Explorer):
    """tests/test_schedules_review3.py's explorer of schedule programs (define, redefine,
    pause, resume, remove, run now, cancels, outages, lapses, dead letters), with the whole
    queue paused and resumed now and then: while it is paused no claim leases anything, and
    the explorer's invariants hold throughout (one never-claimed run per active schedule, no
    slot claimed for its first attempt twice, nothing claimed before its run time)."""

    def __init__(self, q: Queue, clock: Clock, client: redis.Redis, seed: int) -> None:
        super().__init__(q, clock, client, seed)
        self.queue_paused = False

    def claim(self) -> str:
        if self.queue_paused:
            batch = self.q.claim("w", limit=4, lease_ms=10_000)
            if batch.jobs:
                self.fail(f"claimed {[j.id for j in batch.jobs]} from a paused queue")
            return "[] (queue paused)"
        return super().claim()

    def step(self) -> str:
        if self.rng.random() < 0.06:
            self.queue_paused = not self.queue_paused
            return "queue " + (self.q.pause() if self.queue_paused else self.q.resume())
        return super().step()

    def run(self, steps: int) -> None:
        for i in range(steps):
            self.log.append(f"{i} t={(self.now - BASE) // 1000}s {self.step()}")
            self.check()
        if self.queue_paused:
            self.q.resume()
            self.queue_paused = False
        super().run(0)


@pytest.mark.parametrize("seed", range(int(os.environ.get("R4_SEEDS", "8"))))
def test_random_programs_with_queue_pauses_keep_one_pending_run_never_early_never_twice(
    tq: tuple[Queue, Clock], client: redis.Redis, seed: int
) -> None:
    q, clock = tq
    _PausingExplorer(q, clock, client, 4_000 + seed).run(220)


@pytest.mark.parametrize("seed", range(int(os.environ.get("R4_SEEDS", "8"))))
@pytest.mark.parametrize("day", [(2026, 3, 8), (2026, 11, 1)], ids=["spring", "fall"])
def test_new_york_outages_around_a_change_run_wall_slots_once_and_the_latest_missed(
    tq: tuple[Queue, Clock], client: redis.Redis, seed: int, day: tuple[int, int, int]
) -> None:
    """Held: a New York cron schedule (random expression and policy) worked at random times
    over a DST change, outages included: every run is a wall-clock slot (README's reading:
    a gap's times shifted by it, a repeated time at its first pass, equal instants once), runs
    once, never before its time, and after each pause in the work the latest missed slot has
    run (run_once, catch_up:2), at most N late ones run."""
    rng = random.Random(seed)
    q, clock = tq
    expr = rng.choice(["*/20 0-4 * * *", "15 1,2 * * *", "0,30 * * * *", "45 1 * * *"])
    misfire = rng.choice(["skip", "run_once", "catch_up:2"])
    start = ms(*day, 0) - 20 * HOUR_MS
    wall = _wall_slots(expr, "America/New_York", start, start + 3 * 24 * HOUR_MS)
    now = start
    clock.set_ms(now)
    q.schedule("ny", "t", cron=expr, tz="America/New_York", misfire=misfire)
    done: Counter[str] = Counter()
    last = now
    while now < start + 2 * 24 * HOUR_MS:
        now += rng.choice([5, 20, 45, 90, 300, 600]) * MIN_MS + rng.randint(0, 59_999)
        ran = [slot_of(i) for i in work(q, clock, client, now, done)]
        why = (expr, misfire, last, now, ran)
        assert set(ran) <= set(wall), why
        missed = [s for s in wall if last < s <= now]
        late = [s for s in ran if s in missed[:-1]]
        assert len(late) <= max(1, int(misfire.partition(":")[2] or 1)), why
        if missed and misfire != "skip":
            assert missed[-1] in ran or done[f"schedule:ny:{missed[-1]}"] == 1, why
        last = now
    assert set(done.values()) <= {1}
