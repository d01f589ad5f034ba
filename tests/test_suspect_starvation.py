"""Suspects must not starve the rest of due: a job that can never succeed must not block the
others. A worker holds at most one suspect lease (a job whose lease lapsed twice, claim.lua),
and a suspect it may not take stays due; each claim scans at most limit + FLOW_HOLD_BUDGET
(200) due jobs. With more suspects than that at the head of due, every claim spent its whole
budget skipping them, and plain jobs due behind them were not claimed until the suspects
drained (one per worker per lease: hours, if they really crash their workers). A suspect a
claim skips is moved behind the jobs already due (never earlier than its score), so the next
claims reach the plain jobs (docs/durability.md)."""

from __future__ import annotations

from typing import cast

from scheduler import JobSpec, Queue
from tests.conftest import Clock

T0 = 1_000_000
LEASE = 1_000
N_SUSPECTS = 500  # more than one claim of 100 scans (100 + FLOW_HOLD_BUDGET, 200)
N_PLAIN = 10


def _now(q: Queue) -> int:
    return int(q.client.get(q.keys.test_clock) or 0)


def _due_scores(q: Queue) -> dict[str, float]:
    rows = cast(list[tuple[str, float]], q.client.zrange(q.keys.due, 0, -1, withscores=True))
    return dict(rows)


def _make_suspects(q: Queue, clock: Clock, n: int) -> list[str]:
    """`n` jobs whose leases lapsed twice (the reaper counts each lapse): suspects, due."""
    clock.set_ms(T0)
    ids = q.enqueue_many([JobSpec("t") for _ in range(n)])
    for _ in range(2):
        now = _now(q)
        got = 0
        while got < n:
            batch = q.claim("crashed", limit=1_000, lease_ms=LEASE)
            assert batch.jobs
            got += len(batch.jobs)
        clock.set_ms(now + LEASE + 1)
        while q.client.zcard(q.keys.leased):  # a claim reaps 500 at most
            q.claim("reaper", limit=0, lease_ms=LEASE, reap_limit=10_000)
    lapses = q.client.hmget(q.keys.job(ids[0]), "lapses")
    assert lapses == ["2"]
    assert q.client.zcard(q.keys.due) == n and q.client.zcard(q.keys.leased) == 0
    return ids


def _setup(q: Queue, clock: Clock) -> tuple[set[str], set[str]]:
    suspects = set(_make_suspects(q, clock, N_SUSPECTS))
    clock.set_ms(_now(q) + 10)
    plain = {q.enqueue("t") for _ in range(N_PLAIN)}  # due behind every suspect
    head = q.client.zrange(q.keys.due, 0, N_SUSPECTS - 1)
    assert set(head) == suspects  # the suspects are all ahead of the plain jobs
    clock.set_ms(_now(q) + 1)  # the claims below: a moment after the plain jobs became due
    return suspects, plain


def _claim_plain(q: Queue, worker: str, plain: set[str], calls: int) -> tuple[set[str], int]:
    """Claim up to `calls` times; the plain jobs got and the suspects leased on the way."""
    got: set[str] = set()
    suspects_taken = 0
    for _ in range(calls):
        batch = q.claim(worker, limit=100, lease_ms=60_000)
        ids = {j.id for j in batch.jobs}
        got |= ids & plain
        suspects_taken += len(ids - plain)
        if got == plain:
            break
    return got, suspects_taken


