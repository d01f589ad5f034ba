"""Third review of recurring schedules (cron and interval): definition, redefinition, pause /
resume / remove / run now, the re-arm when a run ends any way, flow control, start windows,
time zones and partitioned queues. Real scripts on the test clock (tests/conftest.py `tq`);
the cron slot checks compare with a brute-force reading of the wall clock, minute by minute.

A test that fails shows a defect (its docstring says what a user sees); the others guard
behaviour checked here that held."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner

from scheduler import Backoff, BadArgument, Queue
from scheduler.cli.main import main
from scheduler.core.errors import SchedulerError
from scheduler.dashboard.schedule_view import next_runs
from scheduler.schedules.cron_slots import check_cron, cron_slots_after, cron_slots_upto
from tests.conftest import Clock, dump_queue
from tests.fixtures.partitioned import MakePq

MIN_MS = 60_000
BASE = 1_000 * 600_000  # a multiple of every interval used here


# -- cron expressions croniter misreads ----------------------------------------------------------


@pytest.mark.parametrize("expr", ["0 0 * * 7/1", "0 0 * * 7/2", "0 0 * * 7/6"])
def test_a_day_of_week_step_from_7_is_refused_as_croniter_misreads_it(
    expr: str, q: Queue, client: redis.Redis, redis_url: str
) -> None:
    """Defect: '7/N' in the day-of-week field (7 = Sunday, from Sunday in steps of N) is a
    step that leaves one value, Sunday, in cron's 0-7 range, the misreading README says is
    refused ('a step that leaves one value'). croniter reads 7 as 0 and the step from there:
    '0 0 * * 7/1' fires EVERY day, '7/2' Sun/Tue/Thu/Sat, '7/6' Sat and Sun. It is accepted
    and stored: a job meant for Sundays runs daily (or thrice a week). scheduler/schedules/
    cron_fields.py refuse_misread takes the step's end as the field's highest value, 6 for the
    days of the week, so with a start of 7 (low > high) the step is never checked; '6/1' is
    refused, '7/1' is not."""
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="cron"):
        check_cron(expr, "UTC")
    with pytest.raises(BadArgument, match="cron"):
        q.schedule("weekly", "t", cron=expr)
    res = CliRunner().invoke(
        main, ["schedules", "add", "weekly", "t", "--cron", expr, "-q", q.name, "--url", redis_url]
    )
    assert res.exit_code == 2, res.output
    assert dump_queue(client, q) == before


# -- cron slots across time-zone changes, against the wall clock ----------------------------------


def _field(spec: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        base, slash, step = part.partition("/")
        if base == "*":
            a, b = lo, hi
        elif "-" in base:
            a, b = (int(x) for x in base.split("-"))
        else:
            a = int(base)
            b = hi if slash else a
        out.update(range(a, b + 1, int(step) if step else 1))
    return out


def _wall_slots(expr: str, tz: str, lo_ms: int, hi_ms: int) -> list[int]:
    """Every matching local wall minute in [lo, hi] (padded), each at its instant with fold=0:
    a time in a gap shifted forward by it, a repeated one at its first pass (README), equal
    instants once. Minute, hour, day-of-month and weekday fields (no names, no L/W/#)."""
    zone = ZoneInfo(tz)
    m, h, dom, _mon, dow = expr.split()
    mins, hours, days = _field(m, 0, 59), _field(h, 0, 23), _field(dom, 1, 31)
    wdays = {d % 7 for d in _field(dow, 0, 7)}
    t = datetime.fromtimestamp(lo_ms / 1000, zone).replace(tzinfo=None, second=0, microsecond=0)
    t -= timedelta(hours=30)
    end = datetime.fromtimestamp(hi_ms / 1000, zone).replace(tzinfo=None) + timedelta(hours=30)
    out: set[int] = set()
    while t <= end:
        if t.minute in mins and t.hour in hours:
            day_ok = t.day in days if dow == "*" else (t.isoweekday() % 7) in wdays
            if dom != "*" and dow != "*":
                day_ok = t.day in days or (t.isoweekday() % 7) in wdays
            if day_ok:
                out.add(int(t.replace(tzinfo=zone, fold=0).timestamp() * 1000))
        t += timedelta(minutes=1)
    return sorted(out)


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Pacific/Apia", (2011, 12, 30)),  # a whole day skipped (UTC-10 -> UTC+14)
        ("Africa/Casablanca", (2024, 3, 10)),  # Ramadan: the clock goes back an hour
        ("Africa/Casablanca", (2024, 4, 14)),  # and forward again
        ("America/Santiago", (2024, 9, 8)),  # spring forward at midnight
        ("America/Havana", (2024, 11, 3)),  # fall back at 01:00
        ("Europe/Moscow", (2014, 10, 26)),  # a permanent change of offset
    ],
)
def test_cron_slots_around_unusual_zone_changes_match_the_wall_clock(
    tz: str, day: tuple[int, int, int]
) -> None:
    """Held: the slots after / up to a time near a skipped day, a negative DST, a midnight
    change and a permanent offset change are the wall clock's, as README describes them."""
    zone = ZoneInfo(tz)
    noon = int(datetime(*day, 12, tzinfo=zone).timestamp() * 1000)
    for expr in ("0 0 * * *", "30 23 * * *", "0 * * * *", "*/20 0-3 * * *", "0 9 * * 5"):
        ref = _wall_slots(expr, tz, noon - 16 * 86_400_000, noon + 16 * 86_400_000)
        for hours in range(-36, 37, 5):
            at = noon + hours * 3_600_000 + 7
            assert cron_slots_after(expr, tz, at, 2) == [s for s in ref if s > at][:2], (expr, at)
            assert cron_slots_upto(expr, tz, at, 2) == [s for s in ref if s <= at][-2:], (expr, at)


