"""The spec-record layout (lua/lib/job.lua): a pending job is one STRING spec:<id>, its hash is
born at first claim, a finished job is lean (payload dropped unless keep_payload), its retention
is per job; jobs of the old hash-only layout (tests/old_layout.py) still go through every
transition."""

from __future__ import annotations

import pytest
import redis

from scheduler import BadArgument, JobNotFound, JobState, Queue
from tests.old_layout import old_enqueue

HOUR_MS = 3_600_000


def dead_reason(q: Queue, client: redis.Redis, job_id: str) -> object:
    return client.hget(q.keys.job(job_id), "dead_reason")


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ("garbage", "invalid job: record"),
        ("3|t|||||||1", "invalid job: record"),  # a layout version this one does not know
        ("2|t|||||", "invalid job: record"),  # fields missing
        ("2|t||||soon|||1", "invalid job: record"),  # enqueued_ms not a number
        ("2|t|||||forever||1", "invalid job: record"),  # result_ttl_ms not a number
        ("2|t|many||||||1", "invalid job: max_attempts"),
        ("2|t||1,x||||||1", "invalid job: backoff"),
        ("2|t|||-5||||1", "invalid job: timeout_ms"),
        ("2|bad task!|||||||1", "invalid job: task"),
    ],
)
def test_a_spec_record_edited_by_hand_parks_only_that_job(
    q: Queue, client: redis.Redis, record: str, reason: str
) -> None:
    bad = q.enqueue("t", 1)
    good = [q.enqueue("t", n) for n in range(3)]
    client.set(q.keys.spec(bad), record)  # as `redis-cli SET` would
    claimed = q.claim("w", limit=10).jobs
    assert sorted(j.id for j in claimed) == sorted(good)
    assert q.dead_ids() == [bad]
    assert dead_reason(q, client, bad) == reason


def test_one_claim_checks_each_records_enqueued_time_text(q: Queue, client: redis.Redis) -> None:
    """claim.lua parses each distinct enqueued_ms text once per call (issue 16, drain): in one
    batch a bad text is refused each time it comes, after a good one and before, and a good
    text after a bad one is still read, as its own."""
    texts = ["500", "1e3", "500", " 5", "1e3", "700", " 5", "500"]
    ids = [q.enqueue("t", n) for n in range(len(texts))]
    for n, (jid, enq) in enumerate(zip(ids, texts, strict=True)):
        client.set(q.keys.spec(jid), f"2|t||||{enq}|||{n}")
        client.zadd(q.keys.due, {jid: 1000 + n})  # claim meets them in this order
    claimed = q.claim("w", limit=len(ids)).jobs
    good = {jid: enq for jid, enq in zip(ids, texts, strict=True) if enq.isdigit()}
    assert sorted(j.id for j in claimed) == sorted(good)
    for jid, enq in good.items():
        assert client.hget(q.keys.job(jid), "enqueued_ms") == enq
    assert sorted(q.dead_ids()) == sorted(set(ids) - set(good))
    for jid in set(ids) - set(good):
        assert dead_reason(q, client, jid) == "invalid job: record"


def test_a_spec_key_of_another_type_parks_only_that_job(q: Queue, client: redis.Redis) -> None:
    bad, good = q.enqueue("t", 1), q.enqueue("t", 2)
    client.delete(q.keys.spec(bad))
    client.rpush(q.keys.spec(bad), "x")
    assert [j.id for j in q.claim("w", limit=10).jobs] == [good]
    assert dead_reason(q, client, bad) == "invalid job: record"


def test_a_lean_finished_job_answers_get_job_status_and_result(
    q: Queue, client: redis.Redis
) -> None:
    jid = q.enqueue("t", {"big": "x" * 200}, max_attempts=3)
    (job,) = q.claim("w", limit=1).jobs
    q.complete(jid, job.token, {"ok": 1})
    assert client.exists(q.keys.spec(jid)) == 0
    assert client.hget(q.keys.job(jid), "payload") is None
    got = q.get_job(jid)
    assert got.state == JobState.DONE and got.task == "t" and got.attempts == 1
    assert got.max_attempts == 3  # kept: a reader compares attempts with it
    assert got.payload_dropped
    with pytest.raises(ValueError, match="not kept"):
        got.payload()
    assert q.status(jid) == JobState.DONE
    assert q.result(jid, timeout_s=1) == {"ok": 1}


