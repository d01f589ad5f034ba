"""A second adversarial review of the failure paths ("crash-safe", "contained failure"):
lua/fail.lua's backoff and attempt budget, lease lapses and the reaper, fencing of a stale
worker, cancel / reschedule of a running job, dead letters (requeue, purge, retention) and a
chain whose step fails. Driven through the public Queue API on a queue whose scripts read the
test clock (the `tq` fixture), never by sleeping."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from scheduler import (
    Backoff,
    JobCancelled,
    JobDead,
    JobNotFound,
    JobState,
    Queue,
    StaleToken,
)
from scheduler.client.chain import chain
from scheduler.core import fail_reply
from tests.conftest import Clock, dump_queue

T0 = 1_000_000
EXACT = Backoff(base_ms=1_000, factor=2.0, cap_ms=10_000, jitter=0.0)
LEASE = 1_000


def _claim_one(q: Queue, worker: str) -> tuple[str, str, int]:
    batch = q.claim(worker, limit=1, lease_ms=LEASE)
    assert len(batch.jobs) == 1, batch
    j = batch.jobs[0]
    return j.id, j.token, j.attempts


@pytest.fixture
def u_fixed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The jitter draw `fail` sends (fail_reply's random.random), taken from this list."""
    draws: list[float] = []

    class _R:
        @staticmethod
        def random() -> float:
            return draws.pop(0)

    monkeypatch.setattr(fail_reply, "random", _R)
    yield draws


# -- worker field: a job no worker holds names none --------------------------------------------


def test_a_job_parked_by_the_reaper_names_no_worker(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Defect: the reaper parks a job whose lease lapsed on its last attempt ('lease expired')
    with lib/job.lua dead_letter, which leaves the hash's `worker` field; fail's park deletes
    it. `Job.worker` is documented "the worker id holding the lease (None when not leased)",
    yet the dead job (and the dead list of `jobs show`, the dashboard's worker column) names
    the crashed worker as if it still held it."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", max_attempts=1)
    _claim_one(q, "w-crashed")
    clock.set_ms(T0 + 5 * LEASE)
    assert q.claim("w-other", limit=1, lease_ms=LEASE).jobs == []  # reaped and parked
    job = q.get_job("a")
    assert (job.state, job.dead_reason) == (JobState.DEAD, "lease expired")
    assert job.worker is None, job.worker


def test_a_requeued_job_names_no_worker(client: redis.Redis, tq: tuple[Queue, Clock]) -> None:
    """Defect: a job parked by the reaper and requeued from the dead list is due (nobody holds
    it), but `Job.worker` still names the worker whose lease lapsed (requeue_dead.lua drops
    dead_reason, dead_ms, lapses, start_by_ms but not `worker`): `jobs list due` and the
    dashboard show a waiting job as held by a dead worker."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", max_attempts=1)
    _claim_one(q, "w-crashed")
    clock.set_ms(T0 + 5 * LEASE)
    q.claim("w-other", limit=0)  # reaps only
    assert q.requeue_dead(["a"]) == 1
    job = q.get_job("a")
    assert job.state == JobState.DUE
    assert job.worker is None, job.worker


def test_a_job_cancelled_while_leased_names_no_worker(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Defect: cancel.lua takes a leased job out of `leased` and marks it cancelled, but keeps
    its `worker` field: the finished record (get_job, `jobs show`, the dashboard) still says a
    worker holds the cancelled job, where fail's and complete's ends drop the field."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a")
    _claim_one(q, "w1")
    assert q.cancel("a") == "leased"
    job = q.get_job("a")
    assert job.state == JobState.CANCELLED
    assert job.worker is None, job.worker


def test_a_done_job_that_keeps_its_payload_names_no_worker(tq: tuple[Queue, Clock]) -> None:
    """Defect: complete.lua drops `worker` only from a lean record; a job enqueued with
    keep_payload=True keeps every field, the completing worker's id among them, so the done
    job reads as held by that worker (get_job(...).worker, `jobs show`, the dashboard)."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", keep_payload=True)
    _, token, _ = _claim_one(q, "w1")
    q.complete("a", token, 1)
    job = q.get_job("a")
    assert job.state == JobState.DONE
    assert job.worker is None, job.worker


