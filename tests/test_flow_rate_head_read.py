"""A rate window's step (lua/lib/flow.lua flow_rate_due) looks for a start deadline in each job
it gives room to: the flags sit before the payload, so it reads the spec record's head
(GETRANGE), not the whole record (a GET copied each 512 KiB payload into the script, on top of
the claim's own read of it)."""

from __future__ import annotations

from typing import Any

import redis

from scheduler import Queue
from tests.conftest import FLOW_T0, Clock
from tests.test_review_large_payloads import BIG, logged

RATE = (2, 1_000)


def test_the_rate_step_reads_no_payload(fq: tuple[Queue, Clock], plain: redis.Redis) -> None:
    """`plain`: the same server, replies as bytes (SLOWLOG's arguments)."""
    q, clock = fq
    raw = plain
    rated: dict[str, Any] = {"rate_limit": RATE, "rate_key": "r"}
    first = [q.enqueue("t", **rated) for _ in range(2)]  # fill the first window
    big = [q.enqueue("t", BIG, start_within_ms=60_000, **rated) for _ in range(2)]
    assert sorted(j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs) == sorted(first)
    clock.set_ms(FLOW_T0 + 2_000)  # a new window: room for both, neither past its deadline
    with logged(raw) as log:
        got = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert sorted(j.id for j in got) == sorted(big)
    assert [j.payload() for j in got] == [BIG, BIG]
    specs = {q.keys.spec(i).encode() for i in big}
    whole = [e.args[1] for e in log if e.inner and e.args[0] == b"GET" and e.args[1] in specs]
    # The claim reads each taken job's record whole once, for its payload; nothing else does.
    assert sorted(whole) == sorted(specs), whole


def test_the_rate_step_still_parks_a_job_past_its_start_deadline(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    rated: dict[str, Any] = {"rate_limit": RATE, "rate_key": "r"}
    first = [q.enqueue("t", **rated) for _ in range(2)]
    late = q.enqueue("t", BIG, start_within_ms=1_000, **rated)
    assert sorted(j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs) == sorted(first)
    clock.set_ms(FLOW_T0 + 5_000)  # its window has room, its deadline passed
    assert q.claim("w", limit=10, lease_ms=60_000).jobs == []
    assert q.status(late) == "dead"