def test_keep_payload_keeps_the_payload_once_done(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("t", {"a": 1}, keep_payload=True)
    (job,) = q.claim("w", limit=1).jobs
    q.complete(jid, job.token, 7)
    got = q.get_job(jid)
    assert got.state == JobState.DONE and not got.payload_dropped
    assert got.payload() == {"a": 1}
    assert q.result(jid, timeout_s=1) == 7


@pytest.mark.parametrize("ttl_ms", [60_000, 7 * 24 * HOUR_MS])
def test_per_job_result_ttl_ms_is_the_finished_jobs_expiry(
    q: Queue, client: redis.Redis, ttl_ms: int
) -> None:
    jid, other = q.enqueue("t", 1, result_ttl_ms=ttl_ms), q.enqueue("t", 2)
    for job in q.claim("w", limit=2).jobs:
        q.complete(job.id, job.token)
    # The producer's Queue default (1 h) is what the one without its own gets.
    assert ttl_ms - 10_000 < client.pttl(q.keys.job(jid)) <= ttl_ms
    assert HOUR_MS - 10_000 < client.pttl(q.keys.job(other)) <= HOUR_MS


def test_bad_retention_is_refused_and_nothing_is_written(q: Queue, client: redis.Redis) -> None:
    for bad in (0, -1, 400 * 24 * HOUR_MS):
        with pytest.raises(BadArgument):
            q.enqueue("t", 1, result_ttl_ms=bad)
    assert q.counts().due == 0


# -- jobs written by the version before spec records (every job one hash) ---------------------
def test_an_old_pending_job_is_claimed_heartbeaten_and_completed(
    q: Queue, client: redis.Redis
) -> None:
    jid = old_enqueue(q, client, "t", '{"old":1}', timeout_ms=5000)
    assert q.get_job(jid).state == JobState.DUE
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == jid and job.payload_json == '{"old":1}' and job.timeout_ms == 5000
    _, held = q.heartbeat([(jid, job.token)], lease_ms=60_000)
    assert held == {jid: "held"}
    assert q.get_job(jid).state == JobState.LEASED
    q.complete(jid, job.token, "r")
    got = q.get_job(jid)
    assert got.state == JobState.DONE and got.payload_dropped
    assert q.result(jid, timeout_s=1) == "r"
    assert 0 < client.pttl(q.keys.job(jid)) <= HOUR_MS


def test_an_old_job_fails_to_dead_and_is_requeued(q: Queue, client: redis.Redis) -> None:
    jid = old_enqueue(q, client, "t", "1", max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(jid, job.token, ("E", "boom", ""))
    assert q.dead_ids() == [jid] and q.get_job(jid).state == JobState.DEAD
    assert q.requeue_dead([jid]) == 1
    (again,) = q.claim("w", limit=1).jobs
    assert again.id == jid and again.payload_json == "1"


def test_an_old_job_can_be_cancelled_pending_or_leased(q: Queue, client: redis.Redis) -> None:
    pending = old_enqueue(q, client, "t", "1", delay_ms=HOUR_MS)
    assert q.cancel(pending) == "scheduled"
    assert q.get_job(pending).state == JobState.CANCELLED
    leased = old_enqueue(q, client, "t", "2")
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == leased
    assert q.cancel(leased) == "leased"
    _, held = q.heartbeat([(leased, job.token)], lease_ms=60_000)
    assert held == {leased: "cancelled"}


def test_an_old_finished_job_reads_back(q: Queue, client: redis.Redis) -> None:
    jid = old_enqueue(q, client, "t", "1")
    (job,) = q.claim("w", limit=1).jobs
    q.complete(jid, job.token, 3)
    assert q.status(jid) == JobState.DONE and q.get_job(jid).attempts == 1
    client.delete(q.keys.job(jid))
    with pytest.raises(JobNotFound):
        q.get_job(jid)
