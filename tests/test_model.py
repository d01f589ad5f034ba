"""Property-based test: random sequences of API calls and clock moves, run against the real
scripts (with the test clock) and against a small reference model (the seed design's toy model,
extended: attempts counted at claim, dead-letter on exhausted attempts including lapsed leases,
backoff with jitter=0, release, cancel, requeue_dead, settled-answer replay, pausing the whole
queue (claims lease nothing, the reaper still runs), moving a waiting job's run time
(reschedule), and the suspects a lapse makes (one per worker; one on its last attempt alone, its
worker leased nothing else meanwhile; docs/durability.md)). After every step
the observable outcomes must agree: returned values, claimed ids and their order, every job's
state and attempts, the due / leased sets with their scores, the dead list, and the counts.
A call refused for bad arguments must change nothing."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import Backoff, BadArgument, JobCancelled, JobNotFound, Queue, StaleToken
from tests.conftest import Clock, delete_queue, dump_queue

BACKOFFS = [Backoff(base_ms=1_000, factor=2.0, cap_ms=8_000, jitter=0.0),
            Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0),
            Backoff(base_ms=3_000, factor=3.0, cap_ms=20_000, jitter=0.0)]  # fmt: skip
REAP_LIMIT = 100
START_MS = 1_000_000


@dataclass
class MJob:
    id: str
    max_attempts: int
    backoff: Backoff
    state: str = "due"
    attempts: int = 0
    fence: int = 0
    token: str | None = None
    settled_token: str | None = None
    settled: str | None = None
    dead_reason: str | None = None
    # Earlier settlements, newest first (lua/lib/lease.lua log_settlement): claim moves the last
    # one here before a new lease can overwrite it, so a re-sent call still gets its answer.
    settled_log: list[tuple[str, str | None]] = field(default_factory=list)
    lapses: int = (
        0  # leases the reaper ended (lua/claim.lua: 2, or 1 on the last attempt, a suspect)
    )
    claimed_ms: int = 0


class Model:
    """The reference: plain dicts, time passed in. Scores tie-break by id, as a Redis ZSET."""

    def __init__(self) -> None:
        self.jobs: dict[str, MJob] = {}
        self.due: dict[str, int] = {}
        self.leased: dict[str, int] = {}
        self.dead: dict[str, int] = {}  # id -> dead_ms, as the dead ZSET
        self.keys: dict[str, str] = {}
        self.paused_ms: int | None = None  # Queue.pause: claims lease nothing until resume
        # The suspect worker "w" leased last (claim.lua's `isolated`), and whether it was on its
        # last attempt (then it runs alone); it counts while that job is leased.
        self.isolated: tuple[str, bool] | None = None

    def _dead_letter(self, jid: str, reason: str, now: int) -> None:
        self.due.pop(jid, None)
        self.leased.pop(jid, None)
        self.jobs[jid].state, self.jobs[jid].dead_reason = "dead", reason
        self.dead[jid] = now

    def enqueue(self, real_id: str, now: int, delay_ms: int, max_attempts: int,
                key: str | None, backoff: Backoff) -> str:  # fmt: skip
        if key is not None and key in self.keys:
            return self.keys[key]
        assert real_id not in self.jobs
        self.jobs[real_id] = MJob(real_id, max_attempts, backoff)
        self.due[real_id] = now + delay_ms
        if key is not None:
            self.keys[key] = real_id
        return real_id

    def claim(self, now: int, limit: int, lease_ms: int) -> tuple[list[tuple[str, int]], int]:
        lapsed = sorted((until, jid) for jid, until in self.leased.items() if until <= now)
        for until, jid in lapsed[: REAP_LIMIT + 1]:  # ZRANGE ... LIMIT 0 n returns n items
            j = self.jobs[jid]
            if j.attempts >= j.max_attempts:
                self._dead_letter(jid, "lease expired", now)
            else:
                del self.leased[jid]
                self.due[jid] = until
                j.state = "due"
                j.lapses += 1
        out: list[tuple[str, int]] = []
        skipped: list[str] = []
        frozen = older = False
        held = self.isolated if self.isolated and self.isolated[0] in self.leased else None
        since = self.jobs[held[0]].claimed_ms if held else None
        if limit > 0 and self.paused_ms is None:
            # A worker holding a last-attempt suspect is leased nothing (docs/durability.md).
            frozen = held is not None and held[1]
            taken: str | None = None
            final_taken = False
            ready = sorted((s, jid) for jid, s in self.due.items() if s <= now)
            for score, jid in [] if frozen else ready:
                if len(out) == limit or final_taken:
                    break
                j = self.jobs[jid]
                if j.attempts >= j.max_attempts:
                    self._dead_letter(jid, "attempts exhausted", now)
                    continue
                suspect = j.lapses >= 2 or (j.lapses >= 1 and j.attempts + 1 >= j.max_attempts)
                final = suspect and j.attempts + 1 >= j.max_attempts
                # One suspect per worker; one on its last attempt only as a call's first job.
                if (final and (out or taken)) or (suspect and (taken or held)):
                    skipped.append(jid)
                    self.due[jid] = max(now, score)
                    older = older or (since is not None and score < since)
                    continue
                if j.settled_token is not None and (
                    not j.settled_log or j.settled_log[0][0] != j.settled_token
                ):
                    j.settled_log = [(j.settled_token, j.settled), *j.settled_log][:8]
                j.attempts += 1
                j.fence += 1
                j.state = "leased"
                j.claimed_ms = now
                del self.due[jid]
                self.leased[jid] = now + lease_ms
                out.append((jid, j.fence))
                taken = jid if suspect else taken
                final_taken = final
            if taken is not None:
                self.isolated = (taken, final_taken)
        return out, self._next_ms(now, out, skipped, frozen, older, since)

    def _next_ms(self, now: int, out: list[Any], skipped: list[str], frozen: bool,
                 older: bool, since: int | None) -> int:  # fmt: skip
        """claim.lua's next_ms: the due head past the suspects this worker may not take; none
        taken, at most SUSPECT_POLL_MS ahead (sooner at the first job due later)."""
        order = sorted((s, jid) for jid, s in self.due.items())
        nxt, head = -1, None
        if self.paused_ms is not None:  # the due head is no reason to come back
            pass
        elif (skipped or frozen) and not out:
            if older and order and since is not None and order[0][0] < since:
                head = order[0][0]
            else:
                nxt = now + 1000
                head = next((s for s, _ in order if s > now), None)
        elif skipped:
            head = next((s for s, jid in order[: len(skipped) + 1] if jid not in skipped), None)
        elif order:
            head = order[0][0]
        for t in (head, min(self.leased.values()) if self.leased else None):
            if t is not None and (nxt == -1 or t < nxt):
                nxt = t
        return nxt

    def pause(self, now: int) -> str:
        if self.paused_ms is not None:
            return "already"
        self.paused_ms = now
        return "paused"

    def resume(self) -> str:
        if self.paused_ms is None:
            return "active"
        self.paused_ms = None
        return "resumed"

    def reschedule(self, now: int, jid: str, delay_ms: int) -> str:
        j = self.jobs.get(jid)
        if j is None:
            return "missing"
        if jid not in self.due:
            return j.state
        self.due[jid] = now + delay_ms
        return "rescheduled"

    def check(self, jid: str, token: str) -> tuple[str, str | None]:
        j = self.jobs.get(jid)
        if j is None:
            return "missing", None
        if j.settled_token == token:
            return "settled", j.settled
        for logged_token, outcome in j.settled_log:
            if logged_token == token:
                return "settled", outcome
        if j.token != token:
            return "stale", None
        if j.state == "cancelled":
            return "cancelled", None
        if j.state != "leased":
            return "stale", None
        return "held", None

    def heartbeat(self, now: int, jid: str, token: str, lease_ms: int) -> str:
        status, _ = self.check(jid, token)
        if status == "settled":
            return "missing"
        if status == "held":
            if self.leased[jid] <= now:
                return "expired"
            self.leased[jid] = now + lease_ms
        return status

    def _settle(self, j: MJob, token: str, outcome: str) -> None:
        j.settled_token, j.settled = token, outcome

    def complete(self, jid: str, token: str) -> str:
        status, outcome = self.check(jid, token)
        if status == "settled":
            return "done" if outcome == "done" else "stale"
        if status == "held":
            j = self.jobs[jid]
            del self.leased[jid]
            j.state = "done"
            self._settle(j, token, "done")
            return "done"
        return status

    def fail(self, now: int, jid: str, token: str, retryable: bool,
             delay_ms: int | None) -> tuple[str, Any]:  # fmt: skip
        status, outcome = self.check(jid, token)
        if status == "settled":
            kind, _, detail = (outcome or "").partition(":")
            if kind == "retry":
                return "retry", int(detail)
            return ("dead", detail) if kind == "dead" else ("stale", None)
        if status != "held":
            return status, None
        j = self.jobs[jid]
        if not retryable or j.attempts >= j.max_attempts:
            reason = "non-retryable error" if not retryable else "attempts exhausted"
            self._dead_letter(jid, reason, now)
            self._settle(j, token, "dead:" + reason)
            return "dead", reason
        delay = j.backoff.delay_ms(j.attempts) if delay_ms is None else delay_ms
        del self.leased[jid]
        self.due[jid] = now + delay
        j.state = "due"
        self._settle(j, token, f"retry:{now + delay}")
        return "retry", now + delay

    def release(self, now: int, jid: str, token: str) -> str:
        status, outcome = self.check(jid, token)
        if status == "settled":
            return "released" if outcome == "released" else "stale"
        if status == "held":
            j = self.jobs[jid]
            del self.leased[jid]
            self.due[jid] = now
            j.state = "due"
            j.attempts = max(j.attempts - 1, 0)
            self._settle(j, token, "released")
            return "released"
        return status

    def cancel(self, now: int, jid: str) -> str:
        j = self.jobs.get(jid)
        if j is None:
            return "missing"
        if jid not in self.due and jid not in self.leased:
            return j.state
        before = "leased" if jid in self.leased else "due"
        if before == "due" and self.due[jid] > now:
            before = "scheduled"  # waiting, its run_at later (lua/cancel.lua)
        self.due.pop(jid, None)
        self.leased.pop(jid, None)
        j.state = "cancelled"
        return before

    def requeue_dead(self, now: int, jid: str) -> int:
        j = self.jobs.get(jid)
        if j is None or j.state != "dead" or jid not in self.dead:
            return 0
        del self.dead[jid]
        self.due[jid] = now
        j.state, j.attempts, j.dead_reason, j.lapses = "due", 0, None, 0
        return 1


# -- the random programs -------------------------------------------------------------------
IDX = st.integers(0, 40)
ENQUEUE = st.tuples(
    st.just("enqueue"),
    st.sampled_from([0, 0, 500, 5_000, 40_000]),
    st.integers(1, 3),
    st.sampled_from([None, None, "k1", "k2"]),
    st.integers(0, len(BACKOFFS) - 1),
)
CLAIM = st.tuples(
    st.just("claim"), st.sampled_from([2, 1, 3, 0]), st.sampled_from([10_000, 30_000])
)
TICK = st.tuples(st.just("tick"), st.sampled_from([10_000, 31_000, 1_000, 30_000, 5_000, 999, 1]))
STEP = st.one_of(
    ENQUEUE, ENQUEUE, CLAIM, CLAIM, CLAIM, TICK, TICK, TICK,
    st.tuples(st.just("heartbeat"), IDX, st.sampled_from([10_000, 30_000])),
    st.tuples(st.just("complete"), IDX),
    st.tuples(st.just("fail"), IDX, st.sampled_from([True, True, False]),
              st.sampled_from([None, None, 0, 2_500])),
    st.tuples(st.just("release"), IDX),
    st.tuples(st.just("cancel"), IDX),
    st.tuples(st.just("requeue_dead"), IDX),
    st.tuples(st.just("pause")),
    st.tuples(st.just("resume")),
    st.tuples(st.just("reschedule"), IDX, st.sampled_from([0, 40_000, 500])),
    st.tuples(st.just("bad"), st.integers(0, 10)),
)  # fmt: skip
# A few jobs first, so the random steps have something to act on. Every sampled_from lists
# the most telling value first: hypothesis favours (and shrinks towards) it.
PROGRAM = st.tuples(
    st.lists(ENQUEUE, min_size=1, max_size=5), st.lists(STEP, min_size=20, max_size=60)
).map(lambda p: p[0] + p[1])


def bad_call(q: Queue, i: int, token: tuple[str, str] | None) -> None:
    jid, tok = token or ("nope", "1-x")
    calls = [
        lambda: q.enqueue("t", None, max_attempts=0),
        lambda: q.enqueue("t", None, delay_ms=-5),
        lambda: q.enqueue("t", {"x": object()}),
        lambda: q.claim("w", limit=-1),
        lambda: q.claim("w", limit=2, lease_ms=0),
        lambda: q.heartbeat([(jid, tok)], lease_ms=0),
        lambda: q.fail(jid, tok, ("E", "m", ""), delay_ms=-1),
        lambda: q.cancel("a{b}"),
        lambda: q.complete(jid, tok, {"x": object()}),
        lambda: q.reschedule(jid, delay_ms=-1),
        lambda: q.reschedule(jid),
    ]
    calls[i]()


class Run:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.q = Queue(client, "m-" + uuid.uuid4().hex[:12], _clock="test")
        self.clock = Clock(client, self.q)
        self.now = START_MS
        self.clock.set_ms(self.now)
        self.m = Model()
        self.ids: list[str] = []
        self.tokens: list[tuple[str, str]] = []

    def pick_job(self, i: int) -> str:
        # Small indices (which hypothesis favours) pick the newest: they are the live ones.
        return self.ids[-1 - i % len(self.ids)] if self.ids and i < 38 else f"missing-{i}"

    def pick_token(self, i: int) -> tuple[str, str] | None:
        if not self.tokens:
            return None
        return self.tokens[-1 - i % len(self.tokens)] if i < 38 else (self.pick_job(0), "9-forged")

    def step(self, op: tuple[Any, ...]) -> None:
        q, m, now = self.q, self.m, self.now
        kind = op[0]
        if kind == "enqueue":
            _, delay, max_attempts, key, b = op
            real = q.enqueue("t", {"n": len(self.ids)}, delay_ms=delay, max_attempts=max_attempts,
                             key=key, backoff=BACKOFFS[b])  # fmt: skip
            assert real == m.enqueue(real, now, delay, max_attempts, key, BACKOFFS[b])
            if real not in self.ids:
                self.ids.append(real)
        elif kind == "claim":
            _, limit, lease_ms = op
            batch = q.claim("w", limit=limit, lease_ms=lease_ms, reap_limit=REAP_LIMIT)
            expected, next_ms = m.claim(now, limit, lease_ms)
            assert [(j.id, j.fence) for j in batch.jobs] == expected
            assert batch.next_ms == next_ms and batch.now_ms == now
            for j in batch.jobs:
                assert j.attempts == m.jobs[j.id].attempts
                m.jobs[j.id].token = j.token
                self.tokens.append((j.id, j.token))
        elif kind == "heartbeat":
            t = self.pick_token(op[1])
            if t is None:
                return
            until, statuses = q.heartbeat([t], lease_ms=op[2])
            assert until == now + op[2]
            assert statuses[t[0]] == m.heartbeat(now, t[0], t[1], op[2])
        elif kind == "complete":
            t = self.pick_token(op[1])
            if t is None:
                return
            assert q.complete_many([(t[0], t[1], {"ok": 1})]) == [m.complete(*t)]
        elif kind == "fail":
            t = self.pick_token(op[1])
            if t is None:
                return
            got: tuple[str, Any]
            try:
                out = q.fail(t[0], t[1], ("E", "m", ""), retryable=op[2], delay_ms=op[3])
                got = (out.status, out.run_at_ms if out.status == "retry" else out.dead_reason)
            except StaleToken:
                got = ("stale", None)
            except JobCancelled:
                got = ("cancelled", None)
            except JobNotFound:
                got = ("missing", None)
            assert got == m.fail(now, t[0], t[1], op[2], op[3])
        elif kind == "release":
            t = self.pick_token(op[1])
            if t is None:
                return
            assert q.release([t]) == [m.release(now, *t)]
        elif kind == "cancel":
            jid = self.pick_job(op[1])
            try:
                got_state = q.cancel(jid)
            except JobNotFound:
                got_state = "missing"
            assert got_state == m.cancel(now, jid)
        elif kind == "requeue_dead":
            jid = self.pick_job(op[1])
            assert q.requeue_dead([jid]) == m.requeue_dead(now, jid)
        elif kind == "pause":
            assert q.pause() == m.pause(now)
        elif kind == "resume":
            assert q.resume() == m.resume()
        elif kind == "reschedule":
            jid = self.pick_job(op[1])
            try:
                got_word = q.reschedule(jid, delay_ms=op[2])
            except JobNotFound:
                got_word = "missing"
            assert got_word == m.reschedule(now, jid, op[2]), jid
        elif kind == "tick":
            self.now += op[1]
            self.clock.set_ms(self.now)
        elif kind == "bad":
            before = dump_queue(self.client, q)
            with pytest.raises(BadArgument):
                bad_call(q, op[1], self.pick_token(0))
            assert dump_queue(self.client, q) == before, f"refused call {op} changed the state"

    def compare(self) -> None:
        q, m, c = self.q, self.m, self.client
        due = c.zrange(q.keys.due, 0, -1, withscores=True)
        leased = c.zrange(q.keys.leased, 0, -1, withscores=True)
        assert [(k, int(s)) for k, s in due] == sorted(m.due.items(), key=lambda kv: (kv[1], kv[0]))
        assert [(k, int(s)) for k, s in leased] == sorted(
            m.leased.items(), key=lambda kv: (kv[1], kv[0])
        )
        # newest first; parks in the same ms by id, as ZRANGE REV orders them
        assert q.dead_ids() == sorted(m.dead, key=lambda d: (m.dead[d], d), reverse=True)
        # get_jobs reads either layout (a job never claimed is its spec record alone).
        jobs = {j.id: j for j in q._run(q.ops.get_jobs(self.ids))}
        for jid in self.ids:
            j, mj = jobs[jid], m.jobs[jid]
            got = (j.stored_state, j.attempts, j.dead_reason)
            assert got == (mj.state, mj.attempts, mj.dead_reason), jid
        counts = q.counts()
        assert counts.now_ms == self.now
        assert counts.due == sum(s <= self.now for s in m.due.values())
        assert counts.scheduled == sum(s > self.now for s in m.due.values())
        assert counts.leased == len(m.leased) and counts.dead == len(m.dead)
        assert counts.lapsed == sum(u <= self.now for u in m.leased.values())
        ready = [s for s in m.due.values() if s <= self.now]
        assert counts.oldest_due_ms == (min(ready) if ready else None)
        assert counts.paused_ms == m.paused_ms


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAM)
def test_api_matches_the_reference_model(client: redis.Redis, program: list[Any]) -> None:
    run = Run(client)
    try:
        for op in program:
            run.step(op)
            run.compare()
    finally:
        delete_queue(client, run.q)


def test_model_backoff_is_the_documented_formula() -> None:
    b = BACKOFFS[0]
    assert [b.delay_ms(a) for a in range(1, 6)] == [1_000, 2_000, 4_000, 8_000, 8_000]
    assert all(math.isfinite(b.factor) for b in BACKOFFS)
