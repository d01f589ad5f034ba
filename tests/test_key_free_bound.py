"""A concurrency key freed whole at once (a fleet's crash: every lease of a key of limit 10,000
lapses together) is worked off a bounded step per script (lib/flow.lua flow_ck_live,
flow_ck_promote): the first claim that met it checked every lapsed lease and promoted every held
job of the key in one script, 283 ms for 10,000 of each (bench/lua_call_bounds.py keylapse),
every client of that Redis waiting. Now at most 1,000 of each per script, and nothing is
stranded: every job of the key still runs."""

from __future__ import annotations

import redis

from scheduler import JobSpec, Queue
from tests.conftest import Clock

T0 = 10_000_000_000  # a server time, ms
LIMIT = 2_500
STEP = 1_000  # lib/flow.lua FLOW_CK_STEP and FLOW_PROMOTE_STEP


def test_a_key_freed_whole_is_worked_off_a_bounded_step_per_claim(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    ids = q.enqueue_many(
        [JobSpec("t", i, concurrency_key="k", concurrency_limit=LIMIT) for i in range(2 * LIMIT)],
        batch_size=5_000,
    )
    ck, held = q.keys.prefix + "flow:ck:k", q.keys.prefix + "flow:ckheld:k"
    for _ in range(20):  # a claim sets aside at most 300 (lib/flow.lua FLOW_ASIDE_BATCH)
        q.claim("w", limit=1_000, lease_ms=30_000, reap_limit=0)
    assert (client.zcard(ck), client.zcard(held)) == (LIMIT, LIMIT)
    clock.set_ms(T0 + 60_000)  # every lease lapsed
    first = q.claim("w", limit=1, lease_ms=30_000, reap_limit=1).jobs
    # One lapsed lease reaped (its own slot), at most a step of the others checked, at most a
    # step of held jobs promoted (and the one leased back): before, all of both.
    assert client.zcard(ck) >= LIMIT - 1 - STEP, client.zcard(ck)
    assert client.zcard(held) >= LIMIT - STEP - 1, client.zcard(held)
    for j in first:
        q.complete(j.id, j.token)
    ran = {j.id for j in first}
    for _ in range(200):
        jobs = q.claim("w", limit=1_000, lease_ms=30_000).jobs
        if not jobs:
            break
        for j in jobs:
            q.complete(j.id, j.token)
            ran.add(j.id)
    assert ran == set(ids)  # none stranded behind the key
    assert (client.zcard(held), q.counts().due, q.counts().leased) == (0, 0, 0)