def test_a_worker_holding_a_suspect_reaches_plain_jobs_behind_many_suspects(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    suspects, plain = _setup(q, clock)
    first = q.claim("w1", limit=1, lease_ms=60_000)
    assert len(first.jobs) == 1 and first.suspect in suspects  # w1 holds one now
    got, taken = _claim_plain(q, "w1", plain, calls=3)
    assert got == plain, f"w1 got {len(got)} of {N_PLAIN} plain jobs in 3 claims"
    assert taken == 0  # still one suspect per worker
    assert q.client.hget(q.keys.prefix + "isolated", "w1") == first.suspect


def test_a_fresh_worker_reaches_plain_jobs_behind_many_suspects(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    suspects, plain = _setup(q, clock)
    got, taken = _claim_plain(q, "w2", plain, calls=3)
    assert got == plain, f"w2 got {len(got)} of {N_PLAIN} plain jobs in 3 claims"
    assert taken == 1  # exactly one suspect on the way
    assert set(q.client.zrange(q.keys.due, 0, -1)) < suspects
    assert q.client.zcard(q.keys.due) == N_SUSPECTS - 1


def test_many_workers_each_holding_a_suspect_reach_the_plain_jobs(
    tq: tuple[Queue, Clock],
) -> None:
    """A fleet whose workers each hold a suspect: the plain jobs are leased within a few
    claims in all, whichever worker makes them."""
    q, clock = tq
    suspects, plain = _setup(q, clock)
    for w in ("a", "b", "c"):
        (j,) = q.claim(w, limit=1, lease_ms=60_000).jobs
        assert j.id in suspects
    got: set[str] = set()
    for w in ("a", "b", "c"):
        got |= {j.id for j in q.claim(w, limit=100, lease_ms=60_000).jobs}
    assert got == plain


def test_skipped_suspects_never_run_early_and_stay_due_for_others(
    tq: tuple[Queue, Clock],
) -> None:
    """A skipped suspect moves back in due to the claim's time, never ahead of its own score;
    it stays due, for a worker that may take it (also in the same millisecond)."""
    q, clock = tq
    suspects, plain = _setup(q, clock)
    before = _due_scores(q)
    (mine,) = q.claim("w1", limit=1, lease_ms=60_000).jobs  # takes one suspect
    assert q.claim("w1", limit=100, lease_ms=60_000).jobs == []  # its scan: suspects only
    after = _due_scores(q)
    assert set(after) == (suspects | plain) - {mine.id}
    assert all(before[i] <= after[i] <= _now(q) for i in after)  # due now, never early
    moved = [i for i in after if after[i] != before[i]]
    assert len(moved) == 300  # the second call's whole scan budget (limit 100 + 200)
    assert all(after[i] > after[p] for i in moved for p in plain)  # now behind the plain jobs
    # A fresh worker takes one suspect at once (and one only), and the plain jobs.
    batch = q.claim("w9", limit=100, lease_ms=60_000)
    assert batch.suspect in suspects and {j.id for j in batch.jobs} == plain | {batch.suspect}
    # The one-per-worker rule still holds for the worker that skipped them: it is told to come
    # back at the earliest lease end or within a second (claim.lua SUSPECT_POLL_MS), not
    # "due now" (no claim loop).
    again = q.claim("w1", limit=100, lease_ms=60_000)
    assert again.jobs == []
    assert again.next_ms == min(mine.claimed_ms + 60_000, again.now_ms + 1_000) > again.now_ms


def test_skipped_suspects_with_a_priority_leave_their_index_and_stay_due(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    ids = [q.enqueue("t", priority=5) for _ in range(3)]
    for _ in range(2):
        now = _now(q)
        q.claim("crashed", limit=100, lease_ms=LEASE)
        clock.set_ms(now + LEASE + 1)
        q.claim("reaper", limit=0, lease_ms=LEASE)
    clock.set_ms(_now(q) + 5)
    (got,) = q.claim("w1", limit=100, lease_ms=LEASE).jobs
    index = q.keys.prefix + "flow:pdue:5"
    for i in set(ids) - {got.id}:
        assert q.client.zscore(index, i) is None
        assert q.client.zscore(q.keys.due, i) == _now(q)
    # Still due for a worker that may take one: met in due's own pass.
    assert {j.id for j in q.claim("w2", limit=1, lease_ms=LEASE).jobs} < set(ids)


def test_prioritized_suspects_do_not_starve_lower_priority_jobs(tq: tuple[Queue, Clock]) -> None:
    """1,500 suspects at priority 5 and 10 plain jobs at no priority: each claim's level pass
    met the re-indexed suspects again and spent its whole budget on them, so the plain jobs
    waited for priority aging (60 s by default, up to years)."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue_many([JobSpec("t", priority=5) for _ in range(N_SUSPECTS)])
    for _ in range(2):
        now = _now(q)
        while q.claim("crashed", limit=1_000, lease_ms=LEASE).jobs:
            pass
        clock.set_ms(now + LEASE + 1)
        while q.client.zcard(q.keys.leased):  # a claim reaps 500 at most
            q.claim("reaper", limit=0, lease_ms=LEASE, reap_limit=10_000)
    clock.set_ms(_now(q) + 10)
    plain = {q.enqueue("t") for _ in range(N_PLAIN)}
    clock.set_ms(_now(q) + 1)
    first = q.claim("w1", limit=1, lease_ms=60_000)
    assert first.suspect is not None
    got, taken = _claim_plain(q, "w1", plain, calls=4)
    assert got == plain and taken == 0


def test_a_worker_whose_scan_met_only_suspects_comes_back_at_once_while_older_jobs_wait(
    tq: tuple[Queue, Clock],
) -> None:
    """Its scan moved suspects due before it took its own, and jobs due before then are left
    (the plain ones among them): it is told "due now", not its lease end (60 s here, the
    worker slept that long while every worker held a suspect)."""
    q, clock = tq
    suspects, plain = _setup(q, clock)
    first = q.claim("w1", limit=1, lease_ms=60_000)
    assert first.suspect in suspects
    b = q.claim("w1", limit=100, lease_ms=60_000)
    assert b.jobs == [] and b.next_ms <= b.now_ms
    assert {j.id for j in q.claim("w1", limit=100, lease_ms=60_000).jobs} == plain
