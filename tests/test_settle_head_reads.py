"""fail.lua and cancel.lua read a job's spec record from its head, and a cancelled job drops its
payload (a review of the settling paths with 512 KiB payloads).

The record is `2|task|max_attempts|backoff|timeout_ms|enqueued_ms|result_ttl_ms|flags|payload`
(lua/lib/job.lua). fail needs the budget, the backoff and the start deadline, cancel the
retention and the flags: all before the payload. Each GET of the record copied the whole
payload into the script to read those few bytes (fail of a job keeping the default
max_attempts or backoff, which stay in the record only; cancel of a job never claimed, read
twice: its fields, then to pin its enqueued_ms). A retry re-arms the job and a park keeps it
where it is: neither copies the payload, which stays in the record. A cancelled job is finished,
as a done one is: nothing runs or requeues it, so its payload goes unless it asked
`keep_payload=True` (the record's head stays: status, get_job, its retention).

Script calls are read from SLOWLOG as tests/test_review_large_payloads.py reads them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler.cli.job_view import job_json
from scheduler.core.connection import connect
from tests.redis_server import RedisProcess
from tests.test_review_large_payloads import BIG, Entry, calls, logged

SPEC_HEAD_BYTES = 1024  # lua/lib/job.lua job_spec's head read


@pytest.fixture
def raw(module_server: RedisProcess) -> Iterator[redis.Redis]:
    """Bytes replies (SLOWLOG entries as Redis wrote them), on a flushed server."""
    c = redis.Redis.from_url(module_server.url)
    c.flushall()
    yield c
    c.flushall()
    c.close()


@pytest.fixture
def q(module_server: RedisProcess, raw: redis.Redis) -> Iterator[Queue]:
    """The scripts loaded first: a call's NOSCRIPT would be logged as one more call."""
    c = connect(module_server.url)
    Queue(c, "preload").preload()
    yield Queue(c, "sh-" + uuid.uuid4().hex[:10])
    c.close()


def whole_reads(log: list[Entry], q: Queue, job_id: str) -> list[Entry]:
    """The GETs of the job's spec record its scripts made (a GETRANGE of its head is none)."""
    key = q.keys.spec(job_id).encode()
    return [e for e in log if e.inner and e.args[0].upper() == b"GET" and e.args[1] == key]


def claim_one(q: Queue, job_id: str) -> str:
    """Claim the job; its token."""
    (job,) = q.claim("sh-w", limit=1, lease_ms=600_000).jobs
    assert job.id == job_id
    return job.token


def fail_of(raw: redis.Redis, q: Queue, job_id: str, token: str, **options: Any) -> str:
    """One fail call, logged: its outcome's status, once it read no whole record."""
    with logged(raw) as log:
        out = q.fail(job_id, token, ("ValueError", "no", ""), **options)
    assert len(calls(log, "fail")) == 1
    assert whole_reads(log, q, job_id) == []
    return out.status


def test_a_retry_reads_no_payload_and_runs_again_with_it(raw: redis.Redis, q: Queue) -> None:
    """Default max_attempts and backoff: both in the record alone, read from its head."""
    jid = q.enqueue("sh.big", BIG)
    assert fail_of(raw, q, jid, claim_one(q, jid), delay_ms=0) == "retry"
    (job,) = q.claim("sh-w", limit=1).jobs
    assert (job.id, job.attempts, job.payload()) == (jid, 2, BIG)


@pytest.mark.parametrize(
    ("options", "fail_options", "reason"),
    [
        ({}, {"retryable": False}, "non-retryable error"),
        ({"max_attempts": 1}, {}, "attempts exhausted"),
        ({"start_within_ms": 60_000}, {"delay_ms": 3_600_000}, "start deadline passed"),
    ],
    ids=["non-retryable", "attempts-exhausted", "start-deadline"],
)
def test_a_park_reads_no_payload_and_keeps_it(
    raw: redis.Redis, q: Queue, options: dict[str, Any], fail_options: dict[str, Any], reason: str
) -> None:
    jid = q.enqueue("sh.big", BIG, **options)
    assert fail_of(raw, q, jid, claim_one(q, jid), **fail_options) == "dead"
    dead = q.get_job(jid)
    assert (dead.state, dead.dead_reason, dead.payload()) == ("dead", reason, BIG)
    assert q.requeue_dead([jid]) == 1
    (job,) = q.claim("sh-w", limit=1).jobs
    assert (job.id, job.payload()) == (jid, BIG)


