"""What a claimed job's hash holds (issue 16, docs/performance.md section 10): first claim copies
only the spec fields a finished job keeps or that change (task, max_attempts, run_at_ms,
enqueued_ms); backoff and timeout_ms are read from the spec by claim and fail. Complete leaves
the same lean record as before, for jobs of this layout and for hashes an older claim wrote."""

from __future__ import annotations

import redis

from scheduler import Backoff, JobState, Queue
from tests.old_layout import old_enqueue

# max_attempts only when it is not the default 5 (an old-layout hash always has it).
LEAN = {"state", "result", "finished_ms", "settled_token", "settled", "attempts"}
LEAN |= {"task", "run_at_ms"}


def test_first_claim_leaves_backoff_and_timeout_in_the_spec(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", 1, backoff=Backoff(base_ms=5_000, jitter=0.0), timeout_ms=30_000)
    (job,) = q.claim("w", limit=1).jobs
    fields = client.hgetall(q.keys.job(jid))
    assert "backoff" not in fields and "timeout_ms" not in fields
    assert job.timeout_ms == 30_000 and job.backoff == Backoff(base_ms=5_000, jitter=0.0)
    got = q.get_job(jid)  # readers merge hash and spec
    assert got.state == JobState.LEASED and got.fields["timeout_ms"] == "30000"
    assert got.fields["backoff"] == "5000,2.0,3600000,0.0"


def test_fail_retries_with_the_specs_backoff_and_the_next_claim_reads_it(
    q: Queue, client: redis.Redis
) -> None:
    jid = q.enqueue("t", 1, backoff=Backoff(base_ms=0, jitter=0.0), timeout_ms=7_000)
    (job,) = q.claim("w", limit=1).jobs
    # base 0: retry at once. Were the default backoff (1 s base) read, it would not be due yet.
    assert q.fail(jid, job.token, ("E", "boom", "")).status == "retry"
    (again,) = q.claim("w", limit=1).jobs
    assert again.id == jid and again.attempts == 2 and again.timeout_ms == 7_000
    assert again.backoff == Backoff(base_ms=0, jitter=0.0)


def test_a_retried_job_completes_lean(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", {"x": "y" * 100}, backoff=Backoff(base_ms=0, jitter=0.0))
    (job,) = q.claim("w", limit=1).jobs
    q.fail(jid, job.token, ("E", "boom", ""))
    (again,) = q.claim("w", limit=1).jobs
    q.complete(jid, again.token, 3)
    fields = set(client.hkeys(q.keys.job(jid)))
    assert fields == LEAN | {"settled_log"}
    assert client.exists(q.keys.spec(jid)) == 0
    assert q.result(jid, timeout_s=1) == 3


def test_a_hash_with_the_copied_fields_still_completes_lean(q: Queue, client: redis.Redis) -> None:
    # An older claim copied backoff/timeout_ms into the hash; an old-layout job has them all.
    jid = q.enqueue("t", 1)
    old = old_enqueue(q, client, "t", '{"old":1}', timeout_ms=5000)
    for job in q.claim("w", limit=2).jobs:
        client.hset(q.keys.job(job.id), mapping={"backoff": "1,2.0,3,0.0", "timeout_ms": "9"})
        q.complete(job.id, job.token)
    assert set(client.hkeys(q.keys.job(jid))) == LEAN
    assert set(client.hkeys(q.keys.job(old))) == LEAN | {"max_attempts"}


def test_the_default_budget_is_not_stored_and_reads_as_5(q: Queue, client: redis.Redis) -> None:
    jid, three = q.enqueue("t", 1), q.enqueue("t", 2, max_attempts=3)
    for job in q.claim("w", limit=2).jobs:
        assert job.max_attempts == (3 if job.id == three else 5)
        q.complete(job.id, job.token)
    assert client.hget(q.keys.job(jid), "max_attempts") is None
    assert client.hget(q.keys.job(three), "max_attempts") == "3"
    assert q.get_job(jid).max_attempts == 5 and q.get_job(three).max_attempts == 3


def test_the_reaper_and_fail_read_the_default_budget_from_the_spec(
    q: Queue, client: redis.Redis
) -> None:
    lapsed, failing = q.enqueue("t", 1), q.enqueue("t", 2)
    q.claim("w", limit=2)
    client.hset(q.keys.job(lapsed), "attempts", "5")  # its budget used up
    client.hset(q.keys.job(failing), "attempts", "4")  # one left
    # The lease of one lapsed: the reaper parks it as claim.lua's step 1 does.
    client.zadd(q.keys.leased, {lapsed: 0})
    assert q.claim("w", limit=1).jobs == []
    assert client.hget(q.keys.job(lapsed), "dead_reason") == "lease expired"
    token = client.hget(q.keys.job(failing), "token")
    assert isinstance(token, str)
    assert q.fail(failing, token, ("E", "boom", "")).status == "retry"  # 4 < 5
