"""Review findings in the fail path (lua/fail.lua, lib/job.lua): a park whose own dead-letter
retention deletes the job must leave no half-written record behind; the error history is cut
to its last entries in one pass, whatever length a hand left in the hash."""

from __future__ import annotations

import json

import pytest
import redis

from scheduler import JobNotFound, JobState, Queue
from tests.conftest import Clock, assert_id_free, assert_no_husk


def test_park_trimmed_by_max_count_zero_leaves_nothing(client: redis.Redis, q: Queue) -> None:
    q.set_dead_retention(max_count=0)
    q.enqueue("t", {}, job_id="a", max_attempts=1)
    j = q.claim("w", limit=10).jobs[0]
    out = q.fail(j.id, j.token, ("E", "m", "tb"))
    assert (out.status, out.dead_reason) == ("dead", "attempts exhausted")
    assert_no_husk(client, q, "a")
    assert client.zcard(q.keys.dead) == 0
    # Re-sent: the record is gone by the queue's own retention; a refusal, never a new state.
    try:
        again = q.fail(j.id, j.token, ("E", "m", "tb"))
    except JobNotFound:
        pass
    else:
        assert again.status == "dead"
    assert_no_husk(client, q, "a")
    assert_id_free(client, q, "a")


def test_non_retryable_park_trimmed_leaves_nothing(client: redis.Redis, q: Queue) -> None:
    q.set_dead_retention(max_count=0)
    q.enqueue("t", {}, job_id="nr")
    j = q.claim("w", limit=10).jobs[0]
    out = q.fail(j.id, j.token, ("E", "m", "tb"), retryable=False)
    assert (out.status, out.dead_reason) == ("dead", "non-retryable error")
    assert_no_husk(client, q, "nr")
    assert_id_free(client, q, "nr")


def test_park_trimmed_in_a_same_ms_tie_leaves_nothing(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """max_count=1, two jobs dead in the same ms: the ZSET tie is broken by id, so the job
    parked second ('a' < 'b') is the one trimmed, inside its own fail."""
    q, clock = tq
    clock.set_ms(1_000_000)
    q.set_dead_retention(max_count=1)
    q.enqueue("t", {}, job_id="b", max_attempts=1)
    q.enqueue("t", {}, job_id="a", max_attempts=1)
    jobs = {j.id: j for j in q.claim("w", limit=10).jobs}
    assert q.fail("b", jobs["b"].token, ("E", "m", "")).status == "dead"
    assert q.fail("a", jobs["a"].token, ("E", "m", "")).status == "dead"
    assert client.zrange(q.keys.dead, 0, -1) == ["b"]
    assert q.status("b") == JobState.DEAD
    assert_no_husk(client, q, "a")
    assert_id_free(client, q, "a")


@pytest.mark.parametrize("n", [0, 3, 9, 10, 11, 5000])
def test_error_history_keeps_the_last_ten(client: redis.Redis, q: Queue, n: int) -> None:
    q.enqueue("t", {}, job_id="e")
    j = q.claim("w", limit=1).jobs[0]
    if n:
        client.hset(q.keys.job("e"), "errors", json.dumps([{"i": i} for i in range(n)]))
    out = q.fail(j.id, j.token, ("E", "new", ""))
    assert out.status == "retry"
    errs = json.loads(client.hget(q.keys.job("e"), "errors") or "null")
    # The new entry is the newest of at most 10 (newest last): the last 9 old ones before it.
    assert [e.get("i") for e in errs[:-1]] == list(range(max(0, n - 9), n))
    assert len(errs) == min(n + 1, 10)
    assert (errs[-1]["type"], errs[-1]["message"], errs[-1]["attempt"]) == ("E", "new", 1)


def test_error_history_not_an_array_is_replaced(client: redis.Redis, q: Queue) -> None:
    """A hand-written JSON object (not an array) is not kept and appended to: the history is
    the new entry alone, an array again (the old in-place trim kept the object, so every
    later failure went into a record readers show as no history at all)."""
    q.enqueue("t", {}, job_id="o")
    j = q.claim("w", limit=1).jobs[0]
    client.hset(q.keys.job("o"), "errors", json.dumps({"x": 1, "y": [2]}))
    assert q.fail(j.id, j.token, ("E", "new", "")).status == "retry"
    errs = json.loads(client.hget(q.keys.job("o"), "errors") or "null")
    assert isinstance(errs, list)
    assert [(e["type"], e["message"]) for e in errs] == [("E", "new")]
    assert [e["message"] for e in q.get_job("o").errors] == ["new"]
