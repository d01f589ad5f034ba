"""A rate log's starts stamped later than now (the server clock stepped back) are moved to now
a bounded number per claim (lib/flow.lua flow_rate_clamp): a log of 100,000 such starts held
the server 290 ms in one claim (bench/lua_call_bounds.py rate), every client of that Redis
waiting. The ones not moved yet read as at now, so the window's answer is unchanged."""

from __future__ import annotations

from typing import Any

import redis

from scheduler import Queue
from tests.conftest import Clock

T0 = 10_000_000_000  # a server time, ms
SEC, HOUR, DAY = 1_000, 3_600_000, 86_400_000
STEP = 1_000  # lib/flow.lua FLOW_CLAMP_STEP


def _log(client: redis.Redis, q: Queue, key: str, n: int, window: int, count: int) -> str:
    """n starts of `key` logged at T0, in the log's own member form."""
    rk = q.keys.prefix + "flow:rate:" + key
    client.zadd(rk, {f"{window:08d}:{count:06d}:j{i}:1": T0 for i in range(n)})
    return rk


def _late(client: redis.Redis, rk: str, now: int) -> int:
    return int(client.zcount(rk, f"({now}", "+inf"))


def test_a_claim_moves_a_bounded_number_of_late_starts(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """5,000 starts at T0, the clock back an hour: each claim that reads the log moves at most
    1,000 of them to now (before: all 5,000 in the first claim), and the job is held until
    one window from now, as when all are moved."""
    q, clock = tq
    rated: dict[str, Any] = {"rate_limit": (5_000, DAY), "rate_key": "r"}
    rk = _log(client, q, "r", 5_000, DAY, 5_000)
    now = T0 - HOUR
    clock.set_ms(now)
    held = q.enqueue("t", 0, **rated)
    assert q.claim("w", limit=10).jobs == []
    assert _late(client, rk, now) == 5_000 - STEP
    reason = q.get_job(held).fields["flow_reason"]
    assert reason.endswith(f"until {now + DAY}"), reason
    for k in range(2, 6):
        q.enqueue("t", k, **rated)
        assert q.claim("w", limit=10).jobs == []
        assert _late(client, rk, now) == max(5_000 - k * STEP, 0)
    assert client.zcard(rk) == 5_000  # moved, none lost


def test_a_short_window_opens_one_window_after_the_step_back(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """1,500 starts of a 1,500-per-second key at T0, the clock back an hour: the key is shut
    for one window from now, then open, though the first claim moved only 1,000 of them."""
    q, clock = tq
    rated: dict[str, Any] = {"rate_limit": (1_500, SEC), "rate_key": "r"}
    rk = _log(client, q, "r", 1_500, SEC, 1_500)
    clock.set_ms(T0 - HOUR)
    jid = q.enqueue("t", 0, **rated)
    assert q.claim("w", limit=10).jobs == []
    assert _late(client, rk, T0 - HOUR) == 500
    clock.set_ms(T0 - HOUR + SEC - 1)
    assert q.claim("w", limit=10).jobs == []
    clock.set_ms(T0 - HOUR + SEC + 1)
    assert [j.id for j in q.claim("w", limit=10).jobs] == [jid]
