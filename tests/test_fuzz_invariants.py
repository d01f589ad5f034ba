"""Randomized stateful invariant test ("fuzzer"): seeded random programs that mix every feature
the model tests exercise only separately (delays, attempts, priorities, concurrency keys, rate
windows, dependencies, idempotency keys, enqueue_many, claims by several workers, complete /
fail / heartbeat / release with current and stale tokens, worker crashes, cancel, requeue_dead,
purge_dead, dead-letter retention, recurring schedules and their pause / resume / remove /
redefinition, clock moves) through the public `Queue` API, on the real scripts with the test
clock. No reference model: after every step it checks what must hold whatever the interleaving:

- every id the test got back is findable in a state matching where it is stored (due or held:
  `due` xor `flow:held`; leased: `leased` only; dead: `dead` only; done / cancelled: none), or
  legitimately gone (purged, trimmed by the dead retention, counted in `dead_trimmed`; a
  schedule's never-claimed occurrence withdrawn by pause / remove / redefinition);
- no id in two places; every job set aside is in exactly one hold set;
- never early (a claimed job's run_at <= the claim's now, and >= the time the test asked for);
- never before a parent is done (unless the parent had ended dead / cancelled / gone when the
  child was requeued);
- live leases per concurrency key <= its limit, starts per rate window <= its count, a key's
  held jobs only while its leases fill it;
- each worker holds at most one suspect (`lapses` >= 2, or 1 on its last attempt;
  docs/durability.md);
- each active schedule has exactly one pending, never-claimed occurrence (a paused or removed
  one none), and no occurrence id is claimed as a new job twice (fences only grow);
- `counts()` agrees with the stored sets; `scheduler.admin.doctor.check_queue` finds nothing;
- at the end, after a drain, every job is done, cancelled, dead or legitimately gone.

FUZZ_SEEDS / FUZZ_STEPS / FUZZ_SEED0 raise or move the run by hand (CI: 20 seeds of 150 steps)."""

from __future__ import annotations

import os
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from scheduler import (
    Backoff,
    BadArgument,
    JobCancelled,
    JobNotFound,
    JobSpec,
    Queue,
    StaleToken,
)
from scheduler.admin.doctor import check_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.core.models import Job
from tests.conftest import Clock, delete_queue

KEY_LIMITS = {"a": 1, "b": 2}
RATES = {"r": (2, 1_000), "r2": (1, 300)}  # one limit per rate key: exact counts
WORKERS = ("w1", "w2", "w3")
SCHEDULES = ("s1", "s2")
BACKOFFS = (
    Backoff(base_ms=100, factor=2.0, cap_ms=1_000, jitter=0.0),
    Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0),
    Backoff(base_ms=300, factor=3.0, cap_ms=5_000, jitter=0.5),
)
SEEDS = int(os.environ.get("FUZZ_SEEDS", "20"))
STEPS = int(os.environ.get("FUZZ_STEPS", "150"))
SEED0 = int(os.environ.get("FUZZ_SEED0", "0"))
START_MS = 1_900_000_000_000  # 2030-03-17
FINAL_STATES = ("done", "cancelled")


class Violation(AssertionError):
    pass


@dataclass
class Info:
    """What the test knows of one id it got back (no model of its state)."""

    parents: tuple[str, ...] = ()
    excused: frozenset[str] = frozenset()  # parents dead / cancelled / gone at its requeue
    not_before: int = 0  # the earliest claim the test asked for (enqueue delay, retry time)
    max_fence: int = 0
    occurrence: bool = False
    claimed: bool = False
    gone: str | None = None  # why it may be missing: purged, trimmed, withdrawn
    last_state: str = ""


