"""Review: a stateful model of the job lifecycle interleaved with operator actions.

A hypothesis RuleBasedStateMachine drives the real scripts (test clock) of one queue with two
workers: enqueue (delay, run_at, idempotency key, chosen id, priority, max_attempts, backoff),
claim, heartbeat, complete, fail, release, lease lapse by moving the clock; and what an operator
does through the API, the CLI and the dashboard: cancel (each state), requeue dead and purge
dead (by id, and by the CLI's --older-than / --task / --error-type filters), dead retention
(the count and age trim), pause / resume, reschedule and the dashboard's run-now, counts,
list_jobs, dead_ids paging, status, get_job, result, and the `scheduler stats` counters.

tests/test_model.py checks exact replies of a single worker's calls without priorities, chosen
ids, purge or retention; this machine checks the places instead, after every step:
- each job is in exactly one place (due, leased, dead, finished, or gone) and it is the model's;
- counts() equal the sizes of the places; list_jobs(state) lists exactly each place, in its
  documented order; the per-minute outcome counters sum to the model's;
- status() / get_job() / result() report the place; attempts <= max_attempts;
- no job is claimed before its run_at (server clock), nor while the queue is paused, nor after
  it was cancelled; claim fills the batch and respects priority;
- a stale token's complete / fail / release / heartbeat is refused and changes nothing."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from scheduler import (
    Backoff,
    JobCancelled,
    JobDead,
    JobNotFound,
    JobState,
    Queue,
    StaleToken,
)
from scheduler.core.flow import DEFAULT_PRIORITY_AGING_MS
from scheduler.core.vocabulary import STAT_FIELDS
from scheduler.operations.browsing import minute_series
from tests.conftest import Clock, delete_queue, dump_queue

START_MS = 1_000_000
AGING_MS = DEFAULT_PRIORITY_AGING_MS
WORKERS = ("w1", "w2")
BACKOFFS = [Backoff(base_ms=1_000, factor=2.0, cap_ms=8_000, jitter=0.0),
            Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0)]  # fmt: skip
CHOSEN_IDS = ("J-a", "J-b")
TTL_366D = 366 * 24 * 3600 * 1000


@dataclass
class MJob:
    id: str
    run_at: int
    max_attempts: int
    backoff: Backoff
    prio: int
    task: str = "t"
    state: str = "due"  # due | leased | dead | done | cancelled | gone
    attempts: int = 0
    lapses: int = 0
    fence: int = 0
    token: str | None = None
    worker: str | None = None
    until: int = 0
    dead_reason: str | None = None
    error_type: str | None = None
    finished_ms: int = 0
    result: Any = None
    settled_token: str | None = None
    settled: str | None = None
    settled_log: list[tuple[str, str | None]] = field(default_factory=list)


def rank(j: MJob, now: int) -> tuple[int, int, int]:
    """Claim order (docs/flow-control.md): aged first by run_at, then priority, then run_at."""
    if j.run_at <= now - AGING_MS:
        return (1, 0, -j.run_at)
    return (0, j.prio, -j.run_at)


class Model:
    def __init__(self) -> None:
        self.jobs: dict[str, MJob] = {}
        self.dead: dict[str, int] = {}  # id -> dead score
        self.keys: dict[str, str] = {}
        self.paused_ms: int | None = None
        self.max_count: int | None = None
        self.max_age: int | None = None
        self.cancelled_ever: set[str] = set()
        # The outcome counters of `scheduler stats` (lua/lib/util.lua bump_stat), all minutes.
        self.stats: Counter[str] = Counter()

    def live(self, state: str) -> list[MJob]:
        return [j for j in self.jobs.values() if j.state == state]

    def trim(self, now: int) -> None:
        if self.max_count is None and self.max_age is None:
            return
        order = sorted(self.dead, key=lambda d: (self.dead[d], d))
        drop: list[str] = []
        if self.max_count is not None:
            drop = order[: max(len(order) - self.max_count, 0)]
        if self.max_age is not None:
            drop += [d for d in order if d not in drop and self.dead[d] < now - self.max_age]
        for d in drop:
            del self.dead[d]
            self.jobs[d].state = "gone"
        self.stats["dead_trimmed"] += len(drop)

    def park(self, j: MJob, reason: str, now: int) -> None:
        top = max(self.dead.values(), default=None)
        score = top + 1 if top is not None and now < top <= now + TTL_366D else now
        j.state, j.dead_reason, j.worker = "dead", reason, None
        self.dead[j.id] = score
        self.stats["dead"] += 1
        self.trim(now)

    def check(self, j: MJob | None, token: str) -> tuple[str, str | None]:
        if j is None or j.state == "gone":
            return "missing", None
        if j.settled_token == token:
            return "settled", j.settled
        for logged, outcome in j.settled_log:
            if logged == token:
                return "settled", outcome
        if j.token != token:
            return "stale", None
        if j.state == "cancelled":
            return "cancelled", None
        if j.state != "leased":
            return "stale", None
        return "held", None


class AdminMachine(RuleBasedStateMachine):
    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        self.q = Queue(client, "ra-" + uuid.uuid4().hex[:12], _clock="test")
        self.clock = Clock(client, self.q)
        self.now = START_MS
        self.clock.set_ms(self.now)
        self.m = Model()
        self.ids: list[str] = []
        self.tokens: list[tuple[str, str]] = []
        self.n = 0
        self.alone: dict[str, str] = {}  # worker -> the last-attempt suspect it was leased alone

    def teardown(self) -> None:
        delete_queue(self.client, self.q)

    # -- helpers ---------------------------------------------------------------------------
    def pick(self, i: int) -> MJob | None:
        if not self.ids:
            return None
        return self.m.jobs[self.ids[-1 - i % len(self.ids)]]

    def pick_in(self, states: tuple[str, ...], i: int) -> MJob | None:
        js = [j for j in self.m.jobs.values() if j.state in states]
        return js[i % len(js)] if js else None

    def pick_token(self, i: int) -> tuple[str, str] | None:
        if not self.tokens:
            return None
        return self.tokens[-1 - i % len(self.tokens)]

    def snapshot(self) -> dict[str, object]:
        # Not the counters, nor the claim replay records (they expire by the wall clock).
        return {k: v for k, v in dump_queue(self.client, self.q).items()
                if ":stats:" not in k and ":claim:" not in k}  # fmt: skip

    def live_token(self, t: tuple[str, str]) -> bool:
        j = self.m.jobs.get(t[0])
        return j is not None and j.state == "leased" and j.token == t[1]

    def settle(self, j: MJob, token: str, outcome: str) -> None:
        j.settled_token, j.settled = token, outcome

    # -- producers -------------------------------------------------------------------------
    @rule(
        when=st.sampled_from(["now", "delay", "at_past", "at_future", "delay_long"]),
        key=st.sampled_from([None, None, None, "k1", "k2"]),
        chosen=st.sampled_from([None, None, None, 0, 1]),
        prio=st.sampled_from([0, 0, 5, 9]),
        max_attempts=st.integers(1, 3),
        b=st.integers(0, len(BACKOFFS) - 1),
        task=st.sampled_from(["t", "u"]),
    )
    def enqueue(
        self,
        when: str,
        key: str | None,
        chosen: int | None,
        prio: int,
        max_attempts: int,
        b: int,
        task: str = "t",
    ) -> None:
        kw: dict[str, Any] = {}
        run_at = self.now
        if when == "delay":
            kw["delay_ms"], run_at = 3_000, self.now + 3_000
        elif when == "delay_long":
            kw["delay_ms"], run_at = 90_000, self.now + 90_000
        elif when == "at_past":
            run_at = self.now - 5_000
            kw["run_at"] = datetime.fromtimestamp(run_at / 1000, UTC)
        elif when == "at_future":
            run_at = self.now + 7_000
            kw["run_at"] = datetime.fromtimestamp(run_at / 1000, UTC)
        job_id = CHOSEN_IDS[chosen] if chosen is not None and key is None else None
        self.n += 1
        got = self.q.enqueue(task, {"n": self.n}, key=key, job_id=job_id, priority=prio,
                             max_attempts=max_attempts, backoff=BACKOFFS[b], **kw)  # fmt: skip
        m = self.m
        if key is not None and key in m.keys:
            assert got == m.keys[key], "a taken key answers its first job"
            return
        if job_id is not None:
            assert got == job_id
            old = m.jobs.get(job_id)
            if old is not None and old.state != "gone":
                return  # already there: nothing written
        m.jobs[got] = MJob(got, run_at, max_attempts, BACKOFFS[b], prio, task)
        if key is not None:
            m.keys[key] = got
        if got in self.ids:
            self.ids.remove(got)
        self.ids.append(got)

    @initialize(specs=st.lists(st.tuples(st.sampled_from([0, 0, 5, 9]), st.integers(1, 3)),
                               min_size=2, max_size=6))  # fmt: skip
    def some_jobs(self, specs: list[tuple[int, int]]) -> None:
        """A few jobs due now first, so that the other rules have something to act on."""
        for prio, max_attempts in specs:
            self.enqueue("now", None, None, prio, max_attempts, 0)

    # -- workers ---------------------------------------------------------------------------
    @rule(w=st.sampled_from(WORKERS), limit=st.sampled_from([1, 2, 3, 0]),
          lease_ms=st.sampled_from([10_000, 30_000]))  # fmt: skip
    def claim(self, w: str, limit: int, lease_ms: int) -> None:
        m, now = self.m, self.now
        # The reaper first: lapsed leases by (until, id).
        for j in sorted(m.live("leased"), key=lambda x: (x.until, x.id)):
            if j.until > now:
                continue
            m.stats["expired"] += 1
            if j.attempts >= j.max_attempts:
                m.park(j, "lease expired", now)
            else:
                j.state, j.run_at, j.lapses, j.worker = "due", j.until, j.lapses + 1, None
        m.trim(now)
        eligible = [j for j in m.live("due") if j.run_at <= now]
        # A worker holding a suspect on its last attempt runs it alone: leased nothing more.
        mine = m.jobs.get(self.alone.get(w, ""))
        frozen = mine is not None and mine.state == "leased" and mine.worker == w
        batch = self.q.claim(w, limit=limit, lease_ms=lease_ms)
        assert batch.now_ms == now
        got_ids = [c.id for c in batch.jobs]
        assert len(got_ids) <= limit and len(set(got_ids)) == len(got_ids)
        if frozen:
            assert got_ids == [], f"{w} holds a last-attempt suspect and was leased more"
        # One leased on its last attempt after a lapse is the call's only job.
        alone = [c.id for c in batch.jobs if c.id == batch.suspect and c.attempts >= c.max_attempts]
        if alone:
            assert got_ids == alone, f"a last-attempt suspect leased beside {got_ids}"
            self.alone[w] = alone[0]
        if m.paused_ms is not None:
            assert got_ids == [], "a paused queue leased jobs"
        for c in batch.jobs:
            got_j = m.jobs.get(c.id)
            assert got_j is not None, f"{c.id} claimed, never enqueued"
            j = got_j
            assert j.state == "due", f"{c.id} claimed from state {j.state}"
            assert c.id not in m.cancelled_ever, f"cancelled job {c.id} ran again"
            assert j.run_at <= now, f"{c.id} claimed at {now}, before its run_at {j.run_at}"
            j.attempts += 1
            j.fence += 1
            assert c.attempts == j.attempts, c.id
            assert j.attempts <= j.max_attempts
            if j.settled_token is not None and (
                not j.settled_log or j.settled_log[0][0] != j.settled_token
            ):
                j.settled_log = [(j.settled_token, j.settled), *j.settled_log][:8]
            j.state, j.token, j.worker, j.until = "leased", c.token, w, now + lease_ms
            self.tokens.append((c.id, c.token))
        m.stats["claim"] += len(got_ids)
        left = [j for j in eligible if j.id not in got_ids]
        if m.paused_ms is None and len(got_ids) < limit and not (frozen or alone):
            # Only a suspect (a job whose lease lapsed) may be passed over: one per worker.
            for j in left:
                assert j.lapses >= 1, f"{j.id} due at {j.run_at}, left out of a short batch"
        for j in left:
            if j.lapses >= 1:  # a suspect passed over is re-scored to now (lua/claim.lua)
                score = self.client.zscore(self.q.keys.due, j.id)
                assert score is not None and int(score) in (j.run_at, now), j.id
                j.run_at = int(score)
        claimed = [m.jobs[i] for i in got_ids if m.jobs[i].lapses == 0]
        plain_left = [j for j in left if j.lapses == 0]
        if claimed and plain_left and m.paused_ms is None:
            worst = min(rank(j, now) for j in claimed)
            best = max(rank(j, now) for j in plain_left)
            assert worst >= best, f"{plain_left} outranks a claimed job"

    @rule(w=st.sampled_from(WORKERS), limit=st.sampled_from([2, 3]),
          ms=st.sampled_from([0, 1_000, 3_000, 8_000, 31_000]))  # fmt: skip
    def later_claim(self, w: str, limit: int, ms: int) -> None:
        """A worker polling again later: the most frequent pair of calls (hypothesis draws
        every rule equally often)."""
        self.tick(ms)
        self.claim(w, limit, 30_000)

    def live_index(self, i: int) -> int | None:
        live = [n for n, t in enumerate(self.tokens) if self.live_token(t)]
        return len(self.tokens) - 1 - live[i % len(live)] if live else None

    @rule(i=st.integers(0, 5), outcome=st.sampled_from(["complete", "complete", "fail", "fail0"]))
    def work(self, i: int, outcome: str) -> None:
        """A held lease ends: completed, or failed (its backoff, or retried at once)."""
        n = self.live_index(i)
        if n is None:
            return
        if outcome == "complete":
            self.complete(n)
        else:
            self.fail(n, True, None if outcome == "fail" else 0)

    @rule(i=st.integers(0, 30), lease_ms=st.sampled_from([10_000, 30_000]))
    def heartbeat(self, i: int, lease_ms: int) -> None:
        t = self.pick_token(i)
        if t is None:
            return
        j = self.m.jobs[t[0]]
        status, _ = self.m.check(j, t[1])
        before = self.snapshot()
        until, statuses = self.q.heartbeat([t], lease_ms=lease_ms)
        assert until == self.now + lease_ms
        expected = {"settled": "missing"}.get(status, status)
        if status == "held":
            if j.until <= self.now:
                expected = "expired"
            else:
                j.until = self.now + lease_ms
        assert statuses[t[0]] == expected, (t, j)
        if expected != "held":
            assert self.snapshot() == before, "refused heartbeat wrote"

    @rule(i=st.integers(0, 30))
    def complete(self, i: int) -> None:
        t = self.pick_token(i)
        if t is None:
            return
        j = self.m.jobs[t[0]]
        status, outcome = self.m.check(j, t[1])
        before = None if status == "held" else self.snapshot()
        got = self.q.complete_many([(t[0], t[1], {"r": t[1]})])
        if status == "held":
            assert got == ["done"]
            j.state, j.worker, j.result = "done", None, {"r": t[1]}
            j.finished_ms = self.now
            self.m.stats["done"] += 1
            self.settle(j, t[1], "done")
            return
        if status == "settled":
            assert got == ["done" if outcome == "done" else "stale"], (t, j)
        else:
            assert got == [status], (t, j)
        assert before is not None and self.snapshot() == before, "refused complete wrote"

    @rule(i=st.integers(0, 30), retryable=st.sampled_from([True, True, False]),
          delay=st.sampled_from([None, None, 0, 2_500]),
          etype=st.sampled_from(["E", "F"]))  # fmt: skip
    def fail(self, i: int, retryable: bool, delay: int | None, etype: str = "E") -> None:
        t = self.pick_token(i)
        if t is None:
            return
        m, now = self.m, self.now
        j = m.jobs[t[0]]
        status, outcome = m.check(j, t[1])
        before = None if status == "held" else self.snapshot()
        try:
            out = self.q.fail(t[0], t[1], (etype, "boom", ""), retryable=retryable, delay_ms=delay)
            got: tuple[str, Any] = (
                out.status, out.run_at_ms if out.status == "retry" else out.dead_reason
            )  # fmt: skip
        except StaleToken:
            got = ("stale", None)
        except JobCancelled:
            got = ("cancelled", None)
        except JobNotFound:
            got = ("missing", None)
        if status == "held":
            j.error_type = etype
            m.stats["fail"] += 1
            if not retryable or j.attempts >= j.max_attempts:
                reason = "non-retryable error" if not retryable else "attempts exhausted"
                assert got == ("dead", reason)
                self.settle(j, t[1], "dead:" + reason)
                m.park(j, reason, now)
            else:
                run_at = now + (j.backoff.delay_ms(j.attempts) if delay is None else delay)
                assert got == ("retry", run_at)
                m.stats["retry"] += 1
                j.state, j.run_at, j.worker = "due", run_at, None
                self.settle(j, t[1], f"retry:{run_at}")
            return
        if status == "settled":
            kind, _, detail = (outcome or "").partition(":")
            want: tuple[str, Any] = ("stale", None)
            if kind == "retry":
                want = ("retry", int(detail))
            elif kind == "dead":
                want = ("dead", detail)
            assert got == want, (t, j)
        else:
            assert got == (status, None), (t, j)
        assert before is not None and self.snapshot() == before, "refused fail wrote"

    @rule(i=st.integers(0, 30))
    def release(self, i: int) -> None:
        t = self.pick_token(i)
        if t is None:
            return
        j = self.m.jobs[t[0]]
        status, outcome = self.m.check(j, t[1])
        before = None if status == "held" else self.snapshot()
        got = self.q.release([t])
        if status == "held":
            assert got == ["released"]
            self.m.stats["release"] += 1
            j.state, j.run_at, j.worker = "due", self.now, None
            j.attempts = max(j.attempts - 1, 0)
            self.settle(j, t[1], "released")
            return
        if status == "settled":
            assert got == ["released" if outcome == "released" else "stale"], (t, j)
        else:
            assert got == [status], (t, j)
        assert before is not None and self.snapshot() == before, "refused release wrote"

    @rule(ms=st.sampled_from([1, 999, 3_000, 10_000, 31_000, 61_000]))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.clock.set_ms(self.now)

    # -- operators -------------------------------------------------------------------------
    @rule(i=st.integers(0, 30), by_state=st.sampled_from([None, "due", "leased", "dead", "done"]))
    def cancel(self, i: int, by_state: str | None) -> None:
        j = self.pick(i) if by_state is None else self.pick_in((by_state,), i)
        if j is None:
            return
        now = self.now
        try:
            got = self.q.cancel(j.id)
        except JobNotFound:
            got = "missing"
        if j.state == "gone":
            assert got == "missing"
            return
        if j.state in ("due", "leased"):
            want = j.state if j.state == "leased" or j.run_at <= now else "scheduled"
            assert got == want, j
            j.state, j.worker, j.finished_ms = "cancelled", None, now
            self.m.cancelled_ever.add(j.id)
            self.m.stats["cancel"] += 1
        else:
            assert got == j.state, j

    @rule(i=st.integers(0, 30), dead_pick=st.booleans())
    def requeue_dead(self, i: int, dead_pick: bool) -> None:
        j = self.pick_in(("dead",), i) if dead_pick else self.pick(i)
        if j is None:
            return
        got = self.q.requeue_dead([j.id])
        if j.state == "dead":
            assert got == 1
            del self.m.dead[j.id]
            j.state, j.run_at, j.attempts, j.lapses, j.dead_reason = "due", self.now, 0, 0, None
            self.m.stats["requeue_dead"] += 1
        else:
            assert got == 0, j

    @rule(older=st.sampled_from([None, 0, 5_000, 40_000]), purge=st.booleans(),
          task=st.sampled_from([None, "u"]), etype=st.sampled_from([None, None, "F"]))  # fmt: skip
    def dead_filtered(
        self, older: int | None, purge: bool, task: str | None, etype: str | None
    ) -> None:
        """The CLI's `dead requeue|purge --older-than --task --error-type`: dead_ids with the
        filters, then act on those ids."""
        m = self.m
        ids = self.q.dead_ids(older_than_ms=older, task=task, error_type=etype)
        want = sorted((d for d in m.dead
                       if (older is None or m.dead[d] <= self.now - older)
                       and task in (None, m.jobs[d].task)
                       and etype in (None, m.jobs[d].error_type)),
                      key=lambda d: (m.dead[d], d), reverse=True)  # fmt: skip
        assert ids == want, (older, task, etype)
        got = self.q.purge_dead(ids) if purge else self.q.requeue_dead(ids)
        assert got == len(ids)
        for d in ids:
            del m.dead[d]
            j = m.jobs[d]
            if purge:
                j.state = "gone"
            else:
                m.stats["requeue_dead"] += 1
                j.state, j.run_at, j.attempts, j.lapses, j.dead_reason = (
                    "due", self.now, 0, 0, None
                )  # fmt: skip

    @rule(i=st.integers(0, 30), dead_pick=st.booleans())
    def purge_dead(self, i: int, dead_pick: bool) -> None:
        j = self.pick_in(("dead",), i) if dead_pick else self.pick(i)
        if j is None:
            return
        before = None if j.state == "dead" else self.snapshot()
        got = self.q.purge_dead([j.id])
        if j.state == "dead":
            assert got == 1
            del self.m.dead[j.id]
            j.state = "gone"
        else:
            assert got == 0, j
            assert before is not None and self.snapshot() == before, "purge of a live job wrote"

    @rule(max_count=st.sampled_from([None, None, 0, 1, 2]),
          max_age=st.sampled_from([None, None, 20_000]))  # fmt: skip
    def retention(self, max_count: int | None, max_age: int | None) -> None:
        self.q.set_dead_retention(max_age_ms=max_age, max_count=max_count)
        self.m.max_count, self.m.max_age = max_count, max_age

    @rule(pause=st.sampled_from([False, False, True]))
    def pause_resume(self, pause: bool) -> None:
        if pause:
            assert self.q.pause() == ("already" if self.m.paused_ms is not None else "paused")
            if self.m.paused_ms is None:
                self.m.paused_ms = self.now
        else:
            assert self.q.resume() == ("active" if self.m.paused_ms is None else "resumed")
            self.m.paused_ms = None

    @rule(i=st.integers(0, 30), delay=st.sampled_from([0, 0, 4_000, 120_000]),
          waiting=st.booleans())  # fmt: skip
    def reschedule(self, i: int, delay: int, waiting: bool) -> None:
        j = self.pick_in(("due",), i) if waiting else self.pick(i)
        if j is None:
            return
        try:
            got = self.q.reschedule(j.id, delay_ms=delay)
        except JobNotFound:
            got = "missing"
        if j.state == "due":
            assert got == "rescheduled"
            j.run_at = self.now + delay
        else:
            assert got == {"gone": "missing"}.get(j.state, j.state), j

    @rule(i=st.integers(0, 30))
    def run_now(self, i: int) -> None:
        """The dashboard's "run now" (ops.run_now): a job due later moves to now."""
        j = self.pick_in(("due",), i)
        if j is None:
            return
        got = self.q._run(self.q.ops.run_now(j.id))
        if j.run_at > self.now:
            assert got == "rescheduled"
            j.run_at = self.now
        else:
            assert got == "due"

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def places(self) -> None:
        m, k, now = self.m, self.q.keys, self.now

        def scored(key: str) -> dict[str, int]:
            pairs: Any = self.client.zrange(key, 0, -1, withscores=True)
            return {i: int(s) for i, s in pairs}

        due, leased, dead = scored(k.due), scored(k.leased), scored(k.dead)
        finished = set(scored(k.finished))
        places: list[set[str]] = [set(due), set(leased), set(dead), finished]
        for a in range(4):
            for b in range(a + 1, 4):
                assert not places[a] & places[b], f"a job in two places: {places[a] & places[b]}"
        assert due == {j.id: j.run_at for j in m.live("due")}
        assert leased == {j.id: j.until for j in m.live("leased")}
        assert dead == m.dead
        assert finished == {j.id for j in m.jobs.values() if j.state in ("done", "cancelled")}

        counts = self.q.counts()
        assert counts.now_ms == now
        assert counts.due == sum(s <= now for s in due.values())
        assert counts.scheduled == sum(s > now for s in due.values())
        assert (counts.leased, counts.dead) == (len(leased), len(dead))
        assert counts.lapsed == sum(u <= now for u in leased.values())
        ready = [s for s in due.values() if s <= now]
        assert counts.oldest_due_ms == (min(ready) if ready else None)
        assert counts.paused_ms == m.paused_ms

        def listed(state: str) -> list[str]:
            return [j.id for j in self.q.list_jobs(state, limit=1000)]

        by_score = sorted(due.items(), key=lambda kv: (kv[1], kv[0]))
        assert listed("due") == [i for i, s in by_score if s <= now]
        assert listed("scheduled") == [i for i, s in by_score if s > now]
        assert listed("leased") == sorted(leased, key=lambda i: (leased[i], i))
        assert listed("dead") == sorted(dead, key=lambda d: (dead[d], d), reverse=True)
        # Latest to expire first: all are kept as long (1 h), so the latest finished first.
        ended = [j for j in m.jobs.values() if j.state in ("done", "cancelled")]
        assert listed("finished") == [
            j.id for j in sorted(ended, key=lambda j: (j.finished_ms, j.id), reverse=True)
        ]
        # The dead list paged two at a time is the whole list.
        paged = [i for o in range(0, len(dead) + 2, 2) for i in self.q.dead_ids(offset=o, limit=2)]
        assert paged == listed("dead")

        series = self.q._run(minute_series(k, now, 120))
        totals = {f: sum(row[f] for row in series) for f in STAT_FIELDS}
        want = {f: m.stats[f] for f in STAT_FIELDS}
        assert totals == want

    @invariant()
    def reports(self) -> None:
        m, now = self.m, self.now
        jobs = {j.id: j for j in self.q._run(self.q.ops.get_jobs(self.ids))}
        for jid in self.ids:
            mj = m.jobs[jid]
            if mj.state == "gone":
                assert jid not in jobs, f"{jid} purged, still readable"
                with pytest.raises(JobNotFound):
                    self.q.status(jid)
                continue
            j = jobs[jid]
            want = mj.state
            if want == "due" and mj.run_at > now:
                want = "scheduled"
            assert j.state == want, (jid, j.state, mj)
            assert j.attempts is not None and j.max_attempts is not None
            assert j.attempts == mj.attempts, (jid, j.attempts, mj)
            assert j.attempts <= j.max_attempts == mj.max_attempts
            if mj.state == "dead":
                assert j.fields.get("dead_reason") == mj.dead_reason
        # status() and result() of a few: the newest, which the rules act on most.
        for jid in self.ids[-3:]:
            mj = m.jobs[jid]
            if mj.state == "gone":
                continue
            st_want = mj.state if mj.state != "due" or mj.run_at <= now else "scheduled"
            assert self.q.status(jid) == JobState(st_want), (jid, mj)
            if mj.state == "done":
                assert self.q.result(jid, timeout_s=0.05) == mj.result
            elif mj.state == "cancelled":
                with pytest.raises(JobCancelled):
                    self.q.result(jid, timeout_s=0.05)
            elif mj.state == "dead":
                with pytest.raises(JobDead):
                    self.q.result(jid, timeout_s=0.05)


@pytest.mark.slow
def test_admin_lifecycle_model(client: redis.Redis) -> None:
    run_state_machine_as_test(
        lambda: AdminMachine(client),  # type: ignore[arg-type]  # a factory, as documented
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