# -- a random-sequence explorer: flow control, cancels, start windows ---------------------------


def _never_claimed(client: redis.Redis, q: Queue, name: str, requeued: set[str]) -> list[str]:
    """Occurrences of `name` waiting (due or set aside by flow control) that no claim took,
    but those an operator requeued from the dead letters (a rerun asked for, not pending)."""
    out: list[str] = []
    for key in (q.keys.due, q.keys.flow_held):
        for jid in map(str, client.zrange(key, 0, -1)):
            if jid.startswith(f"schedule:{name}:"):
                state, fence = client.hmget(q.keys.job(jid), "state", "fence")
                if state == "due" and fence is None and jid not in requeued:
                    out.append(jid)
    return out


class _Explorer:
    """Random steps on two schedules (interval or cron, jitter, misfire, a concurrency key of
    limit 1, a rate limit, a start window, 1-3 attempts): clock moves and outages, claims,
    complete / fail / crash (the lease lapses) / release, cancelling the pending run, pause,
    resume, redefinition, remove and define again, run now, dead letters requeued or purged.
    Checked after each step: an active schedule has exactly one never-claimed run and it is
    its `pending` (none while paused or removed, none while it waits for a refill; a requeued
    dead letter aside); no slot is claimed for its first attempt twice (a release or a requeue
    aside); no run is claimed before its run_at_ms. At the end (all resumed), each active
    schedule keeps placing runs."""

    def __init__(self, q: Queue, clock: Clock, client: redis.Redis, seed: int) -> None:
        self.q, self.clock, self.client = q, clock, client
        self.rng = random.Random(seed)
        self.now = BASE + 1
        clock.set_ms(self.now)
        self.kinds: list[dict[str, Any]] = [
            {"every_ms": self.rng.choice([MIN_MS, 30_000])}
            if self.rng.random() < 0.7
            else {"cron": "* * * * *"}
            for _ in range(2)
        ]
        self.names = ["a", "b"]
        self.state = dict.fromkeys(self.names, "active")
        self.leases: dict[str, str] = {}
        self.first: Counter[str] = Counter()
        self.requeued: set[str] = set()
        self.log: list[str] = []
        for i, n in enumerate(self.names):
            q.schedule(n, "t", **self.variant(i))

    def variant(self, i: int) -> dict[str, Any]:
        rng = self.rng
        kw = dict(self.kinds[i])
        kw["misfire"] = rng.choice(["skip", "run_once", "catch_up:2"])
        if rng.random() < 0.5:
            kw["jitter_ms"] = rng.choice([0, 5_000, 20_000])
        if rng.random() < 0.5:
            kw.update(concurrency_key=f"k{i}", concurrency_limit=1)
        if rng.random() < 0.3:
            kw["start_within_ms"] = rng.choice([1_000, 20_000])
        if rng.random() < 0.2:
            kw["rate_limit"] = "1/1m"
        kw["max_attempts"] = rng.choice([1, 2, 3])
        kw["backoff"] = Backoff(base_ms=1_000, factor=1, cap_ms=1_000, jitter=0)
        return kw

    def fail(self, why: str) -> None:
        pytest.fail(why + "\n" + "\n".join(self.log[-30:]))

    def check(self) -> None:
        for n in self.names:
            h = self.client.hgetall(self.q.keys.schedule(n))
            never = _never_claimed(self.client, self.q, n, self.requeued)
            if self.state[n] == "active" and h.get("starved") != "1":
                if never != [h.get("pending")]:
                    self.fail(f"{n}: pending {h.get('pending')!r}, never claimed {never}")
            elif never:
                self.fail(f"{n} ({self.state[n]}): never-claimed runs {never}")

    def claim(self) -> str:
        batch = self.q.claim(
            "w", limit=self.rng.randint(1, 4), lease_ms=self.rng.choice([10_000, 90_000])
        )
        for j in batch.jobs:
            if j.id.startswith("schedule:") and j.attempts == 1:
                self.first[j.id] += 1
                if self.first[j.id] > 1:
                    self.fail(f"{j.id} claimed for its first attempt twice")
            run_at = str(self.client.hget(self.q.keys.job(j.id), "run_at_ms") or "")
            if run_at and int(run_at) > self.now:
                self.fail(f"{j.id} claimed at {self.now}, before its run_at {run_at}")
            self.leases[j.id] = j.token
        return str([j.id for j in batch.jobs])

    def settle(self) -> str:
        if not self.leases:
            return ""
        jid = self.rng.choice(sorted(self.leases))
        token = self.leases.pop(jid)
        how = self.rng.choice(["complete", "fail", "crash"])
        try:
            if how == "complete":
                self.q.complete(jid, token)
            elif how == "fail":
                self.q.fail(jid, token, ("E", "boom", ""))
        except SchedulerError as exc:  # its lease lapsed and another claim holds it, ...
            how += " refused " + type(exc).__name__
        return f"{how} {jid}"

    def step(self) -> str:
        rng, q = self.rng, self.q
        op = rng.choices(
            ["tick", "claim", "settle", "cancel", "pause", "resume", "redef", "remove", "now",
             "outage"],
            [6, 6, 6, 1, 1, 1, 1, 1, 1, 1],
        )[0]  # fmt: skip
        n = rng.choice(self.names)
        if op == "tick":
            self.now += rng.choice([1_000, 5_000, 20_000, 30_000, 60_000])
        elif op == "outage":
            self.now += rng.choice([3, 10, 70]) * MIN_MS
        self.clock.set_ms(self.now)
        if op == "claim":
            return f"claim {self.claim()}"
        if op == "settle":
            return f"settle {self.settle()}"
        if op == "cancel":
            pending = str(self.client.hget(q.keys.schedule(n), "pending") or "")
            return f"cancel {pending} {q.cancel(pending) if pending else ''}"
        if op == "pause":
            if self.state[n] == "active":
                self.state[n] = "paused"
            return f"pause {n} {q.pause_schedule(n)}"
        if op == "resume":
            if self.state[n] == "paused":
                self.state[n] = "active"
            return f"resume {n} {q.resume_schedule(n)}"
        if op == "redef":
            if self.state[n] == "removed":
                self.state[n] = "active"
            return f"redefine {n} {q.schedule(n, 't', **self.variant(self.names.index(n)))}"
        if op == "remove":
            self.state[n] = "removed"
            return f"remove {n} {q.remove_schedule(n)}"
        if op == "now" and self.state[n] != "removed":
            return f"run now {n} {q.run_schedule_now(n)}"
        return self.operator(op)

    def operator(self, op: str) -> str:
        """Now and then a dead letter requeued or purged, or a lease given back unstarted."""
        rng, q = self.rng, self.q
        if rng.random() >= 0.15:
            return op
        what = rng.choice(["requeue", "purge", "release"])
        if what == "release" and self.leases:
            jid = rng.choice(sorted(self.leases))
            self.first[jid] -= 1  # given back unstarted: its next claim is its first attempt
            return f"release {jid} {q.release([(jid, self.leases.pop(jid))])}"
        dead = q.dead_ids()
        if what == "release" or not dead:
            return op
        jid = rng.choice(dead)
        if what == "purge":
            return f"purge {jid} {q.purge_dead([jid])}"
        self.requeued.add(jid)
        self.first[jid] = -1_000  # run again on purpose: its attempts start over
        return f"requeue {jid} {q.requeue_dead([jid])}"

    def run(self, steps: int) -> None:
        for i in range(steps):
            self.log.append(f"{i} t={(self.now - BASE) // 1000}s {self.step()}")
            self.check()
        for n in self.names:
            if self.state[n] == "paused":
                self.q.resume_schedule(n)
                self.state[n] = "active"
        seen: dict[str, set[str]] = {n: set() for n in self.names}
        for _ in range(8):
            for n in self.names:
                seen[n].add(str(self.client.hget(self.q.keys.schedule(n), "pending") or ""))
            self.now += 3 * MIN_MS + 7_000
            self.clock.set_ms(self.now)
            for _ in range(10):
                batch = self.q.claim("w", limit=20, lease_ms=10_000)
                for j in batch.jobs:
                    self.q.complete(j.id, j.token)
                if not batch.jobs:
                    break
        for n in self.names:
            if self.state[n] == "active" and len(seen[n] - {""}) < 4:
                self.fail(f"{n} stopped placing runs: {sorted(seen[n])}")


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_keep_one_pending_run_never_early_never_twice(
    tq: tuple[Queue, Clock], client: redis.Redis, seed: int
) -> None:
    """Held (about 400 seeds of 150 steps during the review, these 6 kept): see _Explorer."""
    q, clock = tq
    _Explorer(q, clock, client, seed).run(150)