# -- attempts: exactly max_attempts runs, whatever ends each ---------------------------------


def test_mixed_failures_run_exactly_max_attempts(tq: tuple[Queue, Clock]) -> None:
    """An error, a lapsed lease (worker died) and an error again: three runs for
    max_attempts=3, the third failure parks it, no fourth claim."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", max_attempts=3, backoff=EXACT)
    _, tok, n = _claim_one(q, "w1")
    assert n == 1
    out = q.fail("a", tok, ("E", "one", ""))
    assert (out.status, out.run_at_ms) == ("retry", T0 + 1_000)
    clock.set_ms(T0 + 1_000)
    _, tok, n = _claim_one(q, "w2")
    assert n == 2
    clock.set_ms(T0 + 1_000 + LEASE + 1)  # w2 died: its lease lapses
    _, tok, n = _claim_one(q, "w3")  # reaped and claimed again in one call
    assert n == 3
    out = q.fail("a", tok, ("E", "three", ""))
    assert (out.status, out.dead_reason) == ("dead", "attempts exhausted")
    clock.set_ms(T0 + 100_000)
    assert q.claim("w4", limit=10).jobs == []
    job = q.get_job("a")
    assert (job.state, job.attempts) == (JobState.DEAD, 3)


# -- backoff: within its bounds, never claimable before it ends ------------------------------


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999999])
def test_backoff_stays_within_its_jittered_bounds(
    tq: tuple[Queue, Clock], u_fixed: list[float], u: float
) -> None:
    """delay = min(cap, base * factor^(attempt-1)) * (1 - jitter*u), u in [0, 1): attempt 1..5
    of base 1 s, factor 3, cap 20 s, jitter 0.5; and the retry is not claimable 1 ms early."""
    q, clock = tq
    now = T0
    clock.set_ms(now)
    bo = Backoff(base_ms=1_000, factor=3.0, cap_ms=20_000, jitter=0.5)
    q.enqueue("t", {}, job_id="a", max_attempts=6, backoff=bo)
    for attempt in range(1, 6):
        _, tok, n = _claim_one(q, "w")
        assert n == attempt
        u_fixed.append(u)
        out = q.fail("a", tok, ("E", "m", ""))
        assert out.status == "retry" and out.run_at_ms is not None
        full = min(20_000, 1_000 * 3 ** (attempt - 1))
        delay = out.run_at_ms - now
        assert delay == int(full * (1 - 0.5 * u)), (attempt, delay)
        assert full * 0.5 <= delay <= full
        clock.set_ms(out.run_at_ms - 1)
        assert q.claim("w", limit=1).jobs == []
        now = out.run_at_ms
        clock.set_ms(now)


# -- fencing: a stale worker's calls are refused and change nothing ---------------------------


def test_a_stale_worker_is_refused_everything_and_changes_nothing(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """w1's lease lapsed and w2 claimed the job: w1's complete, fail, release, heartbeat and
    progress are all refused and leave every key as it was; w2's complete then stands."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", max_attempts=5)
    _, old, _ = _claim_one(q, "w1")
    clock.set_ms(T0 + LEASE + 1)
    _, new, n = _claim_one(q, "w2")
    assert n == 2 and new != old
    before = dump_queue(client, q)
    with pytest.raises(StaleToken):
        q.complete("a", old, "stale result")
    with pytest.raises(StaleToken):
        q.fail("a", old, ("E", "stale", ""))
    with pytest.raises(StaleToken):
        q.fail("a", old, ("E", "stale", ""), retryable=False)
    assert q.release([("a", old)]) == ["stale"]
    assert q.heartbeat([("a", old)])[1] == {"a": "stale"}
    assert q.set_progress("a", old, {"stale": True}) == "stale"
    assert dump_queue(client, q) == before
    q.complete("a", new, "fresh")
    assert q.result("a", timeout_s=1) == "fresh"


