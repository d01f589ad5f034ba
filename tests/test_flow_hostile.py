"""Hand-edited flow records (lua/lib/flow.lua): a bad child or an advisory field edited by hand
must not make a settlement raise after its first write (Redis keeps the partial writes: the job
left in neither leased nor due, every later job of the call stranded), nor hide the job's
concurrency key (its slot never released, the key's held jobs never promoted)."""

from __future__ import annotations

import redis

from scheduler import Queue


def _lease(q: Queue, want: int) -> dict[str, str]:
    jobs = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert len(jobs) == want
    return {j.id: j.token for j in jobs}


def _claim_ids(q: Queue) -> set[str]:
    return {j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs}


def _settled(client: redis.Redis, q: Queue, job_id: str, state: str) -> None:
    assert client.hget(q.keys.job(job_id), "state") == state
    assert client.zscore(q.keys.leased, job_id) is None
    assert client.zscore(q.keys.due, job_id) is None


def test_a_child_count_edited_by_hand_does_not_strand_the_parent_or_the_call(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 0, job_id="P")
    q.enqueue("t", 1, job_id="X")
    q.enqueue("t", 2, job_id="good", after=["P"])
    q.enqueue("t", 3, job_id="bad", after=["P"])
    tokens = _lease(q, 2)
    client.hset(q.keys.job("bad"), "waiting_for", "x")
    # P first: before the fix its HINCRBY raised after leased was ZREMed for both.
    assert q.complete_many([("P", tokens["P"], 1), ("X", tokens["X"], 2)]) == ["done", "done"]
    _settled(client, q, "P", "done")
    _settled(client, q, "X", "done")
    assert q.get_job("good").state == "due"
    # An unreadable count counts as this parent alone: the child is due too, not stranded.
    assert q.get_job("bad").state == "due"
    assert _claim_ids(q) == {"good", "bad"}
    assert client.zcard(q.keys.prefix + "flow:waiting") == 0
    # A re-sent call is answered as the first one was.
    assert q.complete_many([("P", tokens["P"], 1), ("X", tokens["X"], 2)]) == ["done", "done"]


def test_a_count_above_one_is_written_back_and_counted_down(q: Queue, client: redis.Redis) -> None:
    q.enqueue("t", 0, job_id="P1")
    q.enqueue("t", 0, job_id="P2")
    q.enqueue("t", 1, job_id="C", after=["P1", "P2"])
    tokens = _lease(q, 2)
    q.complete("P1", tokens["P1"], None)
    assert client.hget(q.keys.job("C"), "waiting_for") == "1"
    assert q.get_job("C").fields["flow_reason"] == "waiting for 1 jobs"
    assert _claim_ids(q) == set()
    q.complete("P2", tokens["P2"], None)
    assert _claim_ids(q) == {"C"}


def test_a_child_key_of_another_type_is_skipped_by_complete(q: Queue, client: redis.Redis) -> None:
    q.enqueue("t", 0, job_id="P")
    q.enqueue("t", 1, job_id="X")
    q.enqueue("t", 2, job_id="good", after=["P"])
    q.enqueue("t", 3, job_id="odd", after=["P"])
    tokens = _lease(q, 2)
    client.delete(q.keys.job("odd"))
    client.set(q.keys.job("odd"), "not a hash")
    assert q.complete_many([("P", tokens["P"], 1), ("X", tokens["X"], 2)]) == ["done", "done"]
    _settled(client, q, "P", "done")
    _settled(client, q, "X", "done")
    assert _claim_ids(q) == {"good"}
    assert client.get(q.keys.job("odd")) == "not a hash"  # left as it was, for doctor


def test_a_child_key_of_another_type_is_parked_by_id_when_its_parent_dies(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 0, job_id="P")
    q.enqueue("t", 1, job_id="odd", after=["P"])
    q.enqueue("t", 2, job_id="grand", after=["odd"])
    tokens = _lease(q, 1)
    client.delete(q.keys.job("odd"))
    client.set(q.keys.job("odd"), "not a hash")
    assert q.fail("P", tokens["P"], RuntimeError("boom"), retryable=False).status == "dead"
    _settled(client, q, "P", "dead")
    assert client.zscore(q.keys.dead, "odd") is not None
    assert client.zscore(q.keys.prefix + "flow:waiting", "odd") is None
    # Its own child is parked in turn, with the reason.
    assert q.get_job("grand").dead_reason == "parent dead: odd"


def test_a_hand_edited_priority_does_not_hide_the_key_on_complete(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 0, job_id="A", concurrency_key="K", concurrency_limit=1)
    q.enqueue("t", 1, job_id="B", concurrency_key="K", concurrency_limit=1)
    tokens = _lease(q, 1)
    assert q.get_job("B").fields["flow_reason"] == "limited by key K (1 leased)"
    client.hset(q.keys.job("A"), "priority", "high")
    assert q.complete_many([("A", tokens["A"], 1)]) == ["done"]
    # Before the fix A read as plain: its slot stayed taken, B stayed in flow:ckheld:K.
    assert client.zcard(q.keys.prefix + "flow:ckheld:K") == 0
    assert _claim_ids(q) == {"B"}


def test_a_hand_edited_rate_field_does_not_hide_the_key_on_fail(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 0, job_id="A", concurrency_key="K", concurrency_limit=1, rate_limit="50/1h")
    q.enqueue("t", 1, job_id="B", concurrency_key="K", concurrency_limit=1, rate_limit="50/1h")
    tokens = _lease(q, 1)
    client.hset(q.keys.job("A"), "rcount", "lots")
    q.fail("A", tokens["A"], RuntimeError("boom"), retryable=False)
    assert client.zcard(q.keys.prefix + "flow:ckheld:K") == 0
    assert _claim_ids(q) == {"B"}
