"""The dead retention (lib/job.lua dead_trim) may delete a job inside the very script that parks
it (max_count 0, or a same-ms tie broken by id). Nothing in the rest of that script may then
write into the job's keys or read them as a live job: enqueue's flow_wait (a parent earlier in
the batch parked and trimmed at once) and repair's 'dead' move (the key slot of the parked job)."""

from __future__ import annotations

import redis

from scheduler import JobSpec, JobState, Queue
from scheduler.admin.doctor import repair_queue
from scheduler.admin.inspection import server_now_ms
from tests.conftest import Clock, assert_id_free, assert_no_husk

HOUR_MS = 3_600_000


def _park(q: Queue, job_id: str) -> None:
    q.enqueue("t", {}, job_id=job_id, max_attempts=1)
    (j,) = q.claim("w", limit=1).jobs
    assert q.fail(j.id, j.token, ("E", "m", ""), retryable=False).status == "dead"


def _waiting(client: redis.Redis, q: Queue) -> list[str]:
    return [str(i) for i in client.zrange(q.keys.prefix + "flow:waiting", 0, -1)]


def test_child_of_a_parent_trimmed_in_the_same_batch_is_parked(
    client: redis.Redis, q: Queue
) -> None:
    """x dead, then max_count 0: p (after x) is parked and deleted at once; q (after p) read p
    as pending before the fix: `kids` written into p's deleted hash (a one-field hash with no
    expiry, the id blocked) and q left waiting for good."""
    _park(q, "x")
    q.set_dead_retention(max_count=0)
    ids = q.enqueue_many(
        [JobSpec("t", {}, job_id="p", after=["x"]), JobSpec("t", {}, job_id="q", after=["p"])]
    )
    assert ids == ["p", "q"]
    assert _waiting(client, q) == []
    assert client.zcard(q.keys.prefix + "flow:held") == 0
    assert client.exists(q.keys.prefix + "flow:children:p") == 0
    assert client.zcard(q.keys.dead) == 0  # q too was parked, then trimmed
    assert_no_husk(client, q, "p")
    assert_id_free(client, q, "p")
    assert_no_husk(client, q, "q")
    assert_id_free(client, q, "q")


def test_child_of_a_parent_trimmed_in_a_same_ms_tie_is_parked(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """max_count 1, x and p dead in the same ms: the tie is broken by id ('p' < 'x'), so p is
    the one trimmed, inside the enqueue that parks it."""
    q, clock = tq
    clock.set_ms(1_000_000)
    _park(q, "x")
    q.set_dead_retention(max_count=1)
    q.enqueue_many(
        [JobSpec("t", {}, job_id="p", after=["x"]), JobSpec("t", {}, job_id="q", after=["p"])]
    )
    assert _waiting(client, q) == []
    assert client.exists(q.keys.prefix + "flow:children:p") == 0
    assert client.zrange(q.keys.dead, 0, -1) == ["x"]  # q parked, trimmed in its own tie
    assert q.get_job("x").state == JobState.DEAD
    assert_no_husk(client, q, "p")
    assert_id_free(client, q, "p")
    assert_no_husk(client, q, "q")
    assert_id_free(client, q, "q")


def test_repair_dead_of_a_trimmed_job_frees_its_key_slot(client: redis.Redis, q: Queue) -> None:
    """doctor parks a lapsed lease of key k (limit 1) while max_count is 0: the job is deleted
    by its own park; its slot must still be freed and the held job promoted (before: the flow
    was read after the park, from the deleted hash, as a plain job: k stayed full)."""
    q.enqueue("t", 0, job_id="A", concurrency_key="k", concurrency_limit=1, max_attempts=1)
    q.enqueue("t", 1, job_id="B", concurrency_key="k", concurrency_limit=1)
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["A"]
    ck, held = q.keys.prefix + "flow:ck:k", q.keys.prefix + "flow:ckheld:k"
    assert client.zrange(held, 0, -1) == ["B"]
    q.set_dead_retention(max_count=0)
    client.zadd(q.keys.leased, {"A": server_now_ms(client) - HOUR_MS})
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["lease-expired"]
    assert client.exists(q.keys.job("A"), q.keys.spec("A")) == 0  # trimmed by its own park
    assert client.zrange(ck, 0, -1) == []
    assert client.zrange(held, 0, -1) == []
    assert [j.id for j in q.claim("w", limit=5).jobs] == ["B"]
