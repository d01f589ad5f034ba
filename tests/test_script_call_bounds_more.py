"""More work bounds of one script call (bench/lua_call_bounds.py keylapse, cancel / complete /
fail, settle, heldwide have the figures): a parent's end reaches CHILDREN_PER_CALL children, a
key freed whole has KEY_STEP_PER_CALL of its lapsed leases checked and of its held jobs
promoted, a claim sets aside at most min(limit, SET_ASIDE_OF_BATCH) + HOLD_BUDGET jobs, and
heartbeat / complete_many / release go as calls of SETTLE_CHUNK leases. Each part is checked
to be one step, and all the work past it to complete over the next calls (public API)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import redis

from scheduler import JobSpec, Queue
from scheduler.core.limits import (
    CHILDREN_PER_CALL,
    HOLD_BUDGET,
    KEY_STEP_PER_CALL,
    SET_ASIDE_OF_BATCH,
)
from scheduler.operations.leasing import SETTLE_CHUNK
from tests.conftest import Clock

ROOT = Path(__file__).resolve().parent.parent
T0 = 10_000_000_000  # a server time, ms


def _lua_constant(name: str) -> int:
    text = (ROOT / "lua" / "lib" / "flow.lua").read_text()
    found = re.findall(rf"^local {name} = (\d+)\b", text, re.MULTILINE)
    assert len(found) == 1, f"{name} not found once"
    return int(found[0])


def test_the_bounds_agree_between_lua_python_and_the_docs() -> None:
    assert _lua_constant("FLOW_END_STEP") == CHILDREN_PER_CALL
    assert _lua_constant("FLOW_CK_STEP") == KEY_STEP_PER_CALL
    assert _lua_constant("FLOW_PROMOTE_STEP") == KEY_STEP_PER_CALL
    assert _lua_constant("FLOW_ASIDE_BATCH") == SET_ASIDE_OF_BATCH
    assert _lua_constant("FLOW_HOLD_BUDGET") == HOLD_BUDGET
    docs = (ROOT / "docs" / "limits.md").read_text()
    assert f"reaches {CHILDREN_PER_CALL} children per call" in docs
    assert f"at most {KEY_STEP_PER_CALL} of them checked" in docs
    assert f"calls of {SETTLE_CHUNK}" in docs
    assert f"min(limit, {SET_ASIDE_OF_BATCH}) + {HOLD_BUDGET}" in docs


def _waiting(client: redis.Redis, q: Queue) -> int:
    return int(client.zcard(q.keys.flow_waiting))


def test_a_parents_end_reaches_one_step_of_children_and_the_claims_the_rest(
    q: Queue, client: redis.Redis
) -> None:
    n = 3 * CHILDREN_PER_CALL + 10
    parent = q.enqueue("parent", None)
    kids = q.enqueue_many([JobSpec("kid", i, after=[parent]) for i in range(n)])
    (job,) = q.claim("w", limit=1).jobs
    q.complete(job.id, job.token)
    assert _waiting(client, q) == n - CHILDREN_PER_CALL  # one step in complete's own script
    claims = 0
    while _waiting(client, q) and claims < 10:
        q.claim("w", limit=0)  # each claim goes on with one step of the end
        claims += 1
    assert claims == math.ceil((n - CHILDREN_PER_CALL) / CHILDREN_PER_CALL)
    assert q.counts().due == n
    leased = {j.id for _ in range(2) for j in q.claim("w", limit=1_000).jobs}
    assert leased == set(kids)


def test_a_key_freed_whole_is_promoted_a_step_per_call_and_every_job_runs(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    limit = 2 * KEY_STEP_PER_CALL + 100
    spec = {"concurrency_key": "k", "concurrency_limit": limit}
    ids = q.enqueue_many([JobSpec("t", i, **spec) for i in range(2 * limit)])  # type: ignore[arg-type]
    held = q.keys.prefix + "flow:ckheld:k"
    for _ in range(20):
        if not q.claim("w", limit=1_000, lease_ms=30_000, reap_limit=0).jobs and not (
            q.counts().due
        ):
            break
    assert (client.zcard(q.keys.prefix + "flow:ck:k"), client.zcard(held)) == (limit, limit)
    clock.set_ms(T0 + 60_000)  # every lease lapsed
    first = q.claim("w", limit=1, lease_ms=30_000, reap_limit=1).jobs
    # One step of held jobs promoted (one of them leased back), the rest still held.
    # (before: 1,000 a step, all of them at once)
    assert limit - KEY_STEP_PER_CALL - 1 <= client.zcard(held) <= limit - KEY_STEP_PER_CALL
    ran = set()
    for j in first:
        q.complete(j.id, j.token)
        ran.add(j.id)
    for _ in range(100):
        jobs = q.claim("w", limit=1_000, lease_ms=30_000, reap_limit=0).jobs
        if not jobs and not q.counts().due and not client.zcard(held):
            break
        q.complete_many([(j.id, j.token, None) for j in jobs])
        ran |= {j.id for j in jobs}
    # The lapsed leases' jobs are retried by the reaper (reap_limit 0 above): the held ones ran.
    assert set(ids) - ran <= set(client.zrange(q.keys.prefix + "flow:ck:k", 0, -1)) | set(
        client.zrange(q.keys.leased, 0, -1)
    )
    assert client.zcard(held) == 0 and q.counts().due == 0


def test_a_wide_claim_behind_a_full_key_sets_aside_a_bounded_part(q: Queue) -> None:
    spec = {"concurrency_key": "k", "concurrency_limit": 1}
    hot = q.enqueue_many([JobSpec("hot", i, **spec) for i in range(1_000)])  # type: ignore[arg-type]
    plain = q.enqueue_many([JobSpec("plain", i) for i in range(10)])
    first = q.claim("w", limit=1_000).jobs
    assert [j.id for j in first] == hot[:1]
    aside = min(1_000, SET_ASIDE_OF_BATCH) + HOLD_BUDGET  # before: 999, the whole backlog
    assert q.counts().held_key_limit == aside
    got: set[str] = set()
    for _ in range(10):
        got |= {j.id for j in q.claim("w", limit=1_000).jobs}
        if set(plain) <= got:
            break
    assert got == set(plain)  # reached once the backlog is set aside, a claim after another
    assert q.counts().held_key_limit == len(hot) - 1


def test_settling_many_leases_goes_in_several_calls_and_settles_all(q: Queue) -> None:
    n = 2 * SETTLE_CHUNK + 7
    q.enqueue_many([JobSpec("t", i) for i in range(n)])
    leases = [(j.id, j.token) for j in q.claim("w", limit=1_000, lease_ms=60_000).jobs]
    assert len(leases) == n
    assert q.heartbeat(leases, lease_ms=60_000)
    q.release(leases[:SETTLE_CHUNK])
    assert q.counts().due == SETTLE_CHUNK
    q.complete_many([(i, t, None) for i, t in leases[SETTLE_CHUNK:]])
    c = q.counts()
    assert (c.leased, c.due) == (0, SETTLE_CHUNK)
    assert {q.get_job(i).state for i, _ in leases[SETTLE_CHUNK:]} == {"done"}