# -- cancel: never run again, answered as cancelled -------------------------------------------


def test_a_job_cancelled_during_its_backoff_never_runs_again(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", max_attempts=5, backoff=EXACT)
    _, tok, _ = _claim_one(q, "w1")
    assert q.fail("a", tok, ("E", "m", "")).status == "retry"
    assert q.cancel("a") == "scheduled"
    clock.set_ms(T0 + 60_000)
    assert q.claim("w", limit=10).jobs == []
    assert q.reschedule("a", delay_ms=0) == "cancelled"
    with pytest.raises(JobCancelled):
        q.result("a", timeout_s=1)


def test_a_job_cancelled_while_leased_is_not_reaped_back(tq: tuple[Queue, Clock]) -> None:
    """Cancelled while its worker runs it, then the worker dies: the lease end brings nothing
    back, and the worker's late complete is refused."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a")
    _, tok, _ = _claim_one(q, "w1")
    assert q.cancel("a") == "leased"
    clock.set_ms(T0 + 10 * LEASE)
    assert q.claim("w2", limit=10).jobs == []
    with pytest.raises(JobCancelled):
        q.complete("a", tok, 1)
    assert q.status("a") == JobState.CANCELLED


# -- dead letters: a requeue is a fresh start ------------------------------------------------


def test_a_requeued_job_starts_afresh_and_parks_again_after_its_budget(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="a", max_attempts=2, backoff=EXACT)
    _, tok1, _ = _claim_one(q, "w")
    q.fail("a", tok1, ("E", "1", ""))
    clock.set_ms(T0 + 1_000)
    _, tok2, _ = _claim_one(q, "w")
    assert q.fail("a", tok2, ("E", "2", "")).status == "dead"
    with pytest.raises(JobDead):
        q.result("a", timeout_s=1)
    assert q.requeue_dead(["a"]) == 1
    job = q.get_job("a")
    assert (job.state, job.attempts, job.dead_reason) == (JobState.DUE, 0, None)
    with pytest.raises(StaleToken):  # the old token is not revived by the requeue
        q.complete("a", tok2, 1)
    _, tok3, n = _claim_one(q, "w")
    assert n == 1 and tok3 not in (tok1, tok2)
    assert q.fail("a", tok3, ("E", "3", "")).status == "retry"
    clock.set_ms(T0 + 10_000)
    _, tok4, n = _claim_one(q, "w")
    assert n == 2
    assert q.fail("a", tok4, ("E", "4", "")).status == "dead"


# -- chains: a failed step parks the rest; requeued together they run in order --------------


def test_a_failed_chain_step_parks_the_rest_and_a_requeue_runs_them_in_order(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    a, b, c = chain(q, [("t", 1), ("t", 2), ("t", 3)], max_attempts=1)
    (ja,) = q.claim("w", limit=10).jobs
    assert ja.id == a
    assert q.fail(a, ja.token, ("E", "m", "")).status == "dead"
    assert [q.status(x) for x in (a, b, c)] == [JobState.DEAD] * 3
    assert q.get_job(c).dead_reason == f"parent dead: {b}"
    assert q.requeue_dead(q.dead_ids()) == 3
    for step, nxt in ((a, b), (b, c), (c, None)):
        (j,) = q.claim("w", limit=10).jobs
        assert j.id == step
        q.complete(step, j.token, step)
        if nxt is not None:
            assert q.status(nxt) == JobState.DUE
    assert q.claim("w", limit=10).jobs == []


# -- dead retention: by age and count, none too early ---------------------------------------


def test_dead_retention_by_age_keeps_the_boundary_and_drops_the_older(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    for i, at in enumerate((T0, T0 + 1_000, T0 + 2_000)):
        clock.set_ms(at)
        q.enqueue("t", {}, job_id=f"d{i}", max_attempts=1)
        _, tok, _ = _claim_one(q, "w")
        q.fail(f"d{i}", tok, ("E", "m", ""))
    q.set_dead_retention(max_age_ms=5_000)
    clock.set_ms(T0 + 6_000)  # d0 is 6 s dead, d1 exactly 5 s, d2 4 s
    q.claim("w", limit=0)
    assert sorted(q.dead_ids()) == ["d1", "d2"]
    assert client.exists(q.keys.job("d0")) == 0
    assert q.status("d1") == JobState.DEAD


def test_an_innocent_batch_mate_of_max_attempts_2_is_not_parked_with_the_poison_job(
    tq: tuple[Queue, Clock],
) -> None:
    """README "Contained failure": a job that kills its worker is parked after max_attempts
    "and it does not take its batch-mates with it". Isolation started at a job's second lapse
    only, and the reaper charges every lapse to the attempt budget: with max_attempts=2, a job
    that merely shared two batches with a poison job was parked 'lease expired' in the same
    reap, never having run alone. Now a lapsed job's last attempt is a suspect's (claim.lua
    suspect_at): one per worker, so the innocent job runs alone and completes."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {"kills": "its worker"}, job_id="poison", max_attempts=2)
    q.enqueue("t", {}, job_id="innocent", max_attempts=2)
    assert len(q.claim("w1", limit=2, lease_ms=LEASE).jobs) == 2  # w1 dies (poison)
    clock.set_ms(T0 + 2 * LEASE)
    first = q.claim("w2", limit=2, lease_ms=LEASE)
    assert len(first.jobs) == 1 and first.suspect == first.jobs[0].id  # its last attempt: alone
    second = q.claim("w3", limit=2, lease_ms=LEASE)
    assert len(second.jobs) == 1 and second.suspect == second.jobs[0].id
    held = {j.id: (w, j.token) for w, b in (("w2", first), ("w3", second)) for j in b.jobs}
    assert sorted(held) == ["innocent", "poison"]
    q.complete("innocent", held["innocent"][1])  # ran alone: done
    clock.set_ms(T0 + 4 * LEASE)  # the poison job's worker died again, alone
    q.claim("w4", limit=1, lease_ms=LEASE)
    assert q.status("poison") == JobState.DEAD
    assert q.get_job("poison").dead_reason == "lease expired"
    assert q.status("innocent") == JobState.DONE


def test_a_batch_mate_whose_budget_is_one_attempt_is_parked_on_its_first_lapse(
    tq: tuple[Queue, Clock],
) -> None:
    """The bound of the rule above: max_attempts=1 allows no second run, so a lapse (it may
    have run) parks every job of the crashed batch (docs/durability.md says so)."""
    q, clock = tq
    clock.set_ms(T0)
    for jid in ("poison", "innocent"):
        q.enqueue("t", {}, job_id=jid, max_attempts=1)
    assert len(q.claim("w1", limit=2, lease_ms=LEASE).jobs) == 2
    clock.set_ms(T0 + 2 * LEASE)
    assert q.claim("w2", limit=2, lease_ms=LEASE).jobs == []
    assert sorted(q.dead_ids()) == ["innocent", "poison"]


def test_a_child_parked_before_its_first_claim_keeps_its_enqueue_time(
    tq: tuple[Queue, Clock],
) -> None:
    """Defect: a job never claimed keeps its enqueue time in its spec record as '' = "its due
    score" (lib/job.lua pack_spec). A child parked because its parent died leaves due with no
    hash field to hold it: the dead job reads enqueued_ms '' (get_job, `jobs show`: none), and
    once requeued (requeue_dead.lua puts it in due at now, without spec_pin_enqueued as
    reschedule.lua does) it reads, and its first claim stores, the requeue time as the time it
    was enqueued. The same holds for a job parked at claim by its start deadline."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="parent", max_attempts=1)
    q.enqueue("t", {}, job_id="child", after=["parent"])
    assert q.get_job("child").fields.get("enqueued_ms") == str(T0)
    clock.set_ms(T0 + 2_000)
    _, tok, _ = _claim_one(q, "w")
    assert q.fail("parent", tok, ("E", "m", "")).status == "dead"
    assert q.status("child") == JobState.DEAD
    seen = {"dead": q.get_job("child").fields.get("enqueued_ms")}
    clock.set_ms(T0 + 5_000)
    assert q.requeue_dead(["child"]) == 1
    seen["requeued"] = q.get_job("child").fields.get("enqueued_ms")
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["child"]
    seen["claimed"] = q.get_job("child").fields.get("enqueued_ms")
    assert seen == {"dead": str(T0), "requeued": str(T0), "claimed": str(T0)}


def test_a_never_claimed_job_cancelled_keeps_its_run_time_and_enqueue_time(
    tq: tuple[Queue, Clock],
) -> None:
    """Defect: cancel.lua marks a never-claimed job cancelled (a hash of state, finished_ms,
    attempts) after taking it out of due, where its run time was (its due score; the spec
    record keeps enqueued_ms only when it differs from it). The cancelled record then reads
    run_at_ms None, and a job enqueued to run at once enqueued_ms '' too: get_job, `jobs show`
    and the dashboard's finished list lose when it was to run. A job cancelled after a retry
    keeps both (its hash has them)."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t", {}, job_id="later", delay_ms=60_000)
    q.enqueue("t", {}, job_id="now")
    assert q.cancel("later") == "scheduled"
    assert q.cancel("now") == "due"
    later, now = q.get_job("later"), q.get_job("now")
    assert (later.state, now.state) == (JobState.CANCELLED, JobState.CANCELLED)
    got = {
        "later": (later.run_at_ms, later.fields.get("enqueued_ms")),
        "now": (now.run_at_ms, now.fields.get("enqueued_ms")),
    }
    assert got == {"later": (T0 + 60_000, str(T0)), "now": (T0, str(T0))}


