"""Property-based test of recurring schedules (README "Recurring schedules",
docs/guide/schedules.md): seeded random programs of upserts (the same definition again, or a
changed one), pause, resume, remove, run_schedule_now, clock moves (small ones, and outages of
many periods, some longer than a cron buffer), claims of random limits, completes, retryable
fails, heartbeats, releases, worker crashes and finished records expiring, run against the
real scripts with the test clock. A reference model keeps each schedule (definition, pending
slot, the last slot that left due) and each job (due at, lease, attempts); slots are computed
here, independently of scheduler/schedules (every_ms: the multiples; cron: every matching local
wall minute, a time that does not exist shifted forward by the gap, a repeated one at its first
pass).

Checked after every step:
- the queue's due / leased / dead sets are exactly the model's (ids and times);
- never early: a claimed job was due in the model and its run_at (slot + offset, retry or lapse
  time) is at or before the claim's now;
- an active schedule has exactly one never-claimed occurrence, its `pending` (and next_run_ms is
  when it is due); a paused or removed one none (run-now jobs aside);
- an occurrence id is per slot: a slot never runs as two jobs, retries keep the id, and each
  schedule's slots are first claimed in increasing order (across redefinitions and removal);
- misfire: claiming a late occurrence runs or drops it, and places the next, as the policy says
  (skip: none of the late ones; run_once: the latest; catch_up:N: the latest N, in order);
- the same definition again writes nothing; a changed one replaces the pending run unless that
  run is due and waiting (kept, the new definition from the slot after it); resume starts at the
  first slot not yet due; no placing goes back to a slot that left due, also after a removal;
- run_schedule_now adds one job due now with the schedule's task, payload and max_attempts, and
  leaves the schedule's keys byte for byte (also while paused); its claim arms nothing;
- at the end (everything resumed, drained with the clock moved on): every claimed job ended
  exactly once (done, or dead with its attempts used up), and the doctor finds nothing (also
  every 40 steps).

A due run kept across a change of jitter stays due at its old offset: `next_run_ms` says that
time, and a second redefinition judges it by that time, so it is kept again while it waits.

Found and fixed with it: a kept late cron run saw no missed times (tests/
test_schedule_redefine_due.py); a run kept across a change of jitter that a second redefinition
judged by its slot plus the new offset, withdrew, and placed again later with the new payload
(tests/test_schedule_redefine_jitter.py); the latest missed times of an outage ending in the
second pass of a repeated hour (tests/test_recurring.py).

SCHED_MODEL_SEEDS raises the number of seeds by hand (default 150, in chunks for xdist)."""

from __future__ import annotations

import bisect
import dataclasses
import os
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from scheduler import Backoff, Queue, ScheduleNotFound
from scheduler.admin.doctor import check_queue
from scheduler.schedules.recurring import stable_offset_ms
from tests.conftest import Clock, delete_queue

SEEDS = int(os.environ.get("SCHED_MODEL_SEEDS", "150"))
CHUNKS = 10
MIN_MS = 60_000


