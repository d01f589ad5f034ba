"""Recurring schedules on the real scripts with a clock the test controls: exactly one pending
occurrence through crashes, idempotent upserts (also from several processes), DST, misfire
policies, pause/resume/remove, refusal of bad input, and the spike figure."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from scheduler import AsyncQueue, BadArgument, JobSpec, Queue, StaleToken
from scheduler.core.claim_reply import CLAIM_FIELDS
from scheduler.core.connection import connect_async
from scheduler.schedules.cron_slots import cron_slots_upto
from scheduler.schedules.recurring import BUFFER_SLOTS, stable_offset_ms
from tests.conftest import Clock, dump_queue

MIN_MS = 60_000
BERLIN = ZoneInfo("Europe/Berlin")


def ms(*args: int, tz: Any = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[misc]


def pending(client: redis.Redis, q: Queue, name: str) -> list[str]:
    """Fresh (never claimed) occurrences of `name` waiting in due."""
    out = []
    for job_id in client.zrange(q.keys.due, 0, -1):
        f = client.hmget(q.keys.job(job_id), "schedule", "attempts")
        if f[0] == name and f[1] == "0":
            out.append(job_id)
    return out


def work(q: Queue, clock: Clock, now_ms: int, done: Counter[str], *, limit: int = 10) -> list[str]:
    """One worker pass at `now_ms`: claim everything due, complete it; returns the ids run."""
    clock.set_ms(now_ms)
    ran = []
    while True:
        batch = q.claim("w", limit=limit, lease_ms=30_000)
        for job in batch.jobs:
            q.complete(job.id, job.token)
            done[job.id] += 1
            ran.append(job.id)
        if len(batch.jobs) < limit and not (0 <= batch.next_ms <= now_ms):
            return ran


def slot_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


# -- exactly once through crashes ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["cron", "every"])
def test_every_occurrence_runs_exactly_once_while_workers_crash(
    tq: tuple[Queue, Clock], client: redis.Redis, kind: str
) -> None:
    q, clock = tq
    rng = random.Random(4)
    start = 1_000 * MIN_MS
    clock.set_ms(start)
    spec: dict[str, Any] = {"cron": "* * * * *"} if kind == "cron" else {"every_ms": MIN_MS}
    assert q.schedule("tick", "t", {"k": 1}, max_attempts=20, **spec) == "created"
    completed: Counter[str] = Counter()
    claimed_ids: set[str] = set()
    periods = 3 * BUFFER_SLOTS  # several cron-buffer refills
    now = start
    while now < start + periods * MIN_MS:
        now += rng.choice((7_000, 13_000, 20_000))
        clock.set_ms(now)
        # A crash between the claim script and anything after it (the buffer refill):
        # drive the claim operation by hand and abandon it after its first request.
        if rng.random() < 0.3:
            op = q.ops.claim("crasher", limit=5, lease_ms=30_000)
            reply = q._execute(next(op))  # the seam this test exists for
            op.close()
            claimed_ids.update(str(reply[3 + CLAIM_FIELDS * i]) for i in range(int(reply[2])))
            continue
        batch = q.claim("w", limit=5, lease_ms=30_000)
        for job in batch.jobs:
            claimed_ids.add(job.id)
            if rng.random() < 0.3:
                continue  # crashed while running: the lease lapses, the job is claimed again
            try:
                q.complete(job.id, job.token)
                completed[job.id] += 1
            except StaleToken:
                pass
        # The invariant, at every step: one pending occurrence, never two.
        assert len(pending(client, q, "tick")) == 1
    # Drain: no more crashes, time runs on past every lease.
    for extra in range(1, 6):
        work(q, clock, now + extra * 31_000, completed)
    ran = sorted(slot_of(i) for i in completed)
    assert all(n == 1 for n in completed.values())
    assert ran == list(range(ran[0], ran[-1] + MIN_MS, MIN_MS))  # no slot skipped
    assert ran[0] == (start // MIN_MS + 1) * MIN_MS
    assert ran[-1] >= start + (periods - 1) * MIN_MS
    assert claimed_ids <= set(completed)  # everything ever claimed finished
    assert len(pending(client, q, "tick")) == 1


# -- idempotent upsert -----------------------------------------------------------------------------
def test_same_definition_twice_writes_nothing(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    clock.set_s(100)
    assert q.schedule("digest", "t", {"a": 1}, cron="0 9 * * *", tz="Europe/Berlin") == "created"
    before = dump_queue(client, q)
    clock.set_s(5_000)
    assert q.schedule("digest", "t", {"a": 1}, cron="0  9 * * *", tz="Europe/Berlin") == "unchanged"
    assert dump_queue(client, q) == before


def test_changed_definition_replaces_the_pending_occurrence(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(100 * MIN_MS + 5)
    q.schedule("s", "t", {"v": 1}, every_ms=MIN_MS)
    (first,) = pending(client, q, "s")
    assert q.schedule("s", "t", {"v": 2}, every_ms=10 * MIN_MS) == "updated"
    (second,) = pending(client, q, "s")
    assert slot_of(second) == 110 * MIN_MS and not client.exists(q.keys.job(first))
    assert q.get_job(second).payload() == {"v": 2}
    assert [s.name for s in q.list_schedules()] == ["s"]


def _upsert_many(url: str, queue: str, worker: int) -> None:
    q = Queue.from_url(url, queue, _clock="test")
    for i in range(15):
        q.schedule("shared", "report.build", {"tenant": 7}, cron="*/5 * * * *", jitter_ms=30_000)
        if i % 5 == worker % 5:
            q.schedule("shared", "report.build", {"tenant": 7}, cron="*/5 * * * *",
                       jitter_ms=30_000)  # fmt: skip
    q.client.close()


def test_concurrent_upserts_from_processes_leave_one_schedule_and_one_pending_run(
    tq: tuple[Queue, Clock], client: redis.Redis, redis_url: str
) -> None:
    q, clock = tq
    clock.set_s(1_000)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_upsert_many, args=(redis_url, q.name, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert client.smembers(q.keys.schedules) == {"shared"}
    assert len(pending(client, q, "shared")) == 1
    assert q.counts().due + q.counts().scheduled == 1


# -- time zones ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("first_day", "offsets_h"),
    [((2024, 3, 29), [1, 1, 2, 2]), ((2024, 10, 25), [2, 2, 1, 1])],
)
def test_nine_am_berlin_fires_at_nine_local_across_dst(
    tq: tuple[Queue, Clock], first_day: tuple[int, int, int], offsets_h: list[int]
) -> None:
    q, clock = tq
    clock.set_ms(ms(*first_day, 0))
    q.schedule("digest", "mail.digest", cron="0 9 * * *", tz="Europe/Berlin")
    done: Counter[str] = Counter()
    for hour in range(0, 4 * 24):
        work(q, clock, ms(*first_day, 0) + hour * 3_600_000, done)
    local = [datetime.fromtimestamp(slot_of(i) / 1000, BERLIN) for i in sorted(done)]
    assert [(t.hour, t.minute) for t in local] == [(9, 0)] * 4
    assert [int(t.utcoffset().total_seconds()) // 3600 for t in local] == offsets_h  # type: ignore[union-attr]


def test_nonexistent_and_repeated_local_times(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(ms(2024, 3, 30, 12))
    q.schedule("gap", "t", cron="30 2 * * *", tz="Europe/Berlin")
    done: Counter[str] = Counter()
    for hour in range(0, 48):
        work(q, clock, ms(2024, 3, 30, 12) + hour * 3_600_000, done)
    # 02:30 does not exist on 31 March: it fires once, shifted by the gap, at 03:30 CEST.
    assert sorted(slot_of(i) for i in done) == [ms(2024, 3, 31, 1, 30), ms(2024, 4, 1, 0, 30)]

    q2 = Queue(q.client, q.name + "b", _clock="test")
    clock2 = Clock(q.client, q2)
    clock2.set_ms(ms(2024, 10, 26, 12))
    q2.schedule("twice", "t", cron="30 2 * * *", tz="Europe/Berlin")
    done2: Counter[str] = Counter()
    for hour in range(0, 30):
        work(q2, clock2, ms(2024, 10, 26, 12) + hour * 3_600_000, done2)
    # 02:30 happens twice on 27 October: it fires once, the first time (02:30 CEST).
    assert sorted(slot_of(i) for i in done2) == [ms(2024, 10, 27, 0, 30)]
    q2.remove_schedule("twice")
    for k in q.client.scan_iter(match=q2.keys.pattern()):
        q.client.delete(k)


# -- misfire policies ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("misfire", "expect_minutes"),
    [("skip", [12]), ("run_once", [11, 12]), ("catch_up:3", [9, 10, 11, 12])],
)
@pytest.mark.parametrize("kind", ["every", "cron"])
def test_misfire_policies_after_an_outage(
    tq: tuple[Queue, Clock], misfire: str, expect_minutes: list[int], kind: str
) -> None:
    q, clock = tq
    base = 10_000 * MIN_MS
    clock.set_ms(base + 1)
    spec: dict[str, Any] = {"cron": "* * * * *"} if kind == "cron" else {"every_ms": MIN_MS}
    q.schedule("m", "t", misfire=misfire, **spec)  # first slot: base + 1 min
    done: Counter[str] = Counter()
    # Nothing runs for ten minutes; the workers come back at base + 11.5 min.
    work(q, clock, base + 11 * MIN_MS + 30_000, done)
    work(q, clock, base + 12 * MIN_MS, done)
    ran = [(slot_of(i) - base) // MIN_MS for i in sorted(done)]
    assert ran == expect_minutes


def test_outage_longer_than_the_cron_buffer_refills_and_runs_once(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    base = 10_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("long", "t", cron="* * * * *", misfire="run_once")
    done: Counter[str] = Counter()
    back = base + 500 * MIN_MS + 1_000  # far past the 64 buffered slots
    work(q, clock, back, done)
    assert [(slot_of(i) - base) // MIN_MS for i in done] == [500]
    (nxt,) = pending(client, q, "long")
    assert slot_of(nxt) == base + 501 * MIN_MS


# -- pause, resume, remove -------------------------------------------------------------------------
def test_pause_resume_remove(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    base = 10_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("p", "t", cron="* * * * *")
    done: Counter[str] = Counter()
    work(q, clock, base + MIN_MS, done)
    assert q.pause_schedule("p") == "paused"
    assert q.pause_schedule("p") == "already"
    assert pending(client, q, "p") == [] and q.get_schedule("p").paused
    work(q, clock, base + 5 * MIN_MS, done)
    assert len(done) == 1
    # The same definition again does not unpause it.
    assert q.schedule("p", "t", cron="* * * * *") == "unchanged"
    clock.set_ms(base + 5 * MIN_MS + 10)
    assert q.resume_schedule("p") == "resumed"
    assert q.resume_schedule("p") == "active"
    (nxt,) = pending(client, q, "p")
    assert slot_of(nxt) == base + 6 * MIN_MS  # paused slots are not "missed"
    work(q, clock, base + 6 * MIN_MS, done)
    work(q, clock, base + 7 * MIN_MS, done)
    assert sorted((slot_of(i) - base) // MIN_MS for i in done) == [1, 6, 7]
    assert q.remove_schedule("p") == "removed"
    assert q.remove_schedule("p") == "missing"
    assert pending(client, q, "p") == [] and q.list_schedules() == []
    assert not client.exists(q.keys.schedule("p"), q.keys.schedule_slots("p"))


def test_a_pause_between_a_resumes_read_and_its_write_is_read_again(
    tq: tuple[Queue, Clock], client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume_schedule reads the hash (active: no cron slots computed), another operator pauses
    the schedule, then the resume script runs: it was refused with BadArgument 'slots='; it is
    the definition changing under the client ('stale'), so the client reads it again."""
    q, clock = tq
    clock.set_ms(10_000 * MIN_MS + 1)
    q.schedule("p", "t", cron="* * * * *")
    other = Queue(client, q.name, _clock="test")
    real = q._execute
    raced: list[bool] = []

    def execute(req: Any) -> Any:
        reply = real(req)
        if not raced:  # the first request is the hash's read
            raced.append(True)
            assert other.pause_schedule("p") == "paused"
        return reply

    monkeypatch.setattr(q, "_execute", execute)
    assert q.resume_schedule("p") == "resumed"
    s = q.get_schedule("p")
    assert not s.paused and s.next_run_ms == 10_001 * MIN_MS