class Fuzz:
    def __init__(self, client: redis.Redis, seed: int, *, name: str | None = None) -> None:
        self.client, self.seed = client, seed
        self.rng = random.Random(seed)
        self.q = Queue(client, name or "fz-" + uuid.uuid4().hex[:10], _clock="test")
        self.clock = Clock(client, self.q)
        # Start at the server's real time: the doctor reads TIME, and a test clock ahead of it
        # never makes a lease look long lapsed to it.
        # Slots are epoch-aligned: a fixed start keeps a seed reproducible. Ahead of the real
        # clock, which the doctor reads: no lease looks long lapsed to it.
        self.now = max(START_MS, (server_now_ms(client) // 600_000 + 1) * 600_000)
        self.clock.set_ms(self.now)
        self.info: dict[str, Info] = {}
        self.keys: dict[str, str] = {}  # idempotency key -> the id it gave first
        self.held: dict[str, dict[str, tuple[str, int]]] = {w: {} for w in WORKERS}
        self.stale: list[tuple[str, str]] = []
        self.schedules: dict[str, str] = {}  # name -> 'active' | 'paused'
        self.first_slots: dict[str, int] = {}  # schedule -> last first-claimed slot
        self.starts: dict[str, list[int]] = {k: [] for k in RATES}
        self.retention = False
        self.paused = False  # the whole queue (Queue.pause)
        self.trimmed_total = 0
        self.n = 0
        self.log: list[str] = []
        self.step_kind = ""
        self.purging: set[str] = set()
        self.purged_n = 0
        self.seen: Counter[str] = Counter()  # what the run reached (printed by hand runs)

    # -- helpers --------------------------------------------------------------------------
    def new_id(self) -> str:
        self.n += 1
        return f"j{self.n:04d}"

    def fail_(self, msg: str) -> None:
        tail = "\n  ".join(self.log[-int(os.environ.get("FUZZ_LOG", "25")) :])
        raise Violation(f"seed {self.seed}: {msg}\n last steps:\n  {tail}")

    def tick(self, ms: int) -> None:
        self.now += ms
        self.clock.set_ms(self.now)

    def known(self) -> list[str]:
        return list(self.info)

    def some_ids(self, k: int) -> list[str]:
        ids = self.known()
        return self.rng.sample(ids, min(k, len(ids))) if ids else []

    def flow_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        r = self.rng.random()
        if r < 0.25:
            kw["priority"] = self.rng.randint(1, 9)
        r = self.rng.random()
        if r < 0.3:
            key = self.rng.choice(list(KEY_LIMITS))
            kw |= {"concurrency_key": key, "concurrency_limit": KEY_LIMITS[key]}
        if self.rng.random() < 0.2:
            rk = self.rng.choice(list(RATES))
            kw |= {"rate_limit": RATES[rk], "rate_key": rk}
        return kw

    def record_new(self, jid: str, parents: tuple[str, ...], delay: int) -> None:
        self.info[jid] = Info(parents=parents, not_before=self.now + delay)

    # -- steps ----------------------------------------------------------------------------
    def op_enqueue(self) -> None:
        rng = self.rng
        delay = rng.choice([0, 0, 0, 50, 500, 3_000, 60_000])
        kw = self.flow_kwargs()
        key = rng.choice([None, None, None, None, "k1", "k2", "k3"])
        parents: tuple[str, ...] = ()
        if rng.random() < 0.3 and self.info:
            parents = tuple(dict.fromkeys(self.some_ids(rng.randint(1, 2))))
        jid = self.new_id()
        self.log.append(f"enqueue {jid} delay={delay} key={key} after={parents} {kw}")
        try:
            got = self.q.enqueue(
                "t",
                {"n": self.n},
                delay_ms=delay,
                max_attempts=rng.randint(1, 3),
                backoff=rng.choice(BACKOFFS),
                key=key,
                job_id=jid,
                after=list(parents) or None,
                **kw,
            )
        except BadArgument as exc:
            self.expect_missing_parent(parents, exc)
            return
        self.after_enqueue([(jid, got, key, parents, delay)])

    def expect_missing_parent(self, parents: tuple[str, ...], exc: Exception) -> None:
        found = {j.id for j in self.q._run(self.q.ops.get_jobs(list(parents)))}
        if not set(parents) - found:
            self.fail_(f"enqueue refused though every parent exists: {exc}")

    def after_enqueue(self, rows: list[tuple[str, str, str | None, tuple[str, ...], int]]) -> None:
        for jid, got, key, parents, delay in rows:
            if key is not None and key in self.keys:
                if got != self.keys[key]:
                    self.fail_(f"key {key} gave {got}, first gave {self.keys[key]}")
                continue
            if got != jid:
                self.fail_(f"enqueue of {jid} answered {got}")
            if key is not None:
                self.keys[key] = jid
            self.record_new(jid, parents, delay)

    def op_enqueue_many(self) -> None:
        rng = self.rng
        specs: list[JobSpec] = []
        rows: list[tuple[str, str | None, tuple[str, ...], int]] = []
        for _ in range(rng.randint(1, 4)):
            jid = self.new_id()
            delay = rng.choice([0, 0, 200, 2_000])
            key = rng.choice([None, None, None, "k1", "k4"])
            parents: tuple[str, ...] = ()
            if rng.random() < 0.5 and (rows or self.info):
                pool = [r[0] for r in rows] + self.some_ids(2)
                parents = tuple(dict.fromkeys(rng.sample(pool, min(len(pool), rng.randint(1, 2)))))
            specs.append(
                JobSpec(
                    "t",
                    {"n": self.n},
                    delay_ms=delay,
                    max_attempts=rng.randint(1, 3),
                    backoff=rng.choice(BACKOFFS),
                    key=key,
                    job_id=jid,
                    after=list(parents) or None,
                    **self.flow_kwargs(),
                )
            )
            rows.append((jid, key, parents, delay))
        self.log.append(f"enqueue_many {[(r[0], r[1], r[2]) for r in rows]}")
        try:
            got = self.q.enqueue_many(specs)
        except BadArgument as exc:
            # A parent of this call whose key was taken stands for the job the key names.
            taken = {r[0]: self.keys[r[1]] for r in rows if r[1] is not None and r[1] in self.keys}
            in_call = {r[0] for r in rows} - set(taken)
            outer = tuple(taken.get(p, p) for r in rows for p in r[2] if p not in in_call)
            self.expect_missing_parent(outer, exc)
            return
        # A parent of this call whose key was taken stands for the job the key names.
        alias = {r[0]: g for r, g in zip(rows, got, strict=True)}
        out = []
        for (jid, key, parents, delay), g in zip(rows, got, strict=True):
            resolved = tuple(dict.fromkeys(alias.get(p, p) for p in parents))
            out.append((jid, g, key, resolved, delay))
        seen_keys: dict[str, str] = {}
        for jid, g, key, resolved, delay in out:
            if key is not None and key not in self.keys and key in seen_keys:
                if g != seen_keys[key]:
                    self.fail_(f"key {key} twice in one call: {g} and {seen_keys[key]}")
                continue
            if key is not None and key not in self.keys:
                seen_keys[key] = g
            self.after_enqueue([(jid, g, key, resolved, delay)])

    def op_claim(self) -> None:
        rng = self.rng
        w = rng.choice(WORKERS)
        limit = rng.choice([0, 1, 1, 2, 3, 5])
        lease_ms = rng.choice([300, 1_000, 5_000, 30_000])
        reap = rng.choice([100, 100, 100, 0, 1])
        self.n += 1
        batch = self.q.claim(w, limit=limit, lease_ms=lease_ms, reap_limit=reap, nonce=f"n{self.n}")
        self.log.append(
            f"claim {w} limit={limit} lease={lease_ms} reap={reap} -> "
            f"{[j.id for j in batch.jobs]} now={batch.now_ms}"
        )
        if batch.now_ms != self.now:
            self.fail_(f"claim's now {batch.now_ms} is not the test clock {self.now}")
        if len(batch.jobs) > limit:
            self.fail_("claim returned more than its limit")
        if self.paused and batch.jobs:
            self.fail_("a paused queue's claim leased jobs")
        if batch.unreadable:
            self.fail_(f"unreadable jobs: {batch.unreadable}")
        claimed_jobs = {
            j.id: j for j in self.q._run(self.q.ops.get_jobs([j.id for j in batch.jobs]))
        }
        for job in batch.jobs:
            jid = job.id
            info = self.info.get(jid)
            if info is None:
                if not job.schedule:
                    self.fail_(f"claim returned an id never enqueued: {jid}")
                info = self.info[jid] = Info(occurrence=True)
            # A withdrawn occurrence never ran: its slot may be placed again (a new record).
            if info.gone is not None and not (info.gone == "withdrawn" and job.fence == 1):
                self.fail_(f"{jid} claimed after it was {info.gone}")
            info.gone = None
            if info.last_state in ("done", "cancelled", "dead"):
                self.fail_(f"{jid} claimed while {info.last_state}")
            if job.run_at_ms > batch.now_ms:
                self.fail_(f"{jid} claimed early: run_at {job.run_at_ms} > now {batch.now_ms}")
            if batch.now_ms < info.not_before:
                self.fail_(f"{jid} claimed at {batch.now_ms}, asked for >= {info.not_before}")
            if job.fence <= info.max_fence:
                self.fail_(
                    f"{jid} claimed with fence {job.fence} after fence {info.max_fence}: "
                    "its record was made again (a run twice)"
                )
            if job.schedule:
                slot = int(jid.rsplit(":", 1)[1])
                if slot > batch.now_ms:
                    self.fail_(f"occurrence {jid} claimed before its slot")
                if job.fence == 1:
                    last = self.first_slots.get(job.schedule)
                    if last is not None and slot <= last:
                        self.fail_(f"schedule {job.schedule}: slot {slot} first ran after {last}")
                    self.first_slots[job.schedule] = slot
            info.max_fence, info.claimed = job.fence, True
            self.seen["claim:occurrence" if job.schedule else "claim"] += 1
            self.seen["claim:excused"] += bool(info.excused)
            info.not_before = 0
            for p in info.parents:
                if p in info.excused:
                    continue
                pj = self.q._run(self.q.ops.get_jobs([p]))
                if not pj or pj[0].state != "done":
                    st = pj[0].state if pj else "gone"
                    self.fail_(f"{jid} claimed while its parent {p} is {st}")
            fields = claimed_jobs[jid].fields
            rk = fields.get("rkey")
            if rk in RATES:
                self.starts[rk].append(batch.now_ms)
            self.held[w][jid] = (job.token, batch.now_ms + lease_ms)
        for rk, (count, window) in RATES.items():
            inside = [t for t in self.starts[rk] if t > self.now - window]
            if len(inside) > count:
                self.fail_(f"rate key {rk}: {len(inside)} starts in {window} ms (limit {count})")

    def pick_lease(self) -> tuple[str, str, str] | None:
        pool = [(w, jid, tok) for w, m in self.held.items() for jid, (tok, _) in m.items()]
        if self.stale and (not pool or self.rng.random() < 0.2):
            jid, tok = self.rng.choice(self.stale)
            return "", jid, tok
        return self.rng.choice(pool) if pool else None

    def drop_lease(self, w: str, jid: str) -> None:
        if w and jid in self.held[w]:
            tok, _ = self.held[w].pop(jid)
            self.stale.append((jid, tok))

    def op_complete(self) -> None:
        got = self.pick_lease()
        if got is None:
            return
        w, jid, tok = got
        status = self.q.complete_many([(jid, tok, {"ok": 1})])[0]
        self.log.append(f"complete {jid} {tok} ({w or 'stale'}) -> {status}")
        self.drop_lease(w, jid)
        if status == "done":
            state = self.q.status(jid).value
            if state != "done":
                self.fail_(f"complete answered done, {jid} is {state}")

    def op_fail(self) -> None:
        got = self.pick_lease()
        if got is None:
            return
        w, jid, tok = got
        retryable = self.rng.random() < 0.75
        delay = self.rng.choice([None, None, 0, 700])
        try:
            out = self.q.fail(jid, tok, ("E", "m", ""), retryable=retryable, delay_ms=delay)
        except (StaleToken, JobCancelled, JobNotFound) as exc:
            self.log.append(f"fail {jid} {tok} ({w or 'stale'}) -> {type(exc).__name__}")
            self.drop_lease(w, jid)
            return
        self.log.append(
            f"fail {jid} {tok} ({w or 'stale'}) retryable={retryable} delay={delay} -> {out}"
        )
        self.drop_lease(w, jid)
        if out.status == "retry" and w:  # a stale token may get its settled answer again
            assert out.run_at_ms is not None
            if out.run_at_ms < self.now:
                self.fail_(f"retry of {jid} at {out.run_at_ms}, before now {self.now}")
            if delay is not None and out.run_at_ms != self.now + delay:
                self.fail_(f"retry of {jid} at {out.run_at_ms}, asked {self.now + delay}")
            if jid in self.info:
                self.info[jid].not_before = out.run_at_ms

    def op_heartbeat(self) -> None:
        w = self.rng.choice(WORKERS)
        leases = [(jid, tok) for jid, (tok, _) in self.held[w].items()]
        if self.stale and self.rng.random() < 0.3:
            leases.append(self.rng.choice(self.stale))
        if not leases:
            return
        lease_ms = self.rng.choice([300, 2_000, 30_000])
        until, statuses = self.q.heartbeat(leases, lease_ms=lease_ms)
        self.log.append(f"heartbeat {w} {leases} {lease_ms} -> {statuses}")
        for jid, _ in leases:
            if jid not in self.held[w]:
                continue
            if statuses.get(jid) == "held":
                self.held[w][jid] = (self.held[w][jid][0], until)
            else:
                self.drop_lease(w, jid)

    def op_release(self) -> None:
        got = self.pick_lease()
        if got is None:
            return
        w, jid, tok = got
        status = self.q.release([(jid, tok)])[0]
        self.log.append(f"release {jid} {tok} ({w or 'stale'}) -> {status}")
        self.drop_lease(w, jid)
        if status == "released" and jid in self.info:
            self.info[jid].not_before = 0

    def op_crash(self) -> None:
        w = self.rng.choice(WORKERS)
        leases = self.held[w]
        if not leases:
            return
        end = max(u for _, u in leases.values())
        self.log.append(f"crash {w} holding {list(leases)}; clock to {end + 1}")
        for jid in list(leases):
            self.drop_lease(w, jid)
        if end + 1 > self.now:
            self.tick(end + 1 - self.now)

    def op_cancel(self) -> None:
        ids = self.some_ids(1)
        if not ids:
            return
        try:
            before = self.q.cancel(ids[0])
        except JobNotFound:
            before = "missing"
        self.log.append(f"cancel {ids[0]} -> {before}")

    def op_reschedule(self) -> None:
        ids = self.some_ids(1)
        if not ids:
            return
        delay = self.rng.choice([0, 0, 50, 1_000, 60_000])
        try:
            out = self.q.reschedule(ids[0], delay_ms=delay)
        except JobNotFound:
            out = "missing"
        self.log.append(f"reschedule {ids[0]} +{delay} -> {out}")
        if out == "rescheduled":
            info = self.info[ids[0]]
            if info.occurrence:
                self.fail_(f"a schedule's occurrence {ids[0]} was rescheduled")
            info.not_before = self.now + delay  # earlier or later than asked at enqueue

    def op_requeue(self) -> None:
        dead = self.q.dead_ids()
        ids = self.rng.sample(dead, min(len(dead), self.rng.randint(1, 3))) if dead else []
        ids += self.some_ids(self.rng.randint(0, 1))
        if not ids:
            return
        moved = self.q.requeue_dead(ids)
        self.log.append(f"requeue_dead {ids} -> {moved}")
        # A requeued child waits again for its parents still pending; the others (ended dead,
        # cancelled, or gone) it no longer waits for.
        jobs = {j.id: j for j in self.q._run(self.q.ops.get_jobs(self.known()))}
        for jid in dict.fromkeys(ids):
            info = self.info.get(jid)
            if info is None or jid not in jobs or info.last_state != "dead":
                continue
            if jobs[jid].state == "dead":
                continue
            info.not_before = 0
            # Once let go of a parent, for good: a later requeue waits only for the parents of
            # its last wait (the `parents` field), not for one requeued since.
            info.excused |= frozenset(
                p for p in info.parents if p not in jobs or jobs[p].state in ("dead", "cancelled")
            )
            self.log.append(
                f"  {jid} requeued: parents {info.parents}, "
                f"no longer waits for {sorted(info.excused)}"
            )

    def op_purge(self) -> None:
        dead = self.q.dead_ids()
        ids = self.rng.sample(dead, min(len(dead), self.rng.randint(1, 2))) if dead else []
        ids += self.some_ids(self.rng.randint(0, 1))
        if not ids:
            return
        self.purging = set(ids)
        self.purged_n = self.q.purge_dead(ids)
        self.log.append(f"purge_dead {ids} -> {self.purged_n}")

    def op_retention(self) -> None:
        age = self.rng.choice([None, None, 2_000, 60_000])
        count = self.rng.choice([None, 0, 2, 6])
        self.q.set_dead_retention(max_age_ms=age, max_count=count)
        self.retention = age is not None or count is not None
        self.log.append(f"set_dead_retention age={age} count={count}")

    def op_schedule(self) -> None:
        rng = self.rng
        name = rng.choice(SCHEDULES)
        what = rng.choice(["upsert", "upsert", "pause", "resume", "remove"])
        if what == "upsert":
            every = rng.choice([500, 1_000, 3_000])
            kw = self.flow_kwargs()
            jitter = rng.choice([0, 0, 0, 200])
            misfire = rng.choice(["skip", "run_once", "catch_up:3"])
            out = self.q.schedule(
                name,
                "t",
                {"s": name},
                every_ms=every,
                jitter_ms=jitter,
                misfire=misfire,
                max_attempts=rng.randint(1, 3),
                **kw,
            )
            self.log.append(
                f"schedule {name} every={every} jitter={jitter} {misfire} {kw} -> {out}"
            )
            if name not in self.schedules:
                self.schedules[name] = "active"
        elif what == "pause":
            out = self.q.pause_schedule(name)
            self.log.append(f"pause {name} -> {out}")
            if name in self.schedules:
                self.schedules[name] = "paused"
        elif what == "resume":
            out = self.q.resume_schedule(name)
            self.log.append(f"resume {name} -> {out}")
            if name in self.schedules:
                self.schedules[name] = "active"
        else:
            out = self.q.remove_schedule(name)
            self.log.append(f"remove {name} -> {out}")
            self.schedules.pop(name, None)
            self.first_slots.pop(name, None)

    def op_pause(self) -> None:
        """Pause or resume the whole queue: a paused queue's claims lease nothing."""
        if self.paused:
            out = self.q.resume()
            if out != "resumed":
                self.fail_(f"resume of a paused queue said {out!r}")
        else:
            out = self.q.pause()
            if out != "paused":
                self.fail_(f"pause of a running queue said {out!r}")
        self.paused = not self.paused
        self.log.append(f"{out}")
        if self.q.counts().paused is not self.paused:
            self.fail_(f"counts().paused is not {self.paused} after {out}")

    def op_tick(self) -> None:
        ms = self.rng.choice([1, 10, 100, 300, 700, 1_500, 5_000, 40_000, 120_000])
        self.log.append(f"tick {ms}")
        self.tick(ms)

    OPS = (
        ("enqueue", 6), ("enqueue_many", 2), ("claim", 7), ("complete", 4), ("fail", 3),
        ("heartbeat", 2), ("release", 1), ("crash", 1), ("cancel", 2), ("requeue", 2),
        ("purge", 1), ("retention", 1), ("schedule", 2), ("tick", 5), ("pause", 1),
        ("reschedule", 2),
    )  # fmt: skip

    def step(self) -> None:
        names = [n for n, _ in self.OPS]
        kind = self.rng.choices(names, weights=[w for _, w in self.OPS])[0]
        self.step_kind = kind
        self.purging, self.purged_n = set(), 0
        getattr(self, "op_" + kind)()
        # The rate logs expire by the real clock (window + 1 s): kept for the test clock.
        for rk in RATES:
            self.client.persist(self.q.keys.prefix + "flow:rate:" + rk)
        self.check()
        self.purging, self.purged_n = set(), 0

    # -- invariants -------------------------------------------------------------------------
    def zset(self, key: str) -> dict[str, float]:
        pairs: list[tuple[str, float]] = self.client.zrange(key, 0, -1, withscores=True)  # type: ignore[assignment]
        return dict(pairs)

    def trimmed_so_far(self) -> int:
        total = 0
        for k in self.client.scan_iter(match=self.q.keys.prefix + "stats:*", count=1000):
            total += int(self.client.hget(k, "dead_trimmed") or 0)
        return total

    def check(self) -> None:
        q, c, now = self.q, self.client, self.now
        k = q.keys
        due, held = self.zset(k.due), self.zset(k.flow_held)
        leased, dead = self.zset(k.leased), self.zset(k.dead)
        places = {"due": due, "flow:held": held, "leased": leased, "dead": dead}
        # Schedules' pending occurrences are ids the API hands out too (get_schedule).
        sched: dict[str, dict[str, str]] = {}
        for name in SCHEDULES:
            h: dict[str, str] = c.hgetall(k.schedule(name))  # type: ignore[assignment]
            sched[name] = h
            p = h.get("pending") or ""
            if p and p not in self.info:
                self.info[p] = Info(occurrence=True)
        jobs: dict[str, Job] = {j.id: j for j in q._run(q.ops.get_jobs(self.known()))}
        # 1. no id in two places
        names = list(places)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                both = set(places[a]) & set(places[b])
                if both:
                    self.fail_(f"in both {a} and {b}: {sorted(both)}")
        # 2. every id findable where its state says, or legitimately gone
        vanished: list[str] = []
        for jid, info in self.info.items():
            job = jobs.get(jid)
            if job is None:
                if info.gone is None:
                    vanished.append(jid)
                continue
            if info.gone is not None and not info.occurrence:
                self.fail_(f"{jid} was {info.gone} and is back as {job.state}")
            info.gone = None
            st = job.state
            where = [p for p, s in places.items() if jid in s]
            want = {
                "due": ["due"],
                "scheduled": ["due"],
                "held": ["flow:held"],  # set aside by flow control: get_job reads it held
                "leased": ["leased"],
                "dead": ["dead"],
                "done": [],
                "cancelled": [],
            }.get(st)
            if want is None:
                self.fail_(f"{jid} has state {st!r}")
            elif where != want:
                self.fail_(f"{jid} is {st} but stored in {where}")
            info.last_state = st
        trimmed = self.trimmed_so_far() if self.retention or self.trimmed_total else 0
        new_trims = trimmed - self.trimmed_total
        self.trimmed_total = max(trimmed, self.trimmed_total)
        unexplained: list[str] = []
        purged = []
        for jid in vanished:
            info = self.info[jid]
            if jid in self.purging:
                info.gone = "purged"
                purged.append(jid)
            elif info.occurrence and not info.claimed and self.step_kind == "schedule":
                info.gone = "withdrawn"
            elif info.last_state not in FINAL_STATES and new_trims > 0:
                info.gone = "trimmed"
                new_trims -= 1
            else:
                unexplained.append(jid)
            self.seen[f"gone:{info.gone}"] += 1
        if unexplained:
            self.fail_(f"lost (not findable, not purged / trimmed / withdrawn): {unexplained}")
        if self.purging and len(purged) != self.purged_n:
            self.fail_(f"purge_dead answered {self.purged_n}, {purged} are gone")
        # 3. every stored member is an id the test knows (or an occurrence)
        for p, s in places.items():
            for jid in s:
                if jid not in self.info and not jid.startswith("schedule:"):
                    self.fail_(f"unknown id {jid} in {p}")
        # 4. counts agree with the stored sets
        counts = q.counts()
        exp_due = sum(1 for s in due.values() if s <= now) + len(held)
        exp_sched = sum(1 for s in due.values() if s > now)
        got = (counts.due, counts.scheduled, counts.leased, counts.dead, counts.lapsed)
        want_c = (
            exp_due,
            exp_sched,
            len(leased),
            len(dead),
            sum(1 for s in leased.values() if s <= now),
        )
        if got != want_c:
            self.fail_(f"counts {got} != stored {want_c}")
        # 5. every held job in exactly one hold set
        rheld, waiting = self.zset(k.flow_rheld), self.zset(k.flow_waiting)
        ckheld = {key: self.zset(k.prefix + "flow:ckheld:" + key) for key in KEY_LIMITS}
        for jid in held:
            sets = [n for n, s in [("rheld", rheld), ("waiting", waiting)] if jid in s]
            sets += [f"ckheld:{key}" for key, s in ckheld.items() if jid in s]
            if len(sets) != 1:
                self.fail_(f"held {jid} is in hold sets {sets}")
        for n, s in [("rheld", rheld), ("waiting", waiting), *ckheld.items()]:
            extra = set(s) - set(held)
            if extra:
                self.fail_(f"{n} holds {sorted(extra)}, not in flow:held")
        # 6. concurrency: live leases per key <= limit; a key holds jobs only while full
        lease_fields = {jid: jobs[jid].fields for jid in leased if jid in jobs}
        for key, limit in KEY_LIMITS.items():
            mine = [j for j, f in lease_fields.items() if f.get("ckey") == key]
            live = [j for j in mine if leased[j] > now]
            if len(live) > limit:
                self.fail_(f"key {key}: {len(live)} live leases {live} > {limit}")
            # A key's held jobs wait for a slot: its leases (lapsed ones until reaped) and the
            # jobs a freed slot promoted into due fill it, or one of them would be stranded.
            coming = [j for j in due if j in jobs and jobs[j].fields.get("ckey") == key]
            if ckheld[key] and len(mine) + len(coming) < limit:
                self.fail_(
                    f"key {key} holds {sorted(ckheld[key])} with leases {mine}, "
                    f"due {coming}: nothing will free a slot for them"
                )
            slots = self.zset(k.prefix + "flow:ck:" + key)
            for jid, until in slots.items():
                if until > now and jid not in leased:
                    self.fail_(f"key {key}: slot of {jid} live until {until}, not leased")
        # 7. a waiting job waits for a parent not done yet
        for jid in waiting:
            parents = self.info[jid].parents if jid in self.info else ()
            pending = [p for p in parents if p in jobs and jobs[p].state != "done"]
            if not pending:
                self.fail_(f"{jid} waits, but its parents {parents} are all done or gone")
        # 8. one suspect per worker
        suspects: dict[str, list[str]] = {}
        for jid, f in lease_fields.items():
            lapses, tries = int(f.get("lapses") or 0), int(f.get("attempts") or 0)
            if lapses >= 2 or (lapses >= 1 and tries >= int(f.get("max_attempts") or 5)):
                suspects.setdefault(f.get("worker", ""), []).append(jid)
        for w, held_ids in suspects.items():
            if len(held_ids) > 1:
                self.fail_(f"worker {w} holds {len(held_ids)} suspects: {held_ids}")
        # 9. schedules: exactly one pending never-claimed occurrence while active
        for name in SCHEDULES:
            h = sched[name]
            unclaimed = [
                j
                for j in (*due, *held)
                if j.startswith(f"schedule:{name}:") and j in jobs and "fence" not in jobs[j].fields
            ]
            state = self.schedules.get(name)
            if state == "active":
                if h.get("paused") == "1":
                    self.fail_(f"schedule {name} resumed but paused")
                if not h.get("pending") or unclaimed != [h["pending"]]:
                    self.fail_(
                        f"schedule {name}: pending {h.get('pending')!r}, "
                        f"unclaimed occurrences {unclaimed}"
                    )
            elif unclaimed or (h and h.get("pending")):
                self.fail_(
                    f"schedule {name} ({state or 'removed'}): pending "
                    f"{h.get('pending')!r}, unclaimed occurrences {unclaimed}"
                )
        self.seen.update(
            held_rate=len(rheld),
            held_waiting=len(waiting),
            held_key=sum(map(len, ckheld.values())),
            leased=len(leased),
            dead=len(dead),
            suspect=sum(map(len, suspects.values())),
            lapsed=sum(1 for s in leased.values() if s <= now),
        )
        # 10. the doctor finds nothing
        issues = check_queue(c, q.name)
        if issues:
            self.fail_("doctor: " + "; ".join(f"{i.code} {i.job_id}: {i.message}" for i in issues))
        # 11. the public readers agree, for one id
        if jobs:
            jid = self.rng.choice(sorted(jobs))
            if q.status(jid).value != jobs[jid].state:
                self.fail_(f"status({jid}) != get_jobs state {jobs[jid].state}")

    # -- the end ----------------------------------------------------------------------------
    def drain(self) -> None:
        if self.paused:
            self.q.resume()
            self.paused = False
        self.step_kind = "schedule"
        for name in SCHEDULES:
            self.q.remove_schedule(name)
        self.schedules.clear()
        self.check()
        self.step_kind = "drain"
        for m in self.held.values():
            for jid, (tok, _) in list(m.items()):
                self.q.complete_many([(jid, tok, None)])
            m.clear()
        for _ in range(200):
            self.tick(200_000)
            for w in WORKERS:
                while True:
                    self.n += 1
                    batch = self.q.claim(
                        w, limit=1000, lease_ms=1_000, reap_limit=10_000, nonce=f"n{self.n}"
                    )
                    if not batch.jobs:
                        break
                    for job in batch.jobs:
                        if batch.now_ms < job.run_at_ms:
                            self.fail_(f"drain: {job.id} claimed early")
                    self.q.complete_many([(j.id, j.token, None) for j in batch.jobs])
            self.check()
            counts = self.q.counts()
            if counts.due + counts.scheduled + counts.leased == 0:
                break
        counts = self.q.counts()
        if counts.due + counts.scheduled + counts.leased:
            self.fail_(f"stranded after the drain: {counts}")
        for jid, info in self.info.items():
            if info.gone is None and info.last_state not in ("done", "cancelled", "dead"):
                self.fail_(f"{jid} ended {info.last_state!r}")


def run_seed(client: redis.Redis, seed: int, steps: int = STEPS) -> None:
    fz = Fuzz(client, seed)
    try:
        fz.check()
        for _ in range(steps):
            fz.step()
        fz.drain()
    finally:
        delete_queue(client, fz.q)


@pytest.mark.parametrize("seed", range(SEED0, SEED0 + SEEDS))
def test_invariants_hold_under_random_programs(client: redis.Redis, seed: int) -> None:
    run_seed(client, seed)


# -- regression tests: each pins down a behaviour the fuzzer first read as a violation ---------
# (all three were wrong invariants of the first draft, kept so the rule stays written down)


def test_a_key_holds_its_jobs_while_a_promoted_one_waits_in_due(
    fq: tuple[Queue, Clock],
) -> None:
    """A lease's end promotes as many held jobs as there are free slots; the others stay held
    with no lease of their key until the promoted one runs and ends (docs/flow-control.md)."""
    q, _ = fq
    kw: dict[str, Any] = {"concurrency_key": "a", "concurrency_limit": 1}
    x, y, z = (q.enqueue("t", i, **kw) for i in range(3))
    (lease,) = q.claim("w", limit=3).jobs
    assert lease.id == x
    q.complete(x, lease.token)
    assert q.client.zrange(q.keys.prefix + "flow:ckheld:a", 0, -1) == [z]
    assert q.client.zscore(q.keys.due, y) is not None  # promoted: it holds the free slot
    (lease,) = q.claim("w", limit=3).jobs
    assert lease.id == y
    q.complete(y, lease.token)
    assert [j.id for j in q.claim("w", limit=3).jobs] == [z]


def test_a_requeued_child_does_not_wait_again_for_a_parent_it_was_let_go_of(
    fq: tuple[Queue, Clock],
) -> None:
    """requeue_dead waits again for the parents of the child's last wait (its `parents` field)
    still pending; a parent that was dead at an earlier requeue is let go of for good, even
    once it is requeued itself and running (lib/flow.lua flow_rewait)."""
    q, _ = fq
    p = q.enqueue("t", "p", max_attempts=1)
    other = q.enqueue("t", "other", delay_ms=60_000)
    child = q.enqueue("t", "c", after=[p, other])
    (lease,) = q.claim("w", limit=5).jobs
    assert lease.id == p
    q.fail(p, lease.token, ("E", "m", ""), retryable=False)
    assert q.get_job(child).dead_reason == f"parent dead: {p}"
    assert q.requeue_dead([child]) == 1  # p dead: waits for `other` only
    assert q.cancel(other) == "scheduled"
    assert q.get_job(child).dead_reason == f"parent cancelled: {other}"
    assert q.requeue_dead([p]) == 1
    (lease,) = q.claim("w", limit=5).jobs
    assert lease.id == p  # p runs again
    assert q.requeue_dead([child]) == 1
    assert [j.id for j in q.claim("w2", limit=5).jobs] == [child]  # beside its parent p


def test_a_withdrawn_occurrence_slot_is_placed_again(fq: tuple[Queue, Clock]) -> None:
    """Pausing withdraws (deletes) the pending occurrence; resuming before its slot places the
    same slot again, a new record under the same id: it never ran, so it runs once."""
    q, clock = fq
    q.schedule("s", "t", every_ms=1_000)
    first = q.get_schedule("s").pending
    assert q.pause_schedule("s") == "paused"
    with pytest.raises(JobNotFound):
        q.get_job(first)
    assert q.resume_schedule("s") == "resumed"
    assert q.get_schedule("s").pending == first
    clock.set_ms(int(first.rsplit(":", 1)[1]))
    (lease,) = q.claim("w", limit=5).jobs
    assert (lease.id, lease.fence) == (first, 1)
