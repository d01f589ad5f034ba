"""The seed design's 200 seeded simulations, run against the real Lua scripts on a real Redis
with a controlled clock: crashing, failing, stalling and healthy workers, random claim limits.

Differences from the toy model, on purpose: attempts are counted at claim (so a job that keeps
crashing its worker is parked with 'lease expired' instead of retrying forever), and a lapsed
lease is reaped by the next claim."""

from __future__ import annotations

import random
from collections import Counter

from scheduler import Backoff, Queue, StaleToken
from tests.conftest import Clock

LEASE_MS = 30_000
SEED_BACKOFF = Backoff(base_ms=2_000, factor=2.0, cap_ms=10**9, jitter=0.0)


def run_one(q: Queue, clock: Clock, seed: int) -> tuple[int, int, int]:
    rng = random.Random(seed)
    due: dict[str, int] = {}
    for _ in range(rng.randint(1, 25)):
        t0 = rng.randrange(120)
        clock.set_s(0)
        due[q.enqueue("t", {"t0": t0}, delay_ms=t0 * 1000, backoff=SEED_BACKOFF)] = t0
    latest_token: dict[str, str] = {}
    accepted: Counter[str] = Counter()
    effects: Counter[str] = Counter()
    running: list[tuple[str, str, int, str]] = []
    stale_refused = 0
    for now in range(3000):
        clock.set_s(now)
        batch = q.claim("w", limit=rng.randint(0, 3), lease_ms=LEASE_MS)
        for job in batch.jobs:
            assert now >= due[job.id], f"job {job.id} claimed at {now}, before its run_at"
            assert batch.now_ms >= job.run_at_ms, "claimed before its (retry) run_at"
            assert job.attempts <= job.max_attempts
            latest_token[job.id] = job.token
            outcome = rng.choice(["crash", "fail", "stall", "ok", "ok", "ok", "ok"])
            running.append((job.id, job.token, now + rng.choice([5, 20, 45]), outcome))
        if now % 10 == 0:
            healthy = [(j, t) for j, t, _, o in running if o in ("fail", "ok")]
            if healthy:
                q.heartbeat(healthy, lease_ms=LEASE_MS)
        for r in running[:]:
            jid, token, finish_at, outcome = r
            if now < finish_at:
                continue
            running.remove(r)
            if outcome in ("ok", "stall"):
                effects[jid] += 1
                try:
                    q.complete(jid, token)
                except StaleToken:
                    stale_refused += 1
                    continue
                # Only the holder of the newest token may ever complete a job.
                assert token == latest_token[jid], "a stale complete was accepted"
                accepted[jid] += 1
            elif outcome == "fail":
                try:
                    q.fail(jid, token, RuntimeError("fail"))
                except StaleToken:
                    stale_refused += 1
        counts = q.counts()
        if not running and counts.due + counts.scheduled + counts.leased == 0:
            break
    counts = q.counts()
    assert counts.due + counts.scheduled + counts.leased == 0, "jobs left behind"
    states = {jid: q.status(jid) for jid in due}
    done = {jid for jid, st in states.items() if st == "done"}
    dead = {jid for jid, st in states.items() if st == "dead"}
    assert done | dead == set(due), f"jobs neither done nor dead: {set(due) - done - dead}"
    assert all(accepted[jid] == 1 for jid in done), "a done job was completed twice"
    assert all(accepted[jid] == 0 for jid in dead), "a dead job was also completed"
    dead_list = q.client.zrange(q.keys.dead, 0, -1)
    assert sorted(dead_list) == sorted(dead), "dead list differs from the dead jobs"
    assert all(effects[jid] >= 1 for jid in done)
    twice = sum(c > 1 for c in effects.values())
    return stale_refused, twice, len(dead)


def test_200_seeded_simulations(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    totals = Counter[str]()
    for seed in range(200):
        stale, twice, dead = run_one(q, clock, seed)
        totals.update(stale=stale, twice=twice, dead=dead)
        # The job ids of this seed are all final; start the next seed on empty places.
        q.client.delete(q.keys.dead)
    # The refusal path was exercised, and some handlers ran twice (at-least-once delivery).
    assert totals["stale"] > 0 and totals["twice"] > 0 and totals["dead"] > 0
