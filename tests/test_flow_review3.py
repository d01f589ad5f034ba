"""Third review of flow control (docs/flow-control.md): seeded random sequences against a small
model, beyond tests/test_flow_model.py's operations: mixed limits on one key, two counts on one
rate key, claims that reap nothing (a lapsed lease settled by its stale worker before it is
reaped), heartbeats, non-retryable fails, out-of-attempts and start-deadline parks, children
(after=) parked and requeued, requeue from dead, reschedule, queue pause / resume, a schedule
sharing the jobs' key and rate key (defined, redefined, paused, resumed, removed), and a bulk
mode where the per-script bounds cut in. Each step checks what a user relies on: never early,
never before a parent, key and rate limits at each start, no key's held jobs left with nothing
to let them go, held bookkeeping, counts, listings and doctor's flow key checks consistent;
the end drains the queue and checks every job ended once. On the test clock (never sleeps);
FR3_SEEDS / FR3_BULK_SEEDS run more seeds. A real-worker guard checks key limits through
retries."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from scheduler import Backoff, JobNotFound, JobSpec, Queue, Registry
from scheduler.admin.doctor_flow import key_set_issues
from scheduler.worker import WorkerSettings
from tests.conftest import Clock, delete_queue
from tests.embedded_worker import run_until

T0 = 1_000_000
# Key -> the limits its jobs are given (one key mixes two limits: "the limit of the job being
# claimed applies").
KEYS: dict[str, tuple[int, ...]] = {"a": (1,), "b": (2,), "c": (1, 3), "d": (450,)}
# Rate key -> the (count, window_ms) its jobs are given. One key mixes two counts in one window
# (not two windows: a window longer than any the key used before sees only the starts its log
# kept, a documented limit of docs/flow-control.md).
RATES: dict[str, tuple[tuple[int, int], ...]] = {"r": ((2, 1_000),), "s": ((1, 1_000), (3, 1_000))}


@dataclass
class MJob:
    id: str
    run_at: int
    ckey: str | None
    climit: int
    rkey: str | None
    rate: tuple[int, int]
    max_attempts: int
    start_within: int | None = None
    parents: tuple[str, ...] = ()  # the parents it waits for (after=), while waiting
    state: str = "due"  # due | waiting | leased | done | cancelled | dead
    token: str = ""
    until: int = 0
    attempts: int = 0
    completed: int = 0
    old_tokens: list[str] = field(default_factory=list)


class Explorer:
    def __init__(
        self, client: redis.Redis, seed: int, schedules: bool = False, bulk: bool = False
    ) -> None:
        self.q = Queue(client, "fr3-" + uuid.uuid4().hex[:10], _clock="test")
        self.clock = Clock(client, self.q)
        self.now = T0
        self.clock.set_ms(self.now)
        self.rng = random.Random(seed)
        self.jobs: dict[str, MJob] = {}
        self.starts: dict[str, list[int]] = {k: [] for k in RATES}
        self.paused = False
        self.log: list[str] = []
        self.schedules = schedules
        # Bulk: batches of up to 400 jobs and claims of up to 300, so the per-script bounds
        # (lib/flow.lua FLOW_HOLD_BUDGET, FLOW_PROMOTE_STEP, FLOW_CK_STEP; the reaper's 500)
        # cut in; key `d` has a limit of 450.
        self.bulk = bulk
        self.sched = ""  # '' (none), 'on' or 'paused'
        # Half the seeds age priorities fast: the aged pass and the places inside a key move.
        if seed % 2:
            client.hset(self.q.keys.prefix + "config", "priority_aging_ms", "500")

    # -- model helpers -------------------------------------------------------------------
    def live(self, key: str) -> int:
        return sum(
            j.state == "leased" and j.until > self.now and j.ckey == key for j in self.jobs.values()
        )

    def reap(self, most: int) -> None:
        """Claim's reaper: the lapsed leases, earliest end first (then by id, as the ZSET
        orders ties), at most `most` (the script reaps 500 at most per call)."""
        lapsed = [j for j in self.jobs.values() if j.state == "leased" and j.until <= self.now]
        lapsed.sort(key=lambda j: (j.until, j.id))
        for j in lapsed[: min(most, 500)]:
            j.old_tokens.append(j.token)
            if j.attempts >= j.max_attempts:
                self.finished(j, "dead")
            else:
                j.state, j.run_at = "due", j.until

    def finished(self, j: MJob, state: str) -> None:
        """j ends done, dead or cancelled: its waiting children count it (docs/flow-control.md,
        Dependencies): done ones are due once every parent they wait for is done; a dead or
        cancelled parent parks them, and theirs in turn."""
        j.state = state
        for c in self.jobs.values():
            if c.state != "waiting" or j.id not in c.parents:
                continue
            if state == "done":
                if all(self.jobs[p].state == "done" for p in c.parents):
                    c.state = "due"
            else:
                self.finished(c, "dead")

    def occurrence(self, jid: str) -> MJob:
        """A schedule's run, a job of the model from when it is seen: key `a` (limit 1), rate
        key `r`, its slot for run time (every_ms, no jitter)."""
        slot = int(jid.rsplit(":", 1)[1])
        return MJob(jid, slot, "a", 1, "r", RATES["r"][0], 5)

    def adopt(self) -> None:
        """The runs the server inserted since (a claim, a definition, a resume)."""
        p = self.q.keys.prefix
        for key in (self.q.keys.due, p + "flow:held"):
            for m in self.q.client.zrange(key, 0, -1):
                jid = str(m)
                if not jid.startswith("schedule:"):
                    continue
                # A run withdrawn (its record deleted) and placed again under its slot's id.
                gone = jid in self.jobs and self.jobs[jid].state == "cancelled"
                if jid not in self.jobs or gone:
                    self.jobs[jid] = self.occurrence(jid)

    def sync_states(self) -> None:
        """Claim may park a due job (attempts exhausted), drop a late run (misfire policy); a
        schedule's pause, removal or redefinition deletes its waiting run: read the server."""
        if self.bulk:
            due = [j for j in self.jobs.values() if j.state == "due"]
            pipe = self.q.client.pipeline(transaction=False)
            for j in due:
                pipe.hget(self.q.keys.job(j.id), "state")
            for j, state in zip(due, pipe.execute(), strict=True):
                assert state in (None, "due", "dead"), (j.id, state)
                if state == "dead":
                    self.finished(j, "dead")
            return
        for j in self.jobs.values():
            if j.state == "due":
                try:
                    real = self.q.status(j.id).value
                except JobNotFound:
                    assert j.id.startswith("schedule:"), (j.id, self.log[-5:])
                    real = "cancelled"
                if real == "dead":
                    self.finished(j, "dead")
                elif real == "cancelled":
                    assert j.id.startswith("schedule:"), (j.id, self.log[-5:])
                    self.finished(j, "cancelled")
                else:
                    assert real in ("due", "scheduled", "held"), (j.id, real, self.log[-5:])

    def pick(self, states: tuple[str, ...]) -> MJob | None:
        got = [j for j in self.jobs.values() if j.state in states]
        return self.rng.choice(got) if got else None

    # -- operations ---------------------------------------------------------------------
    def enqueue(self) -> None:
        rng = self.rng
        delay = rng.choice([0, 0, 0, 150, 1_200])
        kw: dict[str, Any] = {"priority": rng.choice([0, 0, 3, 9])}
        ckey = rng.choice([None, "a", "a", "b", "c", "c"] + (["d", "d"] if self.bulk else []))
        climit = 0
        if ckey is not None:
            climit = rng.choice(KEYS[ckey])
            kw |= {"concurrency_key": ckey, "concurrency_limit": climit}
        rkey = rng.choice([None, None, "r", "s"])
        rate = (0, 0)
        if rkey is not None:
            rate = rng.choice(RATES[rkey])
            kw |= {"rate_limit": rate, "rate_key": rkey}
        max_attempts = rng.choice([1, 2, 1000])
        within = rng.choice([None, None, None, 2_000])
        if within is not None:
            kw["start_within_ms"] = within
        n = rng.choice([1, 30, 400]) if self.bulk else 1
        if rkey is not None:  # a rate key's batch drains at its rate: kept small
            n = min(n, 30)
        known = [i for i in self.jobs if not i.startswith("schedule:")]
        after: tuple[str, ...] = ()
        if known and rng.random() < 0.3:
            after = tuple(dict.fromkeys(rng.choice(known) for _ in range(rng.choice([1, 2]))))
            kw["after"] = list(after)
        spec = JobSpec("t", None, delay_ms=delay, max_attempts=max_attempts, **kw)
        states = {self.jobs[p].state for p in after}
        for jid in self.q.enqueue_many([spec] * n):
            j = self.jobs[jid] = MJob(
                jid, self.now + delay, ckey, climit, rkey, rate, max_attempts, within, after
            )
            if states & {"dead", "cancelled"}:
                j.state = "dead"
            elif states - {"done"}:
                j.state = "waiting"
        self.log.append(f"enqueue {n} {kw} delay={delay} max={max_attempts}")

    def claim(self) -> None:
        limit = self.rng.choice([20, 100, 300] if self.bulk else [1, 2, 4])
        lease = self.rng.choice([300, 3_000])
        # A claim may reap nothing (reap_limit 0): a lapsed lease then stays leased, its slot
        # free at once (lib/flow.lua flow_ck_live), and its worker may still settle it.
        reap = self.rng.choice([0, 100, 100, 10_000] if self.bulk else [0, 100, 100])
        self.reap(reap)
        self.adopt()
        before = {k: self.live(k) for k in KEYS}
        worker = self.rng.choice(["w1", "w2"])
        batch = self.q.claim(worker, limit=limit, lease_ms=lease, reap_limit=reap)
        self.log.append(f"claim limit={limit} lease={lease} -> {[c.id for c in batch.jobs]}")
        assert batch.now_ms == self.now
        if self.paused:
            assert batch.jobs == [], "claimed from a paused queue"
        for c in batch.jobs:
            if c.id not in self.jobs:  # a run this claim inserted (its schedule's next)
                assert c.id.startswith("schedule:"), c.id
                self.jobs[c.id] = self.occurrence(c.id)
            j = self.jobs[c.id]
            assert j.state == "due", f"{j.id} claimed while {j.state}: {self.log[-8:]}"
            assert j.run_at <= self.now, f"{j.id} claimed early: {self.log[-8:]}"
            if j.ckey is not None:
                assert before[j.ckey] < j.climit, (
                    f"{j.id} started with {before[j.ckey]} of key {j.ckey} leased, its limit "
                    f"{j.climit}: {self.log[-10:]}"
                )
                before[j.ckey] += 1
            if j.rkey is not None:
                self.starts[j.rkey].append(self.now)
                n, w = j.rate
                inside = sum(self.now - w < t <= self.now for t in self.starts[j.rkey])
                assert inside <= n, (
                    f"{j.id}: {inside} starts of {j.rkey} in {w} ms > {n}: "
                    f"{self.starts[j.rkey][-6:]} {self.log[-15:]}"
                )
            j.state, j.token, j.until = "leased", c.token, self.now + lease
            j.attempts += 1
        self.sync_states()

    def complete(self, lapsed_ok: bool) -> None:
        j = self.pick(("leased",))
        if j is None or (not lapsed_ok and j.until <= self.now):
            return
        # A lapsed lease not yet reaped is still the worker's (lib/lease.lua).
        assert self.q.complete_many([(j.id, j.token, None)]) == ["done"], self.log[-6:]
        self.log.append(f"complete {j.id} (until {j.until}, now {self.now})")
        j.completed += 1
        self.finished(j, "done")

    def complete_some(self) -> None:
        """Complete a random part of the live leases in one call (as a worker's batch)."""
        live = [j for j in self.jobs.values() if j.state == "leased" and j.until > self.now]
        some = [j for j in live if self.rng.random() < 0.6]
        if not some:
            return
        out = self.q.complete_many([(j.id, j.token, None) for j in some])
        assert out == ["done"] * len(some)
        for j in some:
            j.completed += 1
            self.finished(j, "done")
        self.log.append(f"complete {len(some)}")

    def stale(self) -> None:
        j = self.pick(("leased", "due", "done", "dead", "cancelled"))
        if j is None or not j.old_tokens:
            return
        token = self.rng.choice(j.old_tokens)
        before = self.q.counts()
        out = self.q.complete_many([(j.id, token, None)])
        self.log.append(f"stale complete {j.id} -> {out}")
        assert out[0] in ("stale", "done", "cancelled"), out
        if out[0] == "stale":
            after = self.q.counts()
            assert (before.due, before.leased, before.dead) == (
                after.due,
                after.leased,
                after.dead,
            )

    def fail(self) -> None:
        j = self.pick(("leased",))
        if j is None:
            return
        retryable = self.rng.random() < 0.7
        delay = self.rng.choice([0, 500])
        out = self.q.fail(j.id, j.token, ("E", "m", ""), retryable=retryable, delay_ms=delay)
        self.log.append(f"fail {j.id} retryable={retryable} -> {out.status}")
        j.old_tokens.append(j.token)
        if out.status == "dead" and out.dead_reason == "start deadline passed":
            assert j.start_within is not None
            self.finished(j, "dead")
        elif retryable and j.attempts < j.max_attempts:
            assert out.status == "retry"
            j.state, j.run_at = "due", self.now + delay
        else:
            assert out.status == "dead"
            self.finished(j, "dead")

    def heartbeat(self) -> None:
        j = self.pick(("leased",))
        if j is None:
            return
        lease = self.rng.choice([100, 5_000])
        _, out = self.q.heartbeat([(j.id, j.token)], lease_ms=lease)
        self.log.append(f"heartbeat {j.id} {lease} -> {out}")
        if j.until > self.now:
            assert out[j.id] == "held"
            j.until = self.now + lease
        else:
            assert out[j.id] == "expired"

    def release(self) -> None:
        j = self.pick(("leased",))
        if j is None:
            return
        assert self.q.release([(j.id, j.token)]) == ["released"]
        self.log.append(f"release {j.id}")
        j.old_tokens.append(j.token)
        j.state, j.run_at, j.attempts = "due", self.now, max(j.attempts - 1, 0)

    def cancel(self) -> None:
        j = self.pick(("due", "waiting", "leased", "done", "dead"))
        if j is None:
            return
        word = self.q.cancel(j.id)
        self.log.append(f"cancel {j.id} ({j.state}) -> {word}")
        if j.state in ("due", "leased", "waiting"):
            assert word in (
                ("held",) if j.state == "waiting" else ("due", "scheduled", "held", "leased")
            )
            if j.state == "leased":
                j.old_tokens.append(j.token)
            self.finished(j, "cancelled")
        else:
            assert word == j.state

    def reschedule(self) -> None:
        j = self.pick(("due", "waiting"))
        if j is None:
            return
        delay = self.rng.choice([0, 0, 700])
        word = self.q.reschedule(j.id, delay_ms=delay)
        self.log.append(f"reschedule {j.id} +{delay} -> {word}")
        if word == "rescheduled":
            assert j.state == "due", (j.id, j.state)
            j.run_at = self.now + delay
        else:
            assert word in ("held", "due", "schedule"), word

    def requeue(self) -> None:
        dead = [j for j in self.jobs.values() if j.state == "dead"]
        if not dead:
            return
        j = self.rng.choice(dead)
        assert self.q.requeue_dead([j.id]) == 1
        self.log.append(f"requeue {j.id}")
        j.run_at, j.attempts = self.now, 0
        # It waits again for those of its parents still waiting, due or leased (flow_rewait).
        j.parents = tuple(
            p for p in j.parents if self.jobs[p].state in ("due", "waiting", "leased")
        )
        j.state = "waiting" if j.parents else "due"

    def pause(self) -> None:
        if self.paused:
            self.q.resume()
        else:
            self.q.pause()
        self.paused = not self.paused
        self.log.append("pause" if self.paused else "resume")

    def schedule(self) -> None:
        """Define (or redefine), pause, resume or remove schedule s1: its runs share key `a`
        (limit 1) and rate key `r` with the enqueued jobs."""
        rng, q = self.rng, self.q
        if not self.schedules:
            return
        what = rng.choice(["define", "define", "pause", "resume", "remove"])
        if what == "define":
            every = rng.choice([500, 1_500])
            misfire = rng.choice(["skip", "run_once", "catch_up:2"])
            q.schedule("s1", "t", every_ms=every, misfire=misfire, concurrency_key="a",
                       concurrency_limit=1, rate_limit=RATES["r"][0], rate_key="r")  # fmt: skip
            self.sched = self.sched or "on"
            self.log.append(f"schedule s1 every {every} {misfire}")
        elif what == "pause" and self.sched:
            q.pause_schedule("s1")
            self.sched = "paused"
            self.log.append("pause s1")
        elif what == "resume" and self.sched:
            q.resume_schedule("s1")
            self.sched = "on"
            self.log.append("resume s1")
        elif what == "remove" and self.sched:
            q.remove_schedule("s1")
            self.sched = ""
            self.log.append("remove s1")
        self.adopt()
        self.sync_states()

    def tick(self) -> None:
        self.now += self.rng.choice([1, 100, 299, 301, 1_000, 2_500])
        self.clock.set_ms(self.now)
        self.log.append(f"tick -> {self.now}")

    # -- invariants ---------------------------------------------------------------------
    def check(self) -> None:
        self.adopt()
        c = self.q.client
        p = self.q.keys.prefix

        def members(key: str) -> set[str]:
            return {str(m) for m in c.zrange(key, 0, -1)}

        held, due = members(p + "flow:held"), members(self.q.keys.due)
        leased, rheld = members(self.q.keys.leased), members(p + "flow:rheld")
        ckheld = {k: members(p + "flow:ckheld:" + k) for k in KEYS}
        assert not (held & due) and not (held & leased), "a job both held and due/leased"
        waiting_set = members(p + "flow:waiting")
        parts = rheld.union(waiting_set, *ckheld.values())
        assert held == parts, f"flow:held {held} != its hold sets {parts}"
        # Doctor's flow key checks find nothing in a state the scripts made.
        issues = key_set_issues(c, self.q.keys, self.now)
        assert issues == [], (issues, self.log[-10:])
        counts = self.q.counts()
        assert counts.held_key_limit + counts.held_rate_window + counts.held_waiting == len(held)
        mw = {j.id for j in self.jobs.values() if j.state == "waiting"}
        assert mw <= waiting_set, (mw - waiting_set, self.log[-8:])
        # A parent's end reaches 300 children per script; the rest wait for the next claims'
        # steps (flow:ending), still waiting there though the model let them go.
        late = waiting_set - mw
        assert not late or c.zcard(p + "flow:ending") > 0, (late, self.log[-8:])
        assert counts.leased == sum(j.state == "leased" for j in self.jobs.values())
        if not self.bulk:
            # The listings agree: 'held' is flow:held, 'due' and 'scheduled' split due by now.
            listed = {j.id for j in self.q.list_jobs("held", limit=1_000)}
            assert listed == held, (listed ^ held, self.log[-6:])
            on_due = {j.id for j in self.q.list_jobs("due", limit=1_000)}
            later = {j.id for j in self.q.list_jobs("scheduled", limit=1_000)}
            assert on_due | later == due and not on_due & later, self.log[-6:]
            assert len(on_due) + len(held) == counts.due and len(later) == counts.scheduled
        waiting = {j.id for j in self.jobs.values() if j.state in ("due", "waiting")}
        assert due | held == waiting, f"due+held {due | held} != model's {waiting}"
        # A key whose jobs are held must have something that will let them go: a job of the
        # key leased (its end), due (its claim) or rate-held (its claim once its slot comes).
        for k, ids in ckheld.items():
            if not ids:
                continue
            movers = [
                j for j in self.jobs.values()
                if j.ckey == k and (j.state == "leased" or j.id in due or j.id in rheld)
            ]  # fmt: skip
            assert movers, f"key {k}: {sorted(ids)} held, nothing leased or due: {self.log[-12:]}"

    def step(self) -> None:
        ops = [
            (self.enqueue, 5),
            (self.claim, 5),
            (lambda: self.complete(False), 3),
            (lambda: self.complete(True), 1),
            (self.stale, 1),
            (self.fail, 2),
            (self.release, 1),
            (self.heartbeat, 2),
            (self.cancel, 1),
            (self.reschedule, 1),
            (self.requeue, 1),
            (self.pause, 1),
            (self.complete_some, 4 if self.bulk else 0),
            (self.schedule, 2),
            (self.tick, 4),
        ]
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        self.rng.choices(fns, weights)[0]()
        self.check()

    def drain(self) -> None:
        if self.paused:
            self.pause()
        if self.sched:
            self.q.remove_schedule("s1")
            self.sched = ""
            self.sync_states()
        for _ in range(1_500 if self.bulk else 300):
            self.now += 1_000 if self.bulk else 2_500
            self.clock.set_ms(self.now)
            self.claim()
            for j in list(self.jobs.values()):
                if j.state == "leased":
                    assert self.q.complete_many([(j.id, j.token, None)]) == ["done"]
                    j.completed += 1
                    self.finished(j, "done")
            self.check()
            if all(j.state in ("done", "cancelled", "dead") for j in self.jobs.values()):
                break
        for j in self.jobs.values():
            assert j.state in ("done", "cancelled", "dead"), f"{j.id} never ended ({j.state})"
            assert j.completed == (1 if j.state == "done" else 0)
            try:
                real = self.q.status(j.id).value
            except JobNotFound:  # a schedule's run withdrawn: its record deleted
                real = "cancelled" if j.id.startswith("schedule:") else "missing"
            assert real == j.state, (j.id, real, j.state)


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("FR3_SEEDS", "12"))))
@pytest.mark.parametrize("schedules", [False, True], ids=["jobs", "with-schedule"])
def test_flow_random_sequences_keep_limits_and_end_every_job(
    client: redis.Redis, seed: int, schedules: bool
) -> None:
    """Random sequences (fixed seeds) of the operations above: a failure names the broken
    invariant (a key over its limit, a rate window over its count, a job run early, a key's
    held jobs with nothing left to let them go, counts that disagree, a job never ended)."""
    run = Explorer(client, seed, schedules=schedules)
    try:
        for _ in range(120):
            run.step()
        run.drain()
    finally:
        delete_queue(client, run.q)