def test_a_parents_retry_and_a_stale_complete_leave_its_child_waiting(
    tq: tuple[Queue, Clock],
) -> None:
    """A chain step stays held while the step before it lapses (stale worker refused, nothing
    released), retries (RetryLater's delay) and runs again; it is due only once that step is
    done, and never before."""
    q, clock = tq
    clock.set_ms(T0)
    a, b = chain(q, [("t", "A"), ("t", "B")], max_attempts=3)
    _, stale, _ = _claim_one(q, "w1")
    clock.set_ms(T0 + LEASE + 1)
    _, tok, n = _claim_one(q, "w2")  # w1's lease lapsed: reaped and claimed again
    assert n == 2
    with pytest.raises(StaleToken):
        q.complete(a, stale, "late")
    assert q.status(b) == JobState.HELD
    out = q.fail(a, tok, ("RetryLater", "later", ""), delay_ms=5_000)
    assert (out.status, out.run_at_ms) == ("retry", T0 + LEASE + 1 + 5_000)
    assert q.status(b) == JobState.HELD
    clock.set_ms(T0 + LEASE + 5_000)
    assert q.claim("w3", limit=10).jobs == []  # neither A before its delay nor B
    clock.set_ms(T0 + LEASE + 1 + 5_000)
    _, tok, n = _claim_one(q, "w3")
    assert n == 3
    q.complete(a, tok, "A done")
    (jb,) = q.claim("w3", limit=10).jobs
    assert jb.id == b and jb.payload() == {"payload": "B", "parent": a}
    assert q.result(a, timeout_s=1) == "A done"