def test_cancelling_a_pending_occurrence_skips_that_run_only(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(100 * MIN_MS + 1)
    q.schedule("c", "t", every_ms=MIN_MS)
    (first,) = pending(client, q, "c")
    assert q.cancel(first) == "scheduled"
    (second,) = pending(client, q, "c")
    assert second != first and int(second.rsplit(":", 1)[1]) > int(first.rsplit(":", 1)[1])
    assert q.status(first) == "cancelled"
    assert q.schedule("c", "t", every_ms=MIN_MS) == "unchanged"


def test_a_lost_pending_occurrence_is_repaired_by_the_next_upsert(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(100 * MIN_MS + 1)
    q.schedule("c", "t", every_ms=MIN_MS)
    (first,) = pending(client, q, "c")
    client.zrem(q.keys.due, first)  # an operator's mistake in redis-cli
    client.delete(q.keys.job(first))
    assert q.schedule("c", "t", every_ms=MIN_MS) == "repaired"
    assert len(pending(client, q, "c")) == 1


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"cron": "61 * * * *"},
        {"cron": "* * *"},
        {"cron": "0 0 31 2 *"},
        {"cron": "0 9 * * *", "tz": "Mars/Olympus"},
        {"every_ms": 0},
        {"every_ms": -1000},
        {"every_ms": 60_000, "jitter_ms": 60_000},
        {"cron": "*/5 * * * *", "jitter_ms": 300_000},
        {"every_ms": 60_000, "misfire": "sometimes"},
        {"every_ms": 60_000, "misfire": "catch_up:0"},
        {"every_ms": 60_000, "tz": "Europe/Berlin"},
        {},
        {"cron": "* * * * *", "every_ms": 1000},
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(
    tq: tuple[Queue, Clock], client: redis.Redis, kwargs: dict[str, Any]
) -> None:
    q, clock = tq
    clock.set_s(100)
    before = dump_queue(client, q)
    with pytest.raises(BadArgument):
        q.schedule("bad", "t", None, **kwargs)
    assert dump_queue(client, q) == before


def test_bad_names_are_refused(tq: tuple[Queue, Clock]) -> None:
    q, _ = tq
    for name in ("", "a:b", "x" * 65, "{tag}"):
        with pytest.raises(BadArgument):
            q.schedule(name, "t", every_ms=1000)
    with pytest.raises(BadArgument):
        q.schedule("ok", "bad task!", every_ms=1000)


# -- spike jitter ----------------------------------------------------------------------------------
def test_the_seed_spike_figure(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, _ = tq
    top_of_hour = datetime.fromtimestamp(3600, UTC)
    q.enqueue_many([JobSpec("t", None, run_at=top_of_hour) for _ in range(10_000)])
    q.enqueue_many(
        [JobSpec("t", None, run_at=top_of_hour, jitter_ms=60_000) for _ in range(10_000)]
    )
    plain, jittered = Counter[int](), Counter[int]()
    for job_id, score in client.zrange(q.keys.due, 0, -1, withscores=True):
        assert client.get(q.keys.spec(job_id)) is not None
        (jittered if score != 3_600_000 else plain)[int(score) // 1000] += 1
    # Without jitter the whole load lands in one second; with a 60 s window no second gets
    # more than a small fraction of it (the seed's model saw 193 of 10,000).
    assert max(plain.values()) >= 10_000
    assert max(jittered.values()) <= 300
    assert len(jittered) >= 60


def test_schedule_jitter_is_stable_and_spread(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    offsets = Counter(stable_offset_ms(f"tenant-{i}", 60_000) // 1000 for i in range(10_000))
    assert max(offsets.values()) <= 300 and len(offsets) >= 60
    assert stable_offset_ms("tenant-1", 60_000) == stable_offset_ms("tenant-1", 60_000)
    hour = 3_600_000
    clock.set_ms(100 * hour)
    q.schedule("hourly", "t", cron="0 * * * *", jitter_ms=60_000)
    done: Counter[str] = Counter()
    runs = []
    for h in range(1, 5):
        for job_id in work(q, clock, (100 + h) * hour + 60_000, done):
            runs.append(q.get_job(job_id).run_at_ms)
    offset = stable_offset_ms("hourly", 60_000)
    assert runs == [(100 + h) * hour + offset for h in range(1, 5)]
    assert q.get_schedule("hourly").offset_ms == offset


# -- asyncio client --------------------------------------------------------------------------------
def test_async_queue_schedules_and_refills(tq: tuple[Queue, Clock], redis_url: str) -> None:
    q, clock = tq
    clock.set_ms(10_000 * MIN_MS + 1)

    async def main() -> list[str]:
        aq = AsyncQueue(connect_async(redis_url), q.name,
                        _clock="test")  # fmt: skip
        try:
            assert await aq.schedule("a", "t", cron="* * * * *") == "created"
            assert await aq.schedule("a", "t", cron="* * * * *") == "unchanged"
            ran = []
            for minute in range(1, BUFFER_SLOTS + 5):
                clock.set_ms(10_000 * MIN_MS + minute * MIN_MS)
                for job in (await aq.claim("w", limit=10)).jobs:
                    await aq.complete(job.id, job.token)
                    ran.append(job.id)
            assert [s.name for s in await aq.list_schedules()] == ["a"]
            assert await aq.pause_schedule("a") == "paused"
            assert await aq.resume_schedule("a") == "resumed"
            assert await aq.remove_schedule("a") == "removed"
            return ran
        finally:
            await aq.aclose()

    ran = asyncio.run(main())
    assert len(ran) == BUFFER_SLOTS + 4 and len(set(ran)) == len(ran)


# -- command line ---------------------------------------------------------------------------------
def test_cli_lists_pauses_resumes_removes(q: Queue, redis_url: str) -> None:
    from click.testing import CliRunner

    from scheduler.cli.main import main

    q.schedule("nightly", "report.build", {"x": 1}, cron="0 3 * * *", tz="Europe/Berlin")
    run = CliRunner().invoke
    base = ["--url", redis_url, "--queue", q.name]
    out = run(main, ["schedules", "list", *base, "--json"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.output)["schedules"]  # one JSON shape for every command (issue 14)
    assert row["name"] == "nightly" and row["next_run_ms"] is not None
    assert json.loads(run(main, ["schedules", "pause", "nightly", *base, "--json"]).output) == {
        "queue": q.name, "schedule": "nightly", "status": "paused"}  # fmt: skip
    assert "paused" in run(main, ["schedules", "list", *base]).output
    assert run(main, ["schedules", "resume", "nightly", *base]).output.strip() == "nightly: resumed"
    assert run(main, ["schedules", "remove", "nightly", *base]).exit_code == 0
    assert run(main, ["schedules", "remove", "nightly", *base]).exit_code == 1
    assert run(main, ["schedules", "pause", "a:b", *base]).exit_code == 2


def test_an_outage_ending_in_a_repeated_hour_runs_the_latest_missed_time(
    tq: tuple[Queue, Clock],
) -> None:
    """New York falls back at 06:00 UTC on 3 November 2030 (02:00 EDT -> 01:00 EST). Workers
    back at 01:29 EST (the second pass of 01:xx), after an outage longer than the cron buffer:
    the latest missed time is 01:55 EDT (05:55 UTC), not 01:25 (the latest by the wall clock's
    01:29, which the refill took: it searched back from the wall time, so missed the rest of the
    first pass). Found by tests/test_schedule_model.py."""
    q, clock = tq
    clock.set_ms(ms(2030, 11, 2, 18, 0) + 1)
    q.schedule("ny", "t", cron="*/5 * * * *", tz="America/New_York", misfire="run_once")
    done: Counter[str] = Counter()
    work(q, clock, ms(2030, 11, 3, 6, 29, 43), done)  # 12.5 h: over the 64 buffered slots
    assert [slot_of(i) for i in done] == [ms(2030, 11, 3, 5, 55)]
    assert cron_slots_upto("*/5 * * * *", "America/New_York", ms(2030, 11, 3, 6, 29, 43), 3) == [
        ms(2030, 11, 3, 5, m) for m in (45, 50, 55)
    ]