def test_a_real_worker_keeps_each_key_at_its_limit_through_retries(
    redis_url: str, q: Queue
) -> None:
    """The real worker (concurrency 6, prefetch on): two keys of limit 1 and one of limit 2,
    every job failing its first attempt (a retry at once): no key ever has more handlers
    running than its limit, every job ends done, nothing is left held."""
    registry = Registry()
    lock = threading.Lock()
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    done: list[str] = []

    @registry.task("flowjob")
    async def flowjob(payload: Any, ctx: Any) -> None:
        key = payload["k"]
        with lock:
            running[key] = running.get(key, 0) + 1
            most[key] = max(most.get(key, 0), running[key])
        try:
            await asyncio.sleep(0.01)
            if ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
        finally:
            with lock:
                running[key] -= 1
        with lock:
            done.append(ctx.job_id)

    limits = {"k1": 1, "k2": 1, "k3": 2}
    ids = [
        q.enqueue(
            "flowjob",
            {"k": k},
            concurrency_key=k,
            concurrency_limit=lim,
            priority=i % 3 * 4,
            backoff=Backoff(base_ms=1, factor=1, cap_ms=1),
        )
        for i in range(6)
        for k, lim in limits.items()
    ]

    def finished() -> bool:
        return len(done) == len(ids) and q.counts().leased == 0

    settings = WorkerSettings(queues=(q.name,), concurrency=6, heartbeat_ms=50, lease_ms=5_000)
    assert run_until(redis_url, registry, settings, finished, timeout_s=60)
    assert all(most[k] <= lim for k, lim in limits.items()), most
    assert [q.status(i).value for i in ids] == ["done"] * len(ids)
    assert q.counts().held == {"key_limit": 0, "rate_window": 0, "waiting": 0}


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("FR3_BULK_SEEDS", "2"))))
def test_flow_random_bulk_sequences_keep_limits_past_the_per_script_bounds(
    client: redis.Redis, seed: int
) -> None:
    """The same invariants with batches of hundreds of jobs and claims of up to 300: the
    per-script bounds (jobs set aside, held jobs let go, lapsed slots checked, leases reaped)
    cut in, and the rest must be done by later scripts, never lost nor over a limit."""
    run = Explorer(client, 1_000 + seed, bulk=True)
    try:
        for _ in range(60):
            run.step()
        run.drain()
    finally:
        delete_queue(client, run.q)
