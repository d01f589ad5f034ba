"""The rate-held jobs one claim brings back (lua/lib/flow.lua flow_rate_due): at most
min(limit, SET_ASIDE_OF_BATCH) + HOLD_BUDGET of those whose slot has come, as many as a claim
may set aside (bench/lua_call_bounds.py ratewide has the figures). Before, limit + HOLD_BUDGET:
a claim of 1,000 read, sent back or gave a new slot to 1,200 rate-held jobs in one call. The
others keep their passed slot and are seen to by the next claims: none is lost, none starts
before its window has room. Server time is the test clock (fq), so each window is exact."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import redis

from scheduler import JobSpec, Queue
from scheduler.core.limits import HOLD_BUDGET, SET_ASIDE_OF_BATCH
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock

ROOT = Path(__file__).resolve().parent.parent
COUNT, WINDOW = 100, 1_000
RATE: dict[str, Any] = {"rate_limit": (COUNT, WINDOW), "rate_key": "r"}
BOUND = min(1_000, SET_ASIDE_OF_BATCH) + HOLD_BUDGET


def _claim(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=1_000, lease_ms=600_000, reap_limit=0).jobs]


def _passed(client: redis.Redis, q: Queue, now: int) -> int:
    """Rate-held jobs whose slot has come and that no claim has seen to since."""
    return int(client.zcount(q.keys.flow_rheld, "-inf", now))


def test_the_bound_is_claims_set_aside_bound_in_lua_and_the_docs() -> None:
    text = (ROOT / "lua" / "lib" / "flow.lua").read_text()
    body = re.search(r"local function flow_rate_due\(.*?\nend\n", text, re.DOTALL)
    assert body and "flow_moved_max(limit)" in body.group(0)
    docs = (ROOT / "docs" / "limits.md").read_text()
    assert f"brings back at most min(limit, {SET_ASIDE_OF_BATCH}) + {HOLD_BUDGET} rate-held" in docs


def test_a_wide_claim_brings_back_a_bounded_part_and_the_rest_comes_later(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    ids = q.enqueue_many([JobSpec("t", i, **RATE) for i in range(COUNT + 1_000)])
    assert _claim(q) == ids[:COUNT]
    while client.zcard(q.keys.due):  # the set-aside bound: a claim after another
        assert _claim(q) == []
    assert client.zcard(q.keys.flow_rheld) == 1_000
    now = T0 + 10 * WINDOW  # every slot has come
    clock.set_ms(now)
    started: dict[int, list[str]] = {now: _claim(q)}
    assert len(started[now]) == COUNT
    # One bound's worth seen to (COUNT back and started, the rest given the next window's
    # slot); the others keep their passed slot. Before: all 1,000 in this one call.
    assert _passed(client, q, now) == 1_000 - BOUND
    for left in (1_000 - 2 * BOUND, 1_000 - 3 * BOUND, 0):
        assert _claim(q) == []  # the window is full: each claim gives a bound's worth a slot
        assert _passed(client, q, now) == max(left, 0)
    for _ in range(100):
        if not client.zcard(q.keys.flow_rheld):
            break
        if not _passed(client, q, now):
            now += WINDOW
            clock.set_ms(now)
        started.setdefault(now, []).extend(_claim(q))
    got = [i for batch in started.values() for i in batch]
    assert sorted(got) == sorted(ids[COUNT:])  # every one ran once, none lost
    # None early: the starts of each window (claims WINDOW apart) stay within its count.
    assert max(len(b) for b in started.values()) == COUNT
    assert client.zcard(q.keys.due) == 0 and client.zcard(q.keys.prefix + "flow:held") == 0
