"""redis-py re-sends a script after a timeout (up to 10 more times by default). Every
transition must leave the same state, and give the same answer, when it arrives twice."""

from __future__ import annotations

from typing import Any

import redis

from scheduler import Queue
from scheduler.core.claim_reply import CLAIM_FIELDS
from scheduler.operations.ops import Script
from tests.conftest import Clock, dump_queue


def twice(q: Queue, client: redis.Redis, name: str, args: list[str]) -> tuple[Any, Any]:
    first = q._execute(Script(name, args))
    after_first = dump_queue(client, q)
    second = q._execute(Script(name, args))
    assert dump_queue(client, q) == after_first, f"{name} sent twice changed the state again"
    return first, second


ENQ = ["j1", "t", '{"a":1}', "in", "0", "3", "1000,2.0,60000,0.0", "0", "", "1000", "", ""]


def test_each_transition_sent_twice_equals_once(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_s(100)
    first, second = twice(q, client, "enqueue", ["1", *ENQ])
    assert first == ["c"] and second == ["e"]

    idem = ENQ.copy()
    # The key's TTL is real time (PX), not the test clock's: 10 min, so it cannot lapse between
    # the two dumps of a step on a loaded machine (CI: listed by SCAN, gone by its TYPE at 1 s).
    idem[0], idem[8], idem[9] = "j2", "k" * 64, "600000"
    twice(q, client, "enqueue", ["1", *idem])
    other = idem.copy()
    other[0] = "j3"  # a different id with the same idempotency key: the first job's id
    assert q._execute(Script("enqueue", ["1", *other])) == ["e", 1, "j2"]

    first, second = twice(q, client, "claim", ["w", "1", "30000", "n0nce", "100"])
    assert first == second and first[2] == 1
    token = first[4]
    j = first[3]

    first, second = twice(q, client, "heartbeat", ["30000", j, token])
    assert first == second == ["130000", "held"]

    first, second = twice(q, client, "fail", [j, token, "1", "E", "m", "tb", "0.5", ""])
    assert first == second and first[0] == "retry"

    clock.set_s(200)
    claim2, _ = twice(q, client, "claim", ["w", "10", "30000", "n0nce2", "100"])
    ids = claim2[3::CLAIM_FIELDS][: claim2[2]]
    tokens = dict(zip(ids, claim2[4::CLAIM_FIELDS], strict=False))
    first, second = twice(q, client, "release", ["j2", tokens["j2"]])
    assert first == second == ["released"]
    assert q.get_job("j2").attempts == 0

    first, second = twice(q, client, "complete", ["60000", j, tokens[j], '"ok"'])
    assert first == second == ["done"]

    claim3 = q._execute(Script("claim", ["w", "10", "30000", "n0nce3", "100"]))
    tok = claim3[4]
    first, second = twice(q, client, "fail", ["j2", tok, "0", "E", "m", "tb", "0.1", ""])
    assert first == second == ["dead", "non-retryable error"]

    first, second = twice(q, client, "requeue_dead", ["j2"])
    assert (first, second) == (1, 0)
    first, second = twice(q, client, "cancel", ["j2", "60000"])
    assert (first, second) == ("due", "cancelled")

    dead_id = q.enqueue("t", None, max_attempts=1)
    (c,) = q.claim("w", limit=1).jobs
    q.fail(c.id, c.token, RuntimeError("x"))
    first, second = twice(q, client, "purge_dead", [dead_id])
    assert (first, second) == (1, 0)
