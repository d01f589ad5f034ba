"""Hostile stored data and hostile arguments, on a real server (issue 10 items 6, 8, 9; issue 17
items 1 and 5): a job hash edited by hand is parked alone by claim (also on a replayed claim),
the others of its batch are leased; a claim reply always parses; a schedule whose pending
occurrence ends in any way keeps its next occurrence armed; numbers are stored exactly and read
the same strict way; every refused argument changes nothing in Redis; a re-sent release answers
as the first one did even after the job moved on."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import Backoff, BadArgument, CorruptKey, InvalidPayload, JobSpec, Queue
from scheduler.core.codec import (
    CLAIM_FIELDS,
    FLOAT_LIMITS,
    LIMITS,
    MAX_DELAY_MS,
    MAX_TIME_MS,
    claim_args,
    parse_claim,
    stored_int,
)
from scheduler.core.limits import ENQUEUE_PER_CALL
from scheduler.operations.ops import Script
from tests.conftest import Clock, dump_queue

MIN_MS = 60_000


def leased_ids(q: Queue, client: redis.Redis) -> set[str]:
    return set(client.zrange(q.keys.leased, 0, -1))


def reason(q: Queue, client: redis.Redis, job_id: str) -> str | None:
    return client.hget(q.keys.job(job_id), "dead_reason")


# -- claim parks only the job it cannot hand out ---------------------------------------------
HOSTILE = [
    ("timeout_ms", "30s"), ("timeout_ms", "1e3"), ("timeout_ms", "-5"),
    ("timeout_ms", str(LIMITS["timeout_ms"][1] + 1)),
    ("run_at_ms", "nan"), ("run_at_ms", "inf"), ("run_at_ms", "-inf"), ("run_at_ms", "1e400"),
    ("run_at_ms", "0x10"), ("run_at_ms", "12.5"), ("run_at_ms", str(MAX_TIME_MS + 1)),
    ("run_at_ms", " 7"), ("run_at_ms", "-1"),
    ("attempts", "x"), ("attempts", "1e0"), ("attempts", "-1"),
    ("max_attempts", "0"), ("max_attempts", "9.2233720368547758e+18"),
    ("max_attempts", "9223372036854775807"), ("max_attempts", "0x10"),
    ("backoff", "1,2"), ("backoff", "1000,inf,60000,0.1"), ("backoff", "1000,nan,60000,0.1"),
    ("backoff", "0x10,2.0,60000,0.1"), ("backoff", "1000,2.0,60000,2"),
    ("backoff", "1000,0.5,60000,0.1"), ("backoff", "1000,2.0,1e400,0.1"),
    ("backoff", "1000,2.0,60000,-0.1"),
    ("schedule", "no such/name!"), ("task", "bad task"), ("task", ""), ("task", "x" * 201),
    ("payload", b"\xff\xfe"), ("task", b"t\xc3"), ("fence", "abc"),
    ("fence", "9223372036854775807"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_claim_parks_only_the_job_with_a_bad_field(
    q: Queue, client: redis.Redis, field: str, value: str | bytes
) -> None:
    good = [q.enqueue("ok.t", {"n": i}) for i in range(3)]
    # Two jobs with the same bad value: claim checks each distinct task / backoff / timeout
    # once per call, and must not hand out the second because it saw the value before.
    bad = [q.enqueue("ok.t", {"n": "bad"}) for _ in range(2)]
    for b in bad:
        client.hset(q.keys.job(b), field, value)
    batch = q.claim("w", limit=10, lease_ms=30_000)
    assert sorted(j.id for j in batch.jobs) == sorted(good)
    assert batch.unreadable == []
    assert leased_ids(q, client) == set(good)
    assert [reason(q, client, b) for b in bad] == [f"invalid job: {field}"] * 2
    assert sorted(client.zrange(q.keys.dead, 0, -1)) == sorted(bad)
    # The innocent jobs run normally.
    for j in batch.jobs:
        q.complete(j.id, j.token)
    assert q.counts().leased == 0


def test_one_claim_reads_each_jobs_own_numbers(q: Queue, client: redis.Redis) -> None:
    """claim.lua parses each distinct number text once per call (issue 16, drain): jobs of one
    batch that differ, in any order, each get their own attempts, budget and run time."""
    t1 = datetime(2026, 1, 1, tzinfo=UTC)
    t2 = datetime(2026, 1, 2, tzinfo=UTC)
    retried = q.enqueue("ok.t", run_at=t1, max_attempts=4)
    first = q.claim("w", limit=1)
    q.fail(retried, first.jobs[0].token, ("E", "m", ""), delay_ms=0)
    plan = {  # id -> (attempts, max_attempts, run_at)
        q.enqueue("ok.t", run_at=t2, max_attempts=3): (1, 3, t2),
        q.enqueue("ok.t", run_at=t1): (1, 5, t1),
        retried: (2, 4, None),
        q.enqueue("ok.t", run_at=t2, max_attempts=3): (1, 3, t2),
        q.enqueue("ok.t", run_at=t1, max_attempts=7): (1, 7, t1),
    }
    batch = q.claim("w", limit=10)
    assert sorted(j.id for j in batch.jobs) == sorted(plan)
    for j in batch.jobs:
        attempts, budget, run_at = plan[j.id]
        assert (j.attempts, j.max_attempts) == (attempts, budget)
        if run_at is not None:
            assert j.run_at_ms == int(run_at.timestamp() * 1000)
        stored = q.get_job(j.id)
        assert stored is not None and stored.attempts == attempts


def test_a_run_at_set_by_hand_on_a_never_claimed_job_is_read_and_written_out_plainly(
    q: Queue, client: redis.Redis
) -> None:
    # claim reuses its own text of the due score for a never-claimed job; a run_at_ms set by hand
    # (here with leading zeros) is what the job says instead, written out as a plain integer.
    plain = q.enqueue("ok.t", {"n": 0})
    edited = q.enqueue("ok.t", {"n": 1})
    client.hset(q.keys.job(edited), "run_at_ms", "007")
    due_ms = {j: int(client.zscore(q.keys.due, j)) for j in (plain, edited)}
    got = {j.id: j for j in q.claim("w", limit=10, lease_ms=30_000).jobs}
    assert got[edited].run_at_ms == 7 and client.hget(q.keys.job(edited), "run_at_ms") == "7"
    assert got[plain].run_at_ms == due_ms[plain]
    assert client.hget(q.keys.job(plain), "run_at_ms") == str(due_ms[plain])


def test_claim_parks_a_bad_id_and_a_key_that_is_not_a_hash(
    q: Queue, client: redis.Redis, redis_url: str
) -> None:
    good = q.enqueue("ok.t")
    client.zadd(q.keys.due, {"bad\xffid".encode("latin-1"): 0, "not-a-hash": 0})
    client.set(q.keys.job("not-a-hash"), "a string")
    batch = q.claim("w", limit=10, lease_ms=30_000)
    assert [j.id for j in batch.jobs] == [good]
    raw = redis.Redis.from_url(redis_url)  # bytes: the parked id is not UTF-8
    assert set(raw.zrange(q.keys.dead, 0, -1)) == {b"bad\xffid", b"not-a-hash"}
    assert client.zcard(q.keys.due) == 0
    assert client.get(q.keys.job("not-a-hash")) == "a string"  # left as found, for doctor
    assert raw.hget(q.keys.job("bad\xffid").encode("latin-1"), "dead_reason") == b"invalid job: id"
    assert q.requeue_dead(["not-a-hash"]) == 0  # nothing to run
    assert q.purge_dead(["not-a-hash"]) == 1
    assert raw.zrange(q.keys.dead, 0, -1) == [b"bad\xffid"]
    raw.delete(q.keys.job("bad\xffid").encode("latin-1"))  # the teardown scan decodes key names
    raw.close()


def test_a_lapsed_lease_with_unreadable_counts_is_parked_by_the_next_claim(
    q: Queue, client: redis.Redis
) -> None:
    jid = q.enqueue("ok.t")
    q.claim("w", limit=1, lease_ms=1)
    client.hset(q.keys.job(jid), "max_attempts", "1e9")
    client.zadd(q.keys.leased, {jid: 0})  # lapsed
    other = q.enqueue("ok.t")
    batch = q.claim("w2", limit=10, lease_ms=30_000)
    assert [j.id for j in batch.jobs] == [other]
    assert reason(q, client, jid) == "invalid job: max_attempts"


def test_hostile_scores_never_reach_the_reply(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("ok.t", delay_ms=60_000)
    client.zadd(q.keys.due, {jid: float("inf")})
    batch = q.claim("w", limit=10, lease_ms=30_000)
    assert batch.next_ms == MAX_TIME_MS
    client.zadd(q.keys.due, {jid: float("-inf")})
    assert q.counts().oldest_due_ms == 0


def test_a_replayed_claim_hands_out_only_jobs_that_still_read_well(
    q: Queue, client: redis.Redis
) -> None:
    ids = [q.enqueue("ok.t", {"n": i}) for i in range(3)]
    args = claim_args("w", 10, 30_000, "feedface00000001", 100)
    first = parse_claim(q._execute(Script("claim", args)))
    assert sorted(j.id for j in first.jobs) == sorted(ids)
    client.hset(q.keys.job(ids[1]), "run_at_ms", "1e400")  # edited between call and re-send
    again = parse_claim(q._execute(Script("claim", args)))
    assert sorted(j.id for j in again.jobs) == sorted([ids[0], ids[2]])
    assert again.unreadable == []
    assert {j.id: j.token for j in again.jobs} == {
        j.id: j.token for j in first.jobs if j.id != ids[1]
    }


# -- parse_claim never raises because of one job -----------------------------------------------
def _job(job_id: str, **over: Any) -> list[Any]:
    f: dict[str, Any] = {
        "id": job_id, "token": "1-abc", "attempts": 1, "max_attempts": 3, "task": "ok.t",
        "payload": "{}", "run_at_ms": "1000", "backoff": "1000,2.0,60000,0.25",
        "timeout_ms": "0", "schedule": "", "start_by_ms": "",
    }  # fmt: skip
    f.update(over)
    return list(f.values())


@pytest.mark.parametrize(
    ("over", "why"),
    [({"run_at_ms": "1e400"}, "run_at_ms"), ({"run_at_ms": "inf"}, "run_at_ms"),
     ({"timeout_ms": "30s"}, "timeout_ms"), ({"max_attempts": "-9223372036854775808"},
     "max_attempts"), ({"attempts": "nan"}, "attempts"), ({"backoff": "1,2"}, "backoff"),
     ({"backoff": "1,inf,2,0"}, "backoff"), ({"payload": b"\xff"}, "payload: not UTF-8"),
     ({"token": "x"}, "token"), ({"task": "a b"}, "task"), ({"schedule": "a/b"}, "schedule"),
     ({"run_at_ms": str(2**63)}, "run_at_ms"), ({"timeout_ms": "\u0661"}, "timeout_ms")],
)  # fmt: skip
def test_parse_claim_sets_aside_one_unreadable_job(over: dict[str, Any], why: str) -> None:
    reply = ["5000", "-1", 3, *_job("a"), *_job("b", **over), *_job("c"), 0]
    batch = parse_claim(reply)
    assert [j.id for j in batch.jobs] == ["a", "c"]
    assert batch.unreadable == [("b", str(over.get("token", "1-abc")), f"invalid job: {why}")]


def test_parse_claim_survives_a_reply_cut_short() -> None:
    reply = ["5000", "-1", 2, *_job("a"), *_job("b")[: CLAIM_FIELDS - 3]]
    batch = parse_claim(reply)
    assert [j.id for j in batch.jobs] == ["a"]
    assert [u[0] for u in batch.unreadable] == ["b"]


# -- numbers: bounded at the boundary, stored exactly, read strictly ---------------------------
def test_a_large_max_attempts_is_stored_exactly_and_read_back(
    q: Queue, client: redis.Redis
) -> None:
    top = LIMITS["max_attempts"][1]
    jid = q.enqueue("ok.t", max_attempts=top, delay_ms=MAX_DELAY_MS)
    client.zadd(q.keys.due, {jid: 0})
    assert str(client.get(q.keys.spec(jid))).split("|")[2] == str(top)
    (job,) = q.claim("w", limit=1, lease_ms=30_000).jobs
    assert job.max_attempts == top
    assert q.get_job(jid).max_attempts == top


def test_doctor_finds_nothing_wrong_with_a_healthy_job_at_the_limits(
    q: Queue, client: redis.Redis
) -> None:
    from scheduler.admin.doctor import check_queue

    q.enqueue("ok.t", max_attempts=LIMITS["max_attempts"][1], timeout_ms=LIMITS["timeout_ms"][1])
    assert check_queue(client, q.keys.queue) == []


def test_stored_int_reads_only_plain_decimal_integers() -> None:
    for bad in ["1e3", "0x10", "inf", "nan", " 7", "7 ", "7.0", "\u0661", "1_000", "", "+5",
                str(2**53), b"\xff", None]:  # fmt: skip
        assert stored_int(bad) is None, bad
    assert [stored_int(v) for v in ["0", "-3", "007", str(2**53 - 1), b"42", 5]] == [
        0, -3, 7, 2**53 - 1, 42, 5,
    ]  # fmt: skip
    assert stored_int("5", 6, 9) is None and stored_int("10", 6, 9) is None


def test_the_scripts_use_the_same_limits_as_codec() -> None:
    util = (Path(__file__).parent.parent / "lua" / "lib" / "util.lua").read_text()
    lim = {k: int(v) for k, v in re.findall(r"^\s+(\w+) = (\d+),", util, re.MULTILINE)}
    assert lim == {
        "time_ms": LIMITS["run_at_ms"][1], "delay_ms": LIMITS["delay_ms"][1],
        "attempts": LIMITS["max_attempts"][1], "timeout_ms": LIMITS["timeout_ms"][1],
        "lease_ms": LIMITS["lease_ms"][1], "ttl_ms": LIMITS["result_ttl_ms"][1],
        "limit": LIMITS["limit"][1], "reap_limit": LIMITS["reap_limit"][1],
        "factor": int(FLOAT_LIMITS["backoff.factor"][1]), "fence": LIMITS["fence"][1] + 1,
    }  # fmt: skip
    assert LIMITS["jitter_ms"] == LIMITS["delay_ms"] == LIMITS["backoff.base_ms"]
    assert LIMITS["backoff.cap_ms"] == LIMITS["delay_ms"]
    assert LIMITS["result_ttl_ms"] == LIMITS["record_ttl_ms"] == LIMITS["key_ttl_ms"]
    enqueue = (Path(__file__).parent.parent / "lua" / "enqueue.lua").read_text()
    assert f"MAX_BATCH = {ENQUEUE_PER_CALL} " in enqueue


def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


REFUSED: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("payload", {"payload": _nested(10_000)}, InvalidPayload),
    ("payload", {"payload": "\ud800"}, InvalidPayload),
    ("payload", {"payload": {"k\udfff": 1}}, InvalidPayload),
    ("delay_ms", {"delay_ms": 2**70}, BadArgument),
    ("delay_ms", {"delay_ms": 2**53 + 1}, BadArgument),
    ("delay_ms", {"delay_ms": MAX_DELAY_MS + 1}, BadArgument),
    ("delay_ms", {"delay_ms": MAX_DELAY_MS, "jitter_ms": 5}, BadArgument),
    ("max_attempts", {"max_attempts": 2**70}, BadArgument),
    ("max_attempts", {"max_attempts": sys.maxsize}, BadArgument),
    ("run_at", {"run_at": datetime(1, 1, 1, tzinfo=UTC)}, BadArgument),
    ("run_at", {"run_at": datetime(1969, 12, 31, tzinfo=UTC)}, BadArgument),
    ("run_at", {"run_at": datetime(9999, 12, 31, tzinfo=UTC)}, BadArgument),
    ("timeout_ms", {"timeout_ms": 2**70}, BadArgument),
    ("timeout_ms", {"timeout_ms": LIMITS["timeout_ms"][1] + 1}, BadArgument),
    ("jitter_ms", {"jitter_ms": 2**70}, BadArgument),
    ("base_ms", {"backoff": Backoff(base_ms=2**70)}, BadArgument),
    ("cap_ms", {"backoff": Backoff(cap_ms=2**53 + 1)}, BadArgument),
    ("factor", {"backoff": Backoff(factor=1e6)}, BadArgument),
    ("key", {"key": "k\ud800"}, BadArgument),
]


@pytest.mark.parametrize(("what", "kwargs", "exc"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_argument_changes_nothing(
    q: Queue, client: redis.Redis, what: str, kwargs: dict[str, Any], exc: type[Exception]
) -> None:
    q.enqueue("ok.t")
    before = dump_queue(client, q)
    with pytest.raises(exc, match=what):
        q.enqueue("ok.t", **kwargs)
    with pytest.raises(exc, match=what):
        q.enqueue_many([JobSpec("ok.t"), JobSpec("ok.t", **kwargs)])
    assert dump_queue(client, q) == before


@pytest.mark.parametrize(
    ("call", "what"),
    [(lambda q: q.claim("w", lease_ms=0), "lease_ms"),
     (lambda q: q.claim("w", lease_ms=2**70), "lease_ms"),
     (lambda q: q.claim("w", limit=1001), "limit"),
     (lambda q: q.claim("w", reap_limit=2**70), "reap_limit"),
     (lambda q: q.claim("w\ud800"), "worker_id"),
     (lambda q: q.heartbeat([("a", "1-x")], lease_ms=2**70), "lease_ms"),
     (lambda q: q.fail("a", "1-x", ("E", "m", ""), delay_ms=2**70), "delay_ms"),
     (lambda q: q.schedule("s", "ok.t", every_ms=2**70), "every_ms"),
     (lambda q: q.schedule("s", "ok.t", every_ms=MIN_MS, max_attempts=2**70), "max_attempts"),
     (lambda q: q.schedule("s", "ok.t", every_ms=MIN_MS, backoff=Backoff(cap_ms=2**70)),
      "cap_ms")],
)  # fmt: skip
def test_other_refused_arguments_change_nothing(
    q: Queue, client: redis.Redis, call: Any, what: str
) -> None:
    q.enqueue("ok.t")
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=what):
        call(q)
    assert dump_queue(client, q) == before


def test_result_ttl_is_bounded(client: redis.Redis, queue_name: str) -> None:
    # Refused when the queue is made (Settings), not at the first call that sends it.
    with pytest.raises(BadArgument, match="result_ttl_ms"):
        Queue(client, queue_name, result_ttl_ms=2**70)


def test_accepted_edges_of_the_ranges(q: Queue, client: redis.Redis) -> None:
    past = q.enqueue("ok.t", run_at=datetime(2000, 1, 1, tzinfo=UTC))  # in the past: due now
    far = q.enqueue("ok.t", delay_ms=MAX_DELAY_MS)
    q.enqueue("ok.t", run_at=datetime(2199, 12, 31, tzinfo=UTC), max_attempts=1)
    assert client.zscore(q.keys.due, past) == 946_684_800_000
    assert [j.id for j in q.claim("w", limit=10).jobs] == [past]
    assert q.get_job(far).run_at_ms == int(client.zscore(q.keys.due, far))


def test_a_huge_attempt_count_does_not_overflow_the_backoff() -> None:
    assert Backoff(base_ms=1000, factor=1000.0, cap_ms=60_000, jitter=0).delay_ms(10**6) == 60_000
    assert Backoff(base_ms=0, factor=1000.0, cap_ms=60_000).delay_ms(10**6) == 0


# -- a schedule keeps its next occurrence armed however the pending one ends ------------------
def _pending(q: Queue, client: redis.Redis, name: str) -> str:
    return client.hget(q.keys.schedule(name), "pending") or ""


def _armed(q: Queue, client: redis.Redis, name: str) -> str:
    """The schedule's pending occurrence, checked to be waiting in due."""
    pend = _pending(q, client, name)
    assert pend and client.zscore(q.keys.due, pend) is not None, pend
    assert client.hget(q.keys.job(pend), "state") == "due"
    return pend