# -- a seeded random walk over the failure paths, checked against a model of attempts ------


BACKOFFS = (
    Backoff(base_ms=100, factor=2.0, cap_ms=1_000, jitter=0.0),
    Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0),
    Backoff(base_ms=250, factor=3.0, cap_ms=2_000, jitter=0.0),
)


@dataclass
class _M:
    """The model of one job: where it is, its attempts, when it may run again."""

    max_attempts: int
    backoff: Backoff
    state: str = "waiting"  # waiting | leased | dead | done | cancelled
    attempts: int = 0
    not_before: int = 0
    token: str = ""
    lease_until: int = 0


class _Walk:
    def __init__(self, q: Queue, clock: Clock, seed: int) -> None:
        self.q, self.clock, self.rng = q, clock, random.Random(seed)
        self.now = T0
        clock.set_ms(self.now)
        self.jobs: dict[str, _M] = {}
        self.stale: list[tuple[str, str]] = []
        self.settled: dict[tuple[str, str], object] = {}
        self.log: list[str] = []

    def tick(self) -> None:
        self.now += self.rng.choice([0, 1, 50, 100, 400, 1_000, 3_000])
        self.clock.set_ms(self.now)

    def enqueue(self) -> None:
        jid = f"j{len(self.jobs)}"
        m = _M(self.rng.randint(1, 3), self.rng.choice(BACKOFFS))
        delay = self.rng.choice([0, 0, 200, 1_500])
        self.q.enqueue("t", {}, job_id=jid, max_attempts=m.max_attempts, backoff=m.backoff,
                       delay_ms=delay)  # fmt: skip
        m.not_before = self.now + delay
        self.jobs[jid] = m

    def reap(self) -> None:
        """What every claim does first: each lapsed lease due again at its end, or parked."""
        for m in self.jobs.values():
            if m.state == "leased" and m.lease_until <= self.now:
                self.stale.append(("", m.token))
                if m.attempts >= m.max_attempts:
                    m.state = "dead"
                else:
                    m.state, m.not_before = "waiting", m.lease_until

    def claim(self) -> None:
        lease = self.rng.choice([300, 1_000, 5_000])
        batch = self.q.claim(self.rng.choice("abc"), limit=self.rng.choice([1, 2, 5]),
                             lease_ms=lease)  # fmt: skip
        self.reap()
        for j in batch.jobs:
            m = self.jobs[j.id]
            assert m.state == "waiting", (j.id, m)
            assert self.now >= m.not_before, ("claimed early", j.id, self.now, m)
            assert j.attempts == m.attempts + 1 <= m.max_attempts, (j.id, j.attempts, m)
            m.state, m.attempts, m.token = "leased", j.attempts, j.token
            m.lease_until = self.now + lease

    def pick(self) -> tuple[str, str] | None:
        live = [(i, m.token) for i, m in self.jobs.items() if m.state == "leased"]
        pool = live + self.stale if self.rng.random() < 0.3 else live
        return self.rng.choice(pool) if pool else None

    def settle(self, what: str) -> None:
        got = self.pick()
        if got is None or not got[0]:
            return
        jid, tok = got
        m = self.jobs[jid]
        held = m.state == "leased" and m.token == tok
        # A token that settled its lease before: a re-sent call, answered as the first time
        # (or refused once the job's last 8 settlements moved past it); it changes nothing.
        replay = self.settled.get((jid, tok))
        if what == "complete":
            try:
                self.q.complete(jid, tok, 1)
            except (StaleToken, JobCancelled, JobNotFound):
                assert not held, (jid, m)
                return
            assert held or replay == "done", ("stale complete accepted", jid, m, replay)
            if held:
                m.state = "done"
                self.settled[(jid, tok)] = "done"
        elif what == "release":
            st = self.q.release([(jid, tok)])[0]
            assert (st == "released") == (held or replay == "released"), (jid, st, m, replay)
            if held:
                m.state, m.attempts, m.not_before = "waiting", m.attempts - 1, self.now
                self.settled[(jid, tok)] = "released"
        else:
            retryable = self.rng.random() < 0.85
            delay = self.rng.choice([None, None, 0, 700])
            try:
                out = self.q.fail(jid, tok, ("E", "m", ""), retryable=retryable, delay_ms=delay)
            except (StaleToken, JobCancelled, JobNotFound):
                assert not held, (jid, m)
                return
            if not held:
                assert replay is not None and replay == (out.status, out.run_at_ms), (
                    "stale fail accepted",
                    jid,
                    m,
                    replay,
                    out,
                )
                return
            if not retryable or m.attempts >= m.max_attempts:
                assert out.status == "dead", (jid, out, m)
                m.state = "dead"
            else:
                bo = m.backoff
                want = delay if delay is not None else bo.delay_ms(m.attempts)
                assert (out.status, out.run_at_ms) == ("retry", self.now + want), (jid, out, m)
                m.state, m.not_before = "waiting", self.now + want
            self.settled[(jid, tok)] = (out.status, out.run_at_ms)
        self.stale.append((jid, tok))

    def beat(self) -> None:
        """A heartbeat (or a progress report) of a current or stale lease: extended only while
        the token holds an unexpired lease; a lapsed one answers 'expired' and stays lapsed."""
        got = self.pick()
        if got is None or not got[0]:
            return
        jid, tok = got
        m = self.jobs[jid]
        held = m.state == "leased" and m.token == tok
        lease = self.rng.choice([200, 2_000])
        if self.rng.random() < 0.5:
            st = self.q.set_progress(jid, tok, {"at": self.now})
        else:
            until, sts = self.q.heartbeat([(jid, tok)], lease_ms=lease)
            st = sts[jid]
            if st == "held":
                assert until == self.now + lease
                m.lease_until = until
        if held and m.lease_until > self.now:
            assert st == "held", (jid, st, m)
        elif held:
            assert st == "expired", (jid, st, m)
        else:
            assert st != "held", ("stale lease extended", jid, tok, st, m)

    def other(self) -> None:
        jid = self.rng.choice(list(self.jobs)) if self.jobs else None
        if jid is None:
            return
        m = self.jobs[jid]
        op = self.rng.choice(["cancel", "reschedule", "requeue"])
        if op == "cancel" and m.state in ("waiting", "leased") and self.rng.random() < 0.3:
            self.q.cancel(jid)
            m.state = "cancelled"
        elif op == "reschedule" and m.state == "waiting":
            d = self.rng.choice([0, 500])
            assert self.q.reschedule(jid, delay_ms=d) == "rescheduled", (jid, m)
            m.not_before = self.now + d
        elif op == "requeue" and m.state == "dead":
            assert self.q.requeue_dead([jid]) == 1
            m.state, m.attempts, m.not_before = "waiting", 0, self.now

    def check(self) -> None:
        want = {"waiting": {JobState.DUE, JobState.SCHEDULED}, "leased": {JobState.LEASED},
                "dead": {JobState.DEAD}, "done": {JobState.DONE},
                "cancelled": {JobState.CANCELLED}}  # fmt: skip
        for jid, m in self.jobs.items():
            job = self.q.get_job(jid)
            assert JobState(job.state) in want[m.state], (jid, job.state, m)
            if m.state in ("waiting", "leased", "dead"):
                assert job.attempts == m.attempts, (jid, job.attempts, m)

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.15 or not self.jobs:
            self.enqueue()
        elif r < 0.40:
            self.claim()
        elif r < 0.55:
            self.settle("fail")
        elif r < 0.63:
            self.settle("complete")
        elif r < 0.68:
            self.settle("release")
        elif r < 0.74:
            self.other()
        elif r < 0.82:
            self.beat()
        else:
            self.tick()


@pytest.mark.parametrize("seed", range(12))
def test_a_random_walk_counts_attempts_and_waits_out_every_backoff(
    tq: tuple[Queue, Clock], seed: int
) -> None:
    """Attempts as the model counts them (one per claim, one given back per release, none
    after a requeue), never more than max_attempts claims, a retry never claimed before its
    backoff (or RetryLater delay) ends, a lapsed lease due at its end or parked when spent,
    stale tokens refused; the stored state and attempts agree after every step."""
    q, clock = tq
    walk = _Walk(q, clock, seed)
    for _ in range(250):
        walk.step()
        walk.check()