# -- next runs shown ---------------------------------------------------------------------------


def test_the_dashboards_next_runs_of_a_kept_run_are_the_runs_placed_after_it(
    tq: tuple[Queue, Clock],
) -> None:
    """Defect: after `every_ms` changes while the pending run is due and waiting (a deploy:
    README, the run is kept and the new interval applies from the slot after it), the
    dashboard's Schedules page lists the next runs at the kept slot + k * the new every_ms,
    while lib/rearm.lua places them epoch-aligned (the first multiple of every_ms after the
    slot). Here the page says the run after the kept one is at +7 min when it comes at +2 min:
    an operator planning around the page (a maintenance window, a manual run) is misled.
    scheduler/dashboard/schedule_view.py next_runs computes `slot + i * every_ms + offset`,
    which holds only for a slot on the interval's own grid; the fix: the first run after it
    at (slot // every_ms + 1) * every_ms + offset, then every_ms apart."""
    q, clock = tq
    slot = BASE + MIN_MS  # on the 1-minute grid, not on the 7-minute one
    clock.set_ms(BASE + 1)
    q.schedule("sync", "t", every_ms=MIN_MS)
    clock.set_ms(slot + 1_000)  # due, no worker took it yet
    assert q.schedule("sync", "t", every_ms=7 * MIN_MS) == "updated"
    shown = next_runs(q.get_schedule("sync"), slot + 1_000)
    assert shown[0] == slot  # the kept run, at its own time
    (job,) = q.claim("w", limit=10).jobs
    assert job.id == f"schedule:sync:{slot}"
    placed = q.get_schedule("sync").next_run_ms
    assert placed == (slot // (7 * MIN_MS) + 1) * 7 * MIN_MS  # epoch-aligned, as documented
    assert shown[1] == placed, (shown, placed)


# -- a partitioned queue --------------------------------------------------------------------------


def test_a_partitioned_schedules_held_run_cancelled_through_the_logical_queue_arms_the_next(
    client: redis.Redis, make_pq: MakePq
) -> None:
    """Held: on a partitioned queue, a cron schedule's pending run held by its concurrency key
    is listed at its own time (from flow:held), a cancel through the logical queue finds its
    partition, arms the slot after it there, and the schedule keeps exactly one pending run."""
    pq = make_pq(_clock="test")

    def at(ms: int) -> None:
        for part in pq.parts:
            client.set(part.keys.test_clock, ms)

    at(BASE + 1)
    opts: dict[str, Any] = {"concurrency_key": "rep", "concurrency_limit": 1}
    assert pq.schedule("rep", "t", cron="* * * * *", **opts) == "created"
    part = pq.parts[pq.layout.partition_of_schedule("rep")]
    at(BASE + MIN_MS + 1)
    (first,) = pq.claim("w", limit=10, lease_ms=30 * MIN_MS).jobs
    assert first.id == f"schedule:rep:{BASE + MIN_MS}"
    at(BASE + 2 * MIN_MS + 1)
    assert pq.claim("w", limit=10).jobs == []  # the next run is held by the key
    held = pq.get_schedule("rep").pending
    assert held == f"schedule:rep:{BASE + 2 * MIN_MS}"
    assert client.zscore(part.keys.flow_held, held) is not None
    assert [s.next_run_ms for s in pq.list_schedules()] == [BASE + 2 * MIN_MS]
    assert pq.cancel(held) == "held"
    after = pq.get_schedule("rep").pending
    assert after == f"schedule:rep:{BASE + 3 * MIN_MS}"
    assert _never_claimed(client, part, "rep", set()) == [after]
    pq.complete(first.id, first.token)
    at(BASE + 3 * MIN_MS + 1)
    assert [j.id for j in pq.claim("w", limit=10).jobs] == [after]
