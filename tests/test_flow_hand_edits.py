"""Flow settings edited by hand in redis-cli. A schedule's concurrency limit is a flow setting
every occurrence copies (lib/rearm.lua, through lib/flow.lua's stored reader): a `climit` that
is no number (`HSET schedule:<name> climit many`) made every later occurrence plain, so a
schedule meant to run one at a time ran two at once, without a word. The key is still read, at
the strictest limit (1), as a lease's end already reads it (a limit that cannot be read lets
one held job go)."""

from __future__ import annotations

import redis

from scheduler import Queue
from tests.conftest import Clock

EVERY_MS = 10_000
START_MS = 1_000 * EVERY_MS + 1


def leased_runs(client: redis.Redis, q: Queue) -> list[str]:
    ids = [str(i) for i in client.zrange(q.keys.leased, 0, -1)]
    return [i for i in ids if i.startswith("schedule:slow:")]


def test_a_schedules_limit_edited_into_no_number_still_limits_its_runs(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    assert q.schedule(
        "slow", "export", every_ms=EVERY_MS, concurrency_key="exp", concurrency_limit=1
    )
    client.hset(q.keys.schedule("slow"), "climit", "many")  # by hand
    now = START_MS
    for _ in range(4):  # each run outlasts its period: the next one comes due while it runs
        now += EVERY_MS
        clock.set_ms(now)
        q.claim("w", limit=10, lease_ms=10 * 60_000)
        assert len(leased_runs(client, q)) == 1
    held = [str(i) for i in client.zrange(q.keys.prefix + "flow:ckheld:exp", 0, -1)]
    assert held and all(i.startswith("schedule:slow:") for i in held)