def test_a_parked_pending_occurrence_arms_the_next(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    first = _armed(q, client, "tick")
    client.hset(q.keys.job(first), "timeout_ms", "30s")
    clock.set_ms(1001 * MIN_MS + 1)
    assert q.claim("w", limit=10).jobs == []
    assert reason(q, client, first) == "invalid job: timeout_ms"
    nxt = _armed(q, client, "tick")
    assert nxt != first
    clock.set_ms(1002 * MIN_MS + 1)
    assert [j.id for j in q.claim("w", limit=10).jobs] == [nxt]


def test_an_occurrence_with_its_hash_gone_arms_the_next(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    first = _armed(q, client, "tick")
    client.delete(q.keys.job(first))
    clock.set_ms(1001 * MIN_MS + 1)
    q.claim("w", limit=10)
    assert _armed(q, client, "tick") != first


def test_a_dead_occurrence_leaves_the_next_armed(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS, max_attempts=1)
    clock.set_ms(1001 * MIN_MS + 1)
    (job,) = q.claim("w", limit=10).jobs
    assert q.fail(job.id, job.token, ("E", "m", "")).status == "dead"
    assert _armed(q, client, "tick") != job.id


def test_a_cancelled_occurrence_arms_the_next(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    first = _armed(q, client, "tick")
    assert q.cancel(first) == "scheduled"
    assert _armed(q, client, "tick") != first


def test_purging_a_pending_occurrence_parked_by_hand_arms_the_next(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """As doctor --fix parks a job: the ids moved by plain commands, no script re-armed."""
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    first = _armed(q, client, "tick")
    client.zrem(q.keys.due, first)
    client.hset(q.keys.job(first), mapping={"state": "dead", "dead_reason": "by hand"})
    client.zadd(q.keys.dead, {first: 1000 * MIN_MS})
    assert q.purge_dead([first]) == 1
    assert _armed(q, client, "tick") != first


# -- a re-sent settlement answers as the first one did --------------------------------------------
def test_a_re_sent_release_answers_released_after_the_job_moved_on(q: Queue) -> None:
    """The fault-proxy failure: the first release reached Redis, then another worker claimed
    and completed the job before the re-sent release arrived."""
    jid = q.enqueue("ok.t")
    (a,) = q.claim("w1", limit=1).jobs
    assert q.release([(a.id, a.token)]) == ["released"]
    (b,) = q.claim("w2", limit=1).jobs
    assert b.id == jid and b.token != a.token
    q.complete(b.id, b.token)
    assert q.release([(a.id, a.token)]) == ["released"]
    assert q.complete_many([(b.id, b.token, None)]) == ["done"]
    assert q.get_job(jid).state == "done"


def test_a_re_sent_fail_answers_the_same_after_the_retry_ran(q: Queue) -> None:
    q.enqueue("ok.t", backoff=Backoff(base_ms=0, jitter=0))
    (a,) = q.claim("w1", limit=1).jobs
    first = q.fail(a.id, a.token, ("E", "m", ""))
    (b,) = q.claim("w2", limit=1).jobs
    q.complete(b.id, b.token)
    assert q.fail(a.id, a.token, ("E", "m", "")) == first


@pytest.mark.parametrize(
    ("field", "value"),
    [("run_at_ms", " 7"), ("run_at_ms", "12.5"), ("run_at_ms", "1e3"), ("run_at_ms", "inf"),
     ("max_attempts", "9.2233720368547758e+18"), ("attempts", "\u0661")],
)  # fmt: skip
def test_doctor_reads_stored_numbers_as_claim_does(
    q: Queue, client: redis.Redis, field: str, value: str
) -> None:
    """doctor flags exactly what claim would park (one strict reader on both sides)."""
    from scheduler.admin.doctor import check_queue

    jid = q.enqueue("ok.t")
    client.hset(q.keys.job(jid), field, value)
    found = [i.message for i in check_queue(client, q.keys.queue) if i.job_id == jid]
    assert found and found[0].startswith(f"invalid job: {field}"), found
    q.claim("w", limit=1)
    assert reason(q, client, jid) == f"invalid job: {field}"


def test_a_schedule_key_of_another_type_does_not_stop_claims(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    occurrence = _armed(q, client, "tick")
    client.delete(q.keys.schedule("tick"))
    client.set(q.keys.schedule("tick"), "not a hash")
    other = q.enqueue("ok.t")
    clock.set_ms(1001 * MIN_MS + 1)
    assert sorted(j.id for j in q.claim("w", limit=10).jobs) == sorted([occurrence, other])


def test_read_views_survive_hostile_numbers(q: Queue, client: redis.Redis) -> None:
    jid = q.enqueue("ok.t", max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    client.zadd(q.keys.leased, {jid: float("inf")})
    assert q.get_job(jid).lease_until_ms == MAX_TIME_MS
    q.fail(job.id, job.token, ("E", "m", ""), retryable=False)
    client.hset(q.keys.job(jid), "dead_ms", "1e400")
    # The age filter reads the dead ZSET's score, not the hash's copy: a day is far enough.
    assert q.dead_ids(older_than_ms=86_400_000) == []
    assert q.dead_ids() == [jid]


def test_the_real_worker_runs_the_others_and_stays_up(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    """Issue 10 item 6 / 17 item 1 end to end: hostile hashes in the worker's batch."""
    import signal

    from tests.workers.procs import spawn_worker, stop_all, wait_for

    hostile = {"timeout_ms": "30s", "run_at_ms": "1e400", "max_attempts": "9.2233720368547758e+18",
               "backoff": "1000,inf,60000,0.1", "payload": b"\xff"}  # fmt: skip
    bad = {}
    for field, value in hostile.items():
        jid = q.enqueue("echo", {"bad": field})
        client.hset(q.keys.job(jid), field, value)
        bad[jid] = field
    good = [q.enqueue("echo", {"n": i}) for i in range(5)]
    w = spawn_worker(redis_url, q.name)
    try:
        wait_for(lambda: all(q.status(g) == "done" for g in good), what="good jobs done")
        wait_for(lambda: q.counts().dead == len(bad), what="bad jobs parked")
        assert {jid: reason(q, client, jid) for jid in bad} == {
            jid: f"invalid job: {field}" for jid, field in bad.items()
        }
        assert w.poll() is None, "the worker died"
        w.send_signal(signal.SIGTERM)
        assert w.wait(15) == 0
    finally:
        stop_all([w])


def test_an_error_message_that_is_not_valid_unicode_is_still_reported(q: Queue) -> None:
    jid = q.enqueue("ok.t", max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    outcome = q.fail(job.id, job.token, ValueError("bad \udcff byte"), retryable=False)
    assert outcome.status == "dead"
    assert q.get_job(jid).fields["last_error"] == "bad ? byte"


@pytest.mark.parametrize(
    "call",
    [lambda q: q.enqueue("ok.t\n"), lambda q: q.enqueue("ok.t", job_id="j1\n"),
     lambda q: q.schedule("s\n", "ok.t", every_ms=MIN_MS),
     lambda q: q.schedule("s", "ok.t\n", every_ms=MIN_MS),
     lambda q: q.schedule("s", "ok.t", every_ms=MIN_MS, misfire="skip\n"),
     lambda q: q.get_job("j1\n")],
)  # fmt: skip
def test_a_trailing_newline_does_not_pass_a_name_rule(
    q: Queue, client: redis.Redis, call: Any
) -> None:
    """Python's '$' matches before a final newline; the rules are full matches, as in Lua."""
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=r"invalid|misfire"):
        call(q)
    assert dump_queue(client, q) == before


def test_a_queue_name_with_a_trailing_newline_is_refused(client: redis.Redis) -> None:
    with pytest.raises(BadArgument, match="invalid queue name"):
        Queue(client, "q\n")


def test_hostile_advisory_keys_do_not_fail_transitions_after_their_writes(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Stats counters, the wake list and the refill set are advisory: a non-integer counter or
    a key of another type there must not make claim/complete/fail error after they wrote."""
    q, clock = tq
    clock.set_ms(1000 * MIN_MS)
    counters = ("claim", "done", "fail", "dead", "retry", "release", "expired", "dead_trimmed")
    for minute in range(1000, 1003):
        client.hset(q.keys.stats(minute), mapping=dict.fromkeys(counters, "x"))
    client.set(q.keys.wake, "not a list")
    client.set(q.keys.schedules_refill, "not a set")
    a, b = q.enqueue("ok.t"), q.enqueue("ok.t", max_attempts=1)
    q.schedule("tick", "ok.t", every_ms=MIN_MS)
    batch = q.claim("w", limit=10)
    assert sorted(j.id for j in batch.jobs) == sorted([a, b])
    tokens = {j.id: j.token for j in batch.jobs}
    q.complete(a, tokens[a])
    assert q.fail(b, tokens[b], ("E", "m", "")).status == "dead"
    clock.set_ms(1001 * MIN_MS + 1)
    (occ,) = q.claim("w", limit=10).jobs
    assert occ.schedule == "tick"
    assert q.release([(occ.id, occ.token)]) == ["released"]
    assert (q.status(a), q.status(b)) == ("done", "dead")


def test_a_job_key_overwritten_with_another_type_fails_no_other_settlement(
    q: Queue, client: redis.Redis
) -> None:
    ids = [q.enqueue("ok.t") for _ in range(3)]
    held = [(j.id, j.token) for j in q.claim("w", limit=10).jobs]
    client.delete(q.keys.job(ids[1]))
    client.set(q.keys.job(ids[1]), "a string")
    by_id = dict(held)
    assert q.heartbeat(held, lease_ms=30_000)[1] == {ids[0]: "held", ids[1]: "missing",
                                                     ids[2]: "held"}  # fmt: skip
    assert q.complete_many([(i, by_id[i], None) for i in ids]) == ["done", "missing", "done"]


def test_a_corrupt_idempotency_key_refuses_the_batch_before_any_write(
    q: Queue, client: redis.Redis
) -> None:
    import hashlib

    q.enqueue("ok.t")
    client.hset(q.keys.idem(hashlib.sha256(b"k").hexdigest()), "x", "y")
    before = dump_queue(client, q)
    with pytest.raises(CorruptKey, match=r"idem:\w+ is not a string"):
        q.enqueue_many([JobSpec("ok.t"), JobSpec("ok.t"), JobSpec("ok.t", key="k")])
    assert dump_queue(client, q) == before
