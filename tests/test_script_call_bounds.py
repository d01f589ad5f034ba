"""Work bounds of one script call (Redis runs one script at a time: every client of the server
waits for it; bench/lua_call_bounds.py has the figures). Each bound is a count of jobs per call,
and the work past it still completes over successive calls through the public API."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler import BadArgument, JobSpec, Queue
from scheduler.client.chain import chain
from scheduler.core.codec import LIMITS, enqueue_args
from scheduler.core.connection import connect
from scheduler.core.limits import ENQUEUE_PER_CALL, REAP_PER_CALL
from scheduler.operations.ops import Script
from tests.conftest import Clock, dump_queue
from tests.redis_server import RedisProcess

LUA = Path(__file__).resolve().parent.parent / "lua"


def _lua_constant(path: str, name: str) -> int:
    found = re.findall(rf"^local {name} = (\d+)\b", (LUA / path).read_text(), re.MULTILINE)
    assert len(found) == 1, f"{path}: {name} not found once"
    return int(found[0])


HOLD_BUDGET = _lua_constant("lib/flow.lua", "FLOW_HOLD_BUDGET")


def test_the_per_call_bounds_agree_between_lua_python_and_the_docs() -> None:
    assert _lua_constant("claim.lua", "REAP_STEP") == REAP_PER_CALL
    assert _lua_constant("enqueue.lua", "MAX_BATCH") == ENQUEUE_PER_CALL
    # The bounds are below the largest values the clients send, which stay accepted.
    assert LIMITS["reap_limit"][1] > REAP_PER_CALL
    assert LIMITS["batch_size"][1] > ENQUEUE_PER_CALL
    docs = (Path(__file__).resolve().parent.parent / "docs" / "limits.md").read_text()
    assert f"{REAP_PER_CALL:,} per call" in docs and f"{ENQUEUE_PER_CALL:,} per call" in docs


@pytest.fixture
def counted(module_server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the module's own server (its command statistics are this test's)."""
    c = connect(module_server.url)
    c.flushall()
    yield c
    c.close()


def _evals(c: redis.Redis) -> int:
    stats = c.info("commandstats")
    # Script calls that ran: a NOSCRIPT answer (before the first load) is counted as failed.
    return sum(
        int(st.get("calls", 0)) - int(st.get("failed_calls", 0)) - int(st.get("rejected_calls", 0))
        for st in (stats.get(f"cmdstat_{n}", {}) for n in ("eval", "evalsha"))
    )


def test_enqueue_many_of_10000_at_the_largest_batch_size_goes_as_bounded_calls(
    counted: redis.Redis,
) -> None:
    q = Queue(counted, "bounds")
    largest = LIMITS["batch_size"][1]
    assert largest == 10_000  # still accepted: callers that pass it keep working
    before = _evals(counted)
    ids = q.enqueue_many([JobSpec("t", {"i": i}) for i in range(10_000)], batch_size=largest)
    assert _evals(counted) - before == math.ceil(10_000 / ENQUEUE_PER_CALL)
    assert len(set(ids)) == 10_000
    assert q.counts().due == 10_000
    assert None not in counted.zmscore(q.keys.due, ids)


def test_the_script_refuses_a_call_past_its_bound_and_writes_nothing(
    q: Queue, client: redis.Redis
) -> None:
    """An older client's single call of more jobs: a typed error, nothing written."""
    q.enqueue("t")
    before = dump_queue(client, q)
    args = enqueue_args([JobSpec("t", i) for i in range(ENQUEUE_PER_CALL + 1)], 1 << 20)
    with pytest.raises(BadArgument, match="n="):
        q._execute(Script("enqueue", args))
    assert dump_queue(client, q) == before
    args = enqueue_args([JobSpec("t", i) for i in range(ENQUEUE_PER_CALL)], 1 << 20)
    q._execute(Script("enqueue", args))
    assert q.counts().due == ENQUEUE_PER_CALL + 1


def test_a_chain_is_one_call_so_it_has_at_most_the_calls_bound_of_steps(
    q: Queue, client: redis.Redis
) -> None:
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=f"at most {ENQUEUE_PER_CALL} steps"):
        chain(q, [("t", i) for i in range(ENQUEUE_PER_CALL + 1)])
    assert dump_queue(client, q) == before
    ids = chain(q, [("t", i) for i in range(ENQUEUE_PER_CALL)])
    assert len(set(ids)) == ENQUEUE_PER_CALL
    c = q.counts()  # the first step due, each other waiting for the one before
    assert (c.due, c.held_waiting) == (ENQUEUE_PER_CALL, ENQUEUE_PER_CALL - 1)


def test_reaping_10000_lapsed_leases_completes_over_successive_claims(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    n = 10_000
    q.enqueue_many([JobSpec("t", i) for i in range(n)])
    while q.claim("w", limit=1000, lease_ms=1_000, reap_limit=0).jobs:
        pass
    assert q.counts().leased == n
    clock.set_ms(5_000)  # every lease lapsed
    # The largest reap_limit is still taken; one call reaps its bound, the rest stay leased.
    q.claim("w", limit=0, reap_limit=LIMITS["reap_limit"][1])
    c = q.counts()
    assert (c.leased, c.due) == (n - REAP_PER_CALL, REAP_PER_CALL)
    calls = 1
    while q.counts().leased:
        q.claim("w", limit=0, reap_limit=LIMITS["reap_limit"][1])
        calls += 1
    assert calls == math.ceil(n / REAP_PER_CALL)
    c = q.counts()
    assert (c.leased, c.due, c.dead) == (0, n, 0)
    # Each back once, with its lapse counted, and claimable again.
    got = q.claim("w", limit=5, lease_ms=1_000, reap_limit=0).jobs
    assert [j.attempts for j in got] == [2] * 5


def test_a_claim_behind_a_full_concurrency_key_sets_aside_its_budget_and_moves_on(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    n = 1_000  # more than one claim's budget: the job behind them needs several claims
    q.enqueue_many([JobSpec("t", i, concurrency_key="k", concurrency_limit=1) for i in range(n)])
    clock.set_ms(1_000_001)
    plain = q.enqueue("t", "behind")
    first = q.claim("w", limit=1, lease_ms=600_000, reap_limit=0).jobs
    assert len(first) == 1 and first[0].id != plain  # the key's one slot
    # Each claim sets aside its batch and the budget beyond it (the key is full), no more.
    assert q.claim("w", limit=1, lease_ms=600_000, reap_limit=0).jobs == []
    assert q.counts().held_key_limit == 1 + HOLD_BUDGET
    calls = 1
    taken: list[str] = []
    while not taken:
        taken = [j.id for j in q.claim("w", limit=1, lease_ms=600_000, reap_limit=0).jobs]
        calls += 1
        assert calls <= n, "no progress past the held key"
    assert taken == [plain]
    # Each claim examines its batch and the budget: the held jobs, then the one behind them.
    assert calls == math.ceil(n / (1 + HOLD_BUDGET))
    c = q.counts()
    assert (c.leased, c.held_key_limit) == (2, n - 1)