def test_a_parked_parent_leaves_its_waiting_childs_payload(raw: redis.Redis, q: Queue) -> None:
    """The park's flow step parks the children that wait for it: theirs stay too."""
    parent = q.enqueue("sh.big", BIG, max_attempts=1)
    child = q.enqueue("sh.big", BIG, after=[parent])
    assert fail_of(raw, q, parent, claim_one(q, parent)) == "dead"
    assert q.get_job(child).state == "dead"
    assert q.get_job(child).payload() == BIG
    assert q.requeue_dead([parent, child]) == 2
    (job,) = q.claim("sh-w", limit=1).jobs
    assert job.id == parent and job.payload() == BIG


def cancel_of(raw: redis.Redis, q: Queue, job_id: str) -> str:
    """One cancel call, logged: the state it answers, once it read no whole record."""
    with logged(raw) as log:
        was = q.cancel(job_id)
    assert len(calls(log, "cancel")) == 1
    assert whole_reads(log, q, job_id) == []
    return was


def _due(q: Queue) -> str:
    return q.enqueue("sh.big", BIG)


def _scheduled(q: Queue) -> str:
    return q.enqueue("sh.big", BIG, delay_ms=3_600_000)


def _leased(q: Queue) -> str:
    jid = q.enqueue("sh.big", BIG)
    claim_one(q, jid)
    return jid


def _retrying(q: Queue) -> str:
    jid = q.enqueue("sh.big", BIG)
    q.fail(jid, claim_one(q, jid), ("ValueError", "no", ""), delay_ms=3_600_000)
    return jid


@pytest.mark.parametrize(
    ("make", "was"),
    [(_due, "due"), (_scheduled, "scheduled"), (_leased, "leased"), (_retrying, "scheduled")],
    ids=["due", "scheduled", "leased", "retrying"],
)
def test_cancel_reads_no_payload_and_drops_it(
    raw: redis.Redis, q: Queue, make: Callable[[Queue], str], was: str
) -> None:
    jid = make(q)
    before = q.get_job(jid)
    assert cancel_of(raw, q, jid) == was
    job = q.get_job(jid)
    assert (job.state, job.task, job.payload_json) == ("cancelled", "sh.big", "")
    # The record's head stays, its payload gone, and both expire with the record.
    spec = raw.get(q.keys.spec(jid))
    assert isinstance(spec, bytes) and len(spec) < SPEC_HEAD_BYTES and spec.endswith(b"|")
    assert raw.pttl(q.keys.spec(jid)) > 0 and raw.pttl(q.keys.job(jid)) > 0
    # What status and `jobs show` read of it is as it was.
    for name in ("run_at_ms", "enqueued_ms", "max_attempts", "backoff", "timeout_ms"):
        assert job.fields.get(name) == before.fields.get(name), name
    assert q.status(jid) == "cancelled"
    # Dropped on purpose, as a lean finished job's: not a damaged payload.
    assert job.payload_dropped
    with pytest.raises(ValueError, match="cancelled and its payload was not kept"):
        job.payload()
    shown = job_json(job, 0)
    assert (shown["payload_dropped"], shown["payload_error"]) == (True, None)


def test_cancel_keeps_a_payload_the_job_asked_to_keep(raw: redis.Redis, q: Queue) -> None:
    leased = q.enqueue("sh.big", BIG, keep_payload=True)
    claim_one(q, leased)
    waiting = q.enqueue("sh.big", BIG, keep_payload=True, delay_ms=3_600_000)
    due = q.enqueue("sh.big", BIG, keep_payload=True)
    assert cancel_of(raw, q, leased) == "leased"
    assert cancel_of(raw, q, waiting) == "scheduled"
    assert cancel_of(raw, q, due) == "due"
    for jid in (leased, waiting, due):
        job = q.get_job(jid)
        assert (job.state, job.payload(), job.payload_dropped) == ("cancelled", BIG, False)


def test_cancel_drops_a_schedule_runs_payload_from_its_hash(raw: redis.Redis, q: Queue) -> None:
    """A schedule's run is a hash alone (no spec record): its payload field goes."""
    q.schedule("sh-s", "sh.small", {"x": 1}, every_ms=3_600_000)
    (run,) = [i.decode() for i in raw.zrange(q.keys.due, 0, -1) if isinstance(i, bytes)]
    assert q.get_job(run).payload() == {"x": 1}
    assert q.cancel(run) == "scheduled"
    job = q.get_job(run)
    assert (job.state, job.task, "payload" in job.fields) == ("cancelled", "sh.small", False)


def test_a_cancelled_parents_waiting_child_keeps_its_payload(raw: redis.Redis, q: Queue) -> None:
    parent = q.enqueue("sh.big", {"p": 1}, delay_ms=3_600_000)
    child = q.enqueue_many([JobSpec("sh.big", BIG, after=[parent])])[0]
    assert cancel_of(raw, q, parent) == "scheduled"
    got = q.get_job(child)
    assert (got.state, got.dead_reason) == ("dead", f"parent cancelled: {parent}")
    assert got.payload() == BIG