def utc(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


# Starts ahead of the real clock (the doctor reads TIME: no lease looks long lapsed to it), some
# just before a daylight-saving change: Berlin's spring forward and fall back, New York's fall
# back, Lord Howe's half-hour one.
STARTS = (
    (utc(2030, 6, 1, 0, 0), "UTC"),
    (utc(2030, 3, 31, 0, 30), "Europe/Berlin"),
    (utc(2030, 10, 27, 0, 30), "Europe/Berlin"),
    (utc(2030, 11, 3, 5, 30), "America/New_York"),
    (utc(2030, 4, 6, 14, 30), "Australia/Lord_Howe"),
)
CRONS = ("* * * * *", "*/2 * * * *", "*/5 * * * *", "7,37 * * * *")
EVERY_MS = (3_000, 5_000, 20_000, 60_000, 150_000)
MISFIRES = {"skip": 0, "run_once": 1, "catch_up:2": 2, "catch_up:4": 4}


# -- slots, computed here ------------------------------------------------------------------------
def _match(spec: str, value: int) -> bool:
    for part in spec.split(","):
        if part == "*" or (part.startswith("*/") and value % int(part[2:]) == 0):
            return True
        if part.isdigit() and int(part) == value:
            return True
    return False


class CronTimes:
    """Every local wall minute whose minute and hour fields match (the others are `*`), as an
    instant: fold=0 shifts a wall time that does not exist forward by the gap and takes a
    repeated one at its first pass; an instant not after the last one is dropped."""

    def __init__(self, expr: str, tz: str, from_ms: int) -> None:
        self.minute, self.hour = expr.split()[:2]
        self.zone = ZoneInfo(tz)
        start = datetime.fromtimestamp(from_ms // 1000 - 3600, self.zone)
        self.wall = start.replace(tzinfo=None, second=0, microsecond=0)
        self.times: list[int] = []
        self.last = -1

    def _upto(self, ms: int) -> None:
        while self.last <= ms:
            for _ in range(1440):
                self.wall += timedelta(minutes=1)
                if _match(self.minute, self.wall.minute) and _match(self.hour, self.wall.hour):
                    t = int(self.wall.replace(tzinfo=self.zone, fold=0).timestamp() * 1000)
                    if t > self.last:
                        self.times.append(t)
                        self.last = t

    def after(self, t: int) -> int:
        self._upto(t)
        return self.times[bisect.bisect_right(self.times, t)]

    def late(self, after: int, upto: int, n: int) -> tuple[int, list[int]]:
        """How many slots lie in (after, upto], and the latest n of them."""
        if upto <= after:
            return 0, []
        self._upto(upto)
        lo, hi = bisect.bisect_right(self.times, after), bisect.bisect_right(self.times, upto)
        return hi - lo, self.times[max(lo, hi - n) : hi] if n else []


class EveryTimes:
    def __init__(self, every_ms: int) -> None:
        self.every_ms = every_ms

    def after(self, t: int) -> int:
        return (t // self.every_ms + 1) * self.every_ms

    def late(self, after: int, upto: int, n: int) -> tuple[int, list[int]]:
        if upto <= after:
            return 0, []
        e = self.every_ms
        m = upto // e - after // e
        return m, [(upto // e - i) * e for i in reversed(range(min(n, m)))]


# -- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Def:
    kind: str  # 'every' | 'cron'
    every_ms: int
    cron: str
    tz: str
    jitter_ms: int
    misfire: str
    max_attempts: int
    base_ms: int  # the backoff: base_ms * 2^(attempt-1), capped at 20 s, no jitter
    payload: int

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"cron": self.cron, "tz": self.tz} if self.kind == "cron" else {
            "every_ms": self.every_ms}  # fmt: skip
        return kw | {
            "jitter_ms": self.jitter_ms,
            "misfire": self.misfire,
            "max_attempts": self.max_attempts,
            "backoff": Backoff(base_ms=self.base_ms, factor=2.0, cap_ms=20_000, jitter=0.0),
        }

    def retry_ms(self, attempts: int) -> int:
        return int(min(20_000, self.base_ms * 2.0 ** (attempts - 1)))


@dataclass
class MJob:
    id: str
    name: str  # its schedule
    run_at: int
    payload: dict[str, Any]
    defn: Def  # the definition it was written with (max_attempts, backoff)
    slot: int | None  # None: a run-now job
    # due | leased | done | dead | cancelled (misfire) | withdrawn | expired (its record)
    state: str = "due"
    asked: int = -1  # the run_at claim reports: placed or retried at (a lapse or release keeps it)
    attempts: int = 0
    lapses: int = 0
    token: str = ""
    until: int = 0
    abandoned: bool = False  # its worker crashed: nobody settles this lease
    completed: int = 0
    claims: int = 0


@dataclass
class MSched:
    name: str
    variants: list[Def]
    slots: dict[Def, CronTimes | EveryTimes] = field(default_factory=dict)
    defn: Def | None = None
    state: str = "removed"  # active | paused | removed
    pending: str = ""  # the pending occurrence's id ('' unless active)
    ran: int = 0  # the last slot that left due (kept across a removal)
    first_claimed: int = -1  # the last slot claimed as a new job

    def times(self, d: Def, start_ms: int) -> CronTimes | EveryTimes:
        if d not in self.slots:
            self.slots[d] = (
                CronTimes(d.cron, d.tz, start_ms) if d.kind == "cron" else EveryTimes(d.every_ms)
            )
        return self.slots[d]

    @property
    def offset(self) -> int:
        assert self.defn is not None
        return stable_offset_ms(self.name, self.defn.jitter_ms)


FREED = ("withdrawn", "expired")  # states whose record is gone


def occ_id(name: str, slot: int) -> str:
    return f"schedule:{name}:{slot}"


class Violation(AssertionError):
    pass


class Run:
    def __init__(self, client: redis.Redis, seed: int, seen: Counter[str]) -> None:
        self.client, self.seed, self.seen = client, seed, seen
        self.rng = rng = random.Random(seed)
        self.q = Queue(client, "sm-" + uuid.uuid4().hex[:10], _clock="test")
        self.clock = Clock(client, self.q)
        start, zone = rng.choice(STARTS)
        self.start = self.now = start + rng.randrange(0, 3 * MIN_MS)
        self.clock.set_ms(self.now)
        self.jobs: dict[str, MJob] = {}
        self.log: list[str] = []
        self.n = 0
        names = rng.sample(["a", "b", "c", "d", "e"], rng.randint(2, 4))
        self.sched = {n: MSched(n, self.variants(zone)) for n in names}

    def variants(self, zone: str) -> list[Def]:
        """Three definitions of one schedule: one, the same times with another jitter and
        payload (a deploy that changes them), and another."""
        first = self.random_def(zone)
        gap = first.every_ms or MIN_MS
        jitter = self.rng.choice([j for j in (0, gap // 4, gap // 2) if j != first.jitter_ms])
        again = dataclasses.replace(first, jitter_ms=jitter, payload=first.payload + 1)
        return [first, again, self.random_def(zone)]

    def random_def(self, zone: str) -> Def:
        rng = self.rng
        if rng.random() < 0.5:
            every, cron, tz = rng.choice(EVERY_MS), "", ""
            jitter = rng.choice([0, 0, every // 4, every // 2])
        else:
            every, cron = 0, rng.choice(CRONS)
            tz = rng.choice([zone, zone, "UTC", "Europe/Berlin"])
            jitter = rng.choice([0, 0, 20_000, 50_000])
        return Def("cron" if cron else "every", every, cron, tz, jitter,
                   rng.choice(list(MISFIRES)), rng.randint(1, 3), rng.choice([500, 4_000]),
                   rng.randrange(3))  # fmt: skip

    def fail_(self, msg: str) -> None:
        tail = "\n  ".join(self.log[-30:])
        raise Violation(f"seed {self.seed}: {msg}\n last steps:\n  {tail}")

    def expect(self, ok: bool, msg: str) -> None:
        if not ok:
            self.fail_(msg)

    def tick(self, ms: int) -> None:
        self.now += ms
        self.clock.set_ms(self.now)

    # -- placing occurrences -----------------------------------------------------------------
    def place(self, s: MSched, slot: int) -> None:
        """Make `slot` the pending one (or, while a record of its id is kept, the first free
        slot after it: never a slot twice)."""
        assert s.defn is not None
        times = s.times(s.defn, self.start)
        while (j := self.jobs.get(occ_id(s.name, slot))) and j.state not in FREED:
            self.seen["place_skipped_taken"] += 1
            slot = times.after(slot)
        jid = occ_id(s.name, slot)
        self.jobs[jid] = MJob(jid, s.name, slot + s.offset, {"v": s.defn.payload}, s.defn, slot)
        s.pending = jid

    def place_first(self, s: MSched, withdrawn: int | None = None) -> None:
        """Create, redefine, resume: the first slot not yet due, and after `ran`; on a
        redefinition, the slot of the run it withdrew before its time when the new offset made
        it overdue and it is one of the new definition's (it runs now, never skipped)."""
        assert s.defn is not None
        after = max(self.now - s.offset, s.ran)
        times = s.times(s.defn, self.start)
        if (
            withdrawn is not None
            and s.ran < withdrawn <= after
            and times.after(withdrawn - 1) == withdrawn
        ):
            self.seen["withdrawn_slot_runs"] += 1
            self.place(s, withdrawn)
            return
        if s.times(s.defn, self.start).after(self.now - s.offset) <= s.ran:
            # A larger jitter: the slot that ran would be next; its record may have expired.
            ran_job = self.jobs.get(occ_id(s.name, s.ran))
            self.seen["after_last_ran_expired" if ran_job and ran_job.state == "expired"
                      else "after_last_ran"] += 1  # fmt: skip
        self.place(s, s.times(s.defn, self.start).after(after))

    def withdraw(self, s: MSched) -> None:
        if s.pending:
            self.jobs[s.pending].state = "withdrawn"
            s.pending = ""

    def consume(self, s: MSched, claimed: bool) -> None:
        """The pending occurrence left due at claim (`claimed`) or was dropped by the misfire
        policy: check which the policy says, and place the next one."""
        assert s.defn is not None
        j = self.jobs[s.pending]
        cur, offset, times = j.slot, s.offset, s.times(s.defn, self.start)
        assert cur is not None
        n = MISFIRES[s.defn.misfire]
        m, latest = times.late(cur, self.now - offset, n)
        if m == 0:  # on time: nothing was missed after it
            run, nxt = True, times.after(cur)
        else:  # late, with m more missed after it: the latest n of those m + 1 run
            keep = ([cur, *latest])[-n:] if n else []
            run = cur in keep
            rest = [x for x in keep if x != cur]
            nxt = rest[0] if rest else times.after(self.now - offset)
        self.seen[f"late_{s.defn.misfire}" if m else "on_time"] += 1
        if run != claimed:
            self.fail_(f"{j.id} (m={m}, {s.defn.misfire}) {'claimed' if claimed else 'dropped'}"
                       f", the policy {'runs' if run else 'drops'} it")  # fmt: skip
        if not run:
            j.state = "cancelled"
            self.seen["misfire_drop"] += 1
        s.ran = max(s.ran, cur)
        self.place(s, nxt)

    # -- steps -------------------------------------------------------------------------------
    def op_upsert(self) -> None:
        s = self.sched[self.rng.choice(list(self.sched))]
        same = s.defn is not None and self.rng.random() < 0.4
        d = s.defn if same and s.defn else self.rng.choice(s.variants)
        before = self.client.hgetall(self.q.keys.schedule(s.name))
        out = self.q.schedule(s.name, "t", {"v": d.payload}, **d.kwargs())
        self.log.append(f"{self.now} upsert {s.name} {d} -> {out}")
        if s.state == "removed":
            self.expect(out == "created", f"create said {out}")
            s.state, s.defn = "active", d
            self.place_first(s)
        elif d == s.defn:
            self.expect(out == "unchanged", f"the same definition said {out}")
            after = self.client.hgetall(self.q.keys.schedule(s.name))
            self.expect(after == before, "the same definition again wrote to the schedule")
        else:
            self.expect(out == "updated", f"a changed definition said {out}")
            pend = self.jobs.get(s.pending)
            keep = pend is not None and pend.run_at <= self.now
            if keep and pend and pend.slot is not None and pend.slot + s.offset > self.now:
                # Kept once with a larger jitter: due by its own time, kept again.
                self.seen["kept_again_own_time"] += 1
            # A run withdrawn before its time: its slot may be overdue under the new offset.
            withdrawn = pend.slot if pend is not None and not keep else None
            if not keep:
                self.withdraw(s)
            s.defn = d
            if keep:
                self.seen["redefine_keeps_due"] += 1
            elif s.state == "active":
                self.place_first(s, withdrawn)

    def op_pause(self) -> None:
        s = self.sched[self.rng.choice(list(self.sched))]
        out = self.q.pause_schedule(s.name)
        self.log.append(f"{self.now} pause {s.name} -> {out}")
        want = {"active": "paused", "paused": "already", "removed": "missing"}[s.state]
        self.expect(out == want, f"pause of a {s.state} schedule said {out}")
        if s.state == "active":
            self.withdraw(s)
            s.state = "paused"

    def op_resume(self) -> None:
        s = self.sched[self.rng.choice(list(self.sched))]
        out = self.q.resume_schedule(s.name)
        self.log.append(f"{self.now} resume {s.name} -> {out}")
        want = {"active": "active", "paused": "resumed", "removed": "missing"}[s.state]
        self.expect(out == want, f"resume of a {s.state} schedule said {out}")
        if s.state == "paused":
            s.state = "active"
            self.place_first(s)

    def op_remove(self) -> None:
        s = self.sched[self.rng.choice(list(self.sched))]
        out = self.q.remove_schedule(s.name)
        self.log.append(f"{self.now} remove {s.name} -> {out}")
        want = "missing" if s.state == "removed" else "removed"
        self.expect(out == want, f"remove of a {s.state} schedule said {out}")
        self.withdraw(s)
        s.state = "removed"

    def op_run_now(self) -> None:
        s = self.sched[self.rng.choice(list(self.sched))]
        keys = (self.q.keys.schedule(s.name), self.q.keys.schedule_slots(s.name))
        before = [self.client.hgetall(keys[0]), self.client.zrange(keys[1], 0, -1)]
        if s.state == "removed":
            with pytest.raises(ScheduleNotFound):
                self.q.run_schedule_now(s.name)
            self.log.append(f"{self.now} run_now {s.name} -> missing")
            return
        jid = self.q.run_schedule_now(s.name)
        self.log.append(f"{self.now} run_now {s.name} -> {jid}")
        assert s.defn is not None
        self.expect(not jid.startswith("schedule:") and jid not in self.jobs, f"run now id {jid}")
        self.jobs[jid] = MJob(jid, s.name, self.now, {"v": s.defn.payload}, s.defn, None)
        after = [self.client.hgetall(keys[0]), self.client.zrange(keys[1], 0, -1)]
        self.expect(after == before, f"run_schedule_now changed schedule {s.name}")
        self.seen[f"run_now_{s.state}"] += 1

    def op_tick(self) -> None:
        self.tick(self.rng.choice([1, 300, 1_000, 3_000, 10_000, 30_000, 60_000]))
        self.log.append(f"{self.now} tick")

    def op_outage(self) -> None:
        """Nothing claims for several periods of one schedule; sometimes for longer than a
        cron buffer (64 slots: an hour of a minutely cron)."""
        rng = self.rng
        d = self.sched[rng.choice(list(self.sched))].variants[0]
        period = d.every_ms or 5 * MIN_MS
        ms = rng.randint(2, 12) * period + rng.randrange(period)
        if rng.random() < 0.25:
            ms = rng.randint(70, 200) * MIN_MS
        self.tick(ms)
        self.log.append(f"{self.now} outage {ms}")
        self.seen["outage"] += 1

    def op_expire(self) -> None:
        """The record of a schedule's newest finished occurrence expires (its TTL runs in real
        time): its slot is still never placed again (README: `ran_ms`, also after that run's
        record expired), e.g. by a redefinition with a larger jitter."""
        name = self.rng.choice(list(self.sched))
        ended = [j for j in self.jobs.values() if j.name == name and j.slot is not None
                 and j.state in ("done", "cancelled")]  # fmt: skip
        if ended:
            j = max(ended, key=lambda e: e.slot or 0)
            self.client.delete(self.q.keys.job(j.id), self.q.keys.spec(j.id))
            j.state = "expired"
            self.log.append(f"{self.now} expire {j.id}")
            self.seen["expired"] += 1

    def live(self) -> list[MJob]:
        return [j for j in self.jobs.values()
                if j.state == "leased" and j.until > self.now and not j.abandoned]  # fmt: skip

    def op_claim(self) -> None:
        self.claim(self.rng.randint(1, 6), self.rng.choice([5_000, 30_000]))

    def claim(self, limit: int, lease_ms: int) -> list[MJob]:
        now, q = self.now, self.q
        for j in self.jobs.values():  # claim reaps lapsed leases first
            if j.state == "leased" and j.until <= now:
                j.lapses += 1
                self.seen["lapsed"] += 1
                if j.attempts >= j.defn.max_attempts:
                    j.state = "dead"
                else:
                    j.state, j.run_at = "due", j.until
        # Before: each active schedule's pending occurrence, and whether its cron buffer
        # reaches past now (a claim may leave a late run due until the buffer is refilled).
        active = [s for s in self.sched.values() if s.state == "active"]
        pipe = self.client.pipeline(transaction=False)
        for s in active:
            pipe.zrange(q.keys.schedule_slots(s.name), f"({now - s.offset}", "+inf",
                        byscore=True, offset=0, num=1)  # fmt: skip
        short = {s.name: not r for s, r in zip(active, pipe.execute(), strict=True)}
        start_pending = {s.name: s.pending for s in active}
        self.n += 1
        batch = q.claim(f"w{self.n}", limit=limit, lease_ms=lease_ms)
        self.log.append(f"{now} claim {limit} -> {[j.id for j in batch.jobs]}")
        self.expect(batch.now_ms == now and len(batch.jobs) <= limit, "claim reply")
        claimed = {j.id for j in batch.jobs}
        # A run leased on its last attempt after a lapse runs alone: its call's only job.
        alone = [j.id for j in batch.jobs if j.id == batch.suspect and j.attempts >= j.max_attempts]
        self.expect(not alone or len(batch.jobs) == 1, f"{alone} leased beside other runs")
        # The schedules: each pending occurrence claimed or dropped is followed by its next
        # (the same claim may take that one too).
        for s in active:
            while True:
                jid = s.pending
                if jid in claimed:
                    self.consume(s, True)
                    continue
                f = self.client.hmget(q.keys.job(jid), "state", "skipped")
                if f == ["cancelled", "misfire"]:
                    self.consume(s, False)
                    continue
                break
            p = self.jobs[start_pending[s.name]]
            if s.pending == p.id and p.run_at <= now and len(batch.jobs) < limit and not alone:
                # Due and left in a batch that was not full: only a late cron run whose buffer
                # did not reach past now waits (the refill that claim just made).
                assert s.defn is not None
                m, _ = s.times(s.defn, self.start).late(p.slot or 0, now - s.offset, 0)
                ok = s.defn.kind == "cron" and short[s.name] and m > 0
                self.expect(ok, f"{p.id} due since {p.run_at}, left by a claim not full")
                self.seen["cron_refill_wait"] += 1
        out = []
        for c in batch.jobs:
            found = self.jobs.get(c.id)
            if found is None or found.state != "due":
                self.fail_(f"{c.id} claimed, but it is {found and found.state}")
            assert found is not None
            j = found
            self.expect(j.run_at <= now, f"{c.id} claimed early: due {j.run_at}, now {now}")
            asked = j.run_at if j.asked < 0 else j.asked
            self.expect(c.run_at_ms == asked, f"{c.id} run_at {c.run_at_ms} != {asked}")
            self.expect(c.attempts == j.attempts + 1, f"{c.id} attempts {c.attempts}")
            self.expect((c.max_attempts, c.schedule, c.task) == (j.defn.max_attempts, j.name, "t"),
                        f"{c.id} max_attempts / schedule / task")  # fmt: skip
            self.expect(c.payload() == j.payload, f"{c.id} payload {c.payload()} != {j.payload}")
            if j.slot is not None and j.claims == 0:
                s = self.sched[j.name]
                self.expect(j.slot > s.first_claimed, f"{c.id} after slot {s.first_claimed}")
                s.first_claimed = j.slot
            j.state, j.token, j.until, j.attempts = "leased", c.token, now + lease_ms, c.attempts
            j.asked, j.claims = asked, j.claims + 1
            self.seen["claimed_run_now" if j.slot is None else "claimed"] += 1
            out.append(j)
        return out

    def pick_live(self) -> MJob | None:
        live = self.live()
        return self.rng.choice(live) if live else None

    def op_settle(self) -> None:
        j = self.pick_live()
        if j is None:
            return
        what = self.rng.choice(["complete", "complete", "fail", "crash", "release", "beat"])
        self.log.append(f"{self.now} {what} {j.id}")
        q = self.q
        if what == "complete":
            q.complete(j.id, j.token)
            j.state, j.completed = "done", j.completed + 1
        elif what == "fail":
            delay = self.rng.choice([None, 0, 2_000])
            out = q.fail(j.id, j.token, ("E", "boom", ""), delay_ms=delay)
            if j.attempts >= j.defn.max_attempts:
                self.expect(out.status == "dead", f"fail of {j.id} said {out}")
                j.state = "dead"
            else:
                wait = j.defn.retry_ms(j.attempts) if delay is None else delay
                self.expect(out.status == "retry" and out.run_at_ms == self.now + wait,
                            f"fail of {j.id} said {out}, wanted a retry in {wait}")  # fmt: skip
                j.state, j.run_at = "due", self.now + wait
                j.asked = j.run_at
        elif what == "crash":
            j.abandoned = True
        elif what == "release":
            self.expect(q.release([(j.id, j.token)]) == ["released"], "release")
            j.state, j.run_at, j.attempts = "due", self.now, j.attempts - 1
        else:
            _, statuses = q.heartbeat([(j.id, j.token)], lease_ms=30_000)
            self.expect(statuses[j.id] == "held", f"heartbeat {statuses}")
            j.until = self.now + 30_000
        j.abandoned = j.abandoned and j.state == "leased"
        self.seen[what] += 1

    # -- invariants --------------------------------------------------------------------------
    def check(self) -> None:
        q, c = self.q, self.client
        pipe = c.pipeline(transaction=False)
        pipe.zrange(q.keys.due, 0, -1, withscores=True)
        pipe.zrange(q.keys.leased, 0, -1, withscores=True)
        pipe.zrange(q.keys.dead, 0, -1)
        for name in self.sched:
            pipe.hgetall(q.keys.schedule(name))
        due_l, leased_l, dead_l, *hashes = pipe.execute()
        due = {k: int(v) for k, v in due_l}
        want = {j.id: j.run_at for j in self.jobs.values() if j.state == "due"}
        for jid, score in due.items():  # a suspect a claim left is re-scored to that claim
            j = self.jobs.get(jid)
            # claim.lua suspect_at: lapsed twice, or once before its last attempt
            last = j is not None and j.attempts + 1 >= j.defn.max_attempts
            suspect = j is not None and (j.lapses >= 2 or (j.lapses >= 1 and last))
            if j and suspect and j.state == "due" and j.run_at < score <= self.now:
                j.run_at = want[jid] = score
        if due != want:
            self.fail_(f"due {sorted(due.items())} != model {sorted(want.items())}")
        leased = {k: int(v) for k, v in leased_l}
        want = {j.id: j.until for j in self.jobs.values() if j.state == "leased"}
        self.expect(leased == want, f"leased {leased} != model {want}")
        dead = {j.id for j in self.jobs.values() if j.state == "dead"}
        self.expect(set(dead_l) == dead, f"dead {dead_l} != model {dead}")
        # Never-claimed occurrences, from the server alone: one per active schedule.
        ids = [jid for jid in due if jid.startswith("schedule:")]
        pipe = c.pipeline(transaction=False)
        for jid in ids:
            pipe.hget(q.keys.job(jid), "fence")
        fresh = Counter(jid.split(":")[1] for jid, f in zip(ids, pipe.execute(), strict=True)
                        if f is None)  # fmt: skip
        next_runs = {sch.name: sch.next_run_ms for sch in q.list_schedules()}
        for (name, s), h in zip(self.sched.items(), hashes, strict=True):
            self.expect(bool(h) == (s.state != "removed"), f"schedule {name} {s.state}: {h}")
            if not h:
                self.expect(fresh[name] == 0, f"removed {name} has a pending occurrence")
                continue
            self.expect((h["paused"] == "1") == (s.state == "paused"), f"{name} paused flag")
            self.expect(h["pending"] == s.pending, f"{name} pending {h['pending']} != {s.pending}")
            want_fresh = 1 if s.state == "active" else 0
            self.expect(fresh[name] == want_fresh, f"{name} ({s.state}): {fresh[name]} pending")
            self.expect(int(h["offset_ms"]) == s.offset, f"{name} offset")
            if s.pending:
                # next_run_ms is when the pending occurrence is due, also for a run kept
                # across a change of jitter (its old offset; see the docstring).
                pj = self.jobs[s.pending]
                self.expect(int(h["cursor_ms"]) == pj.slot, f"{name} cursor {h['cursor_ms']}")
                nxt = next_runs.get(name)
                self.expect(nxt == pj.run_at, f"{name} next run {nxt} != {pj.run_at}")

    def doctor(self) -> None:
        issues = check_queue(self.client, self.q.name)
        self.expect(not issues, "doctor: " + "; ".join(f"{i.code} {i.job_id}: {i.message}"
                                                       for i in issues))  # fmt: skip

    OPS = (
        ("upsert", 8), ("pause", 3), ("resume", 4), ("remove", 2), ("run_now", 3), ("tick", 12),
        ("outage", 2), ("claim", 14), ("settle", 16), ("expire", 4),
    )  # fmt: skip

    def program(self, steps: int) -> None:
        names, weights = zip(*self.OPS, strict=True)
        for name in self.sched:  # every schedule exists at first
            self.sched[name].defn = None
            self.op_upsert_named(name)
        self.check()
        for i in range(steps):
            getattr(self, "op_" + self.rng.choices(names, weights)[0])()
            self.check()
            if i % 40 == 39:
                self.doctor()

    def op_upsert_named(self, name: str) -> None:
        s = self.sched[name]
        d = s.variants[0]
        self.log.append(f"{self.now} upsert {name} {d}")
        self.expect(self.q.schedule(name, "t", {"v": d.payload}, **d.kwargs()) == "created", "")
        s.state, s.defn = "active", d
        self.place_first(s)

    def drain(self) -> None:
        for s in self.sched.values():
            if s.state == "paused":
                self.expect(self.q.resume_schedule(s.name) == "resumed", "resume")
                s.state = "active"
                self.place_first(s)
        for j in self.live():
            self.q.complete(j.id, j.token)
            j.state, j.completed = "done", j.completed + 1
        self.check()
        for _ in range(100):
            self.tick(7_000)
            while batch := self.claim(50, 30_000):
                for j in batch:
                    self.q.complete(j.id, j.token)
                    j.state, j.completed = "done", j.completed + 1
            self.check()
            pending = {s.pending for s in self.sched.values()}
            if all(j.state not in ("due", "leased") or (j.id in pending and j.run_at > self.now)
                   for j in self.jobs.values()):  # fmt: skip
                break
        else:
            self.fail_("the drain did not end")
        states = {}
        for j in self.jobs.values():
            if j.state in FREED:
                continue
            states[j.id] = self.q.status(j.id).value
            ok = states[j.id] in (("due", "scheduled") if j.state == "due" else (j.state,))
            self.expect(ok, f"{j.id} is {states[j.id]}, model {j.state}")
            if j.state == "done":
                self.expect(j.completed == 1, f"{j.id} completed {j.completed} times")
            elif j.state == "dead":
                self.expect(j.attempts == j.defn.max_attempts, f"{j.id} dead at {j.attempts}")
            elif j.state == "due":
                self.expect(j.id in pending and j.run_at > self.now, f"{j.id} left due")
        self.seen.update(f"end_{v}" for v in states.values())
        self.doctor()


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_schedules_match_the_reference_model(client: redis.Redis, chunk: int) -> None:
    seen: Counter[str] = Counter()
    for seed in range(chunk, SEEDS, CHUNKS):
        run = Run(client, seed, seen)
        try:
            run.program(run.rng.randint(60, 150))
            run.drain()
        finally:
            delete_queue(client, run.q)
    # The program reached the paths it exists for.
    for what in ("claimed", "late_run_once", "misfire_drop", "redefine_keeps_due", "lapsed",
                 "claimed_run_now", "run_now_paused", "end_dead", "outage"):  # fmt: skip
        assert seen[what] > 0, (what, seen)
