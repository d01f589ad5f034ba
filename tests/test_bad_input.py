"""Bad input gets a typed error at the boundary and changes nothing (a dump of every key of the
queue is compared before and after each refused call)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import redis

from scheduler import (
    Backoff,
    BadArgument,
    InvalidPayload,
    JobNotFound,
    JobSpec,
    JobState,
    Queue,
    StaleToken,
)
from scheduler.core.codec import MAX_DELAY_MS
from scheduler.core.errors import SchedulerError
from scheduler.operations.ops import Script
from tests.conftest import dump_queue


@pytest.fixture
def seeded(q: Queue) -> tuple[Queue, str, str]:
    """A queue holding one leased job and one due job, so refusals have state to disturb."""
    leased = q.enqueue("t", {"n": 1})
    q.claim("w", limit=1)
    due = q.enqueue("t", {"n": 2}, delay_ms=60_000)
    return q, leased, due


BAD_CALLS: dict[str, Callable[[Queue, str], Any]] = {
    "payload not JSON": lambda q, _: q.enqueue("t", object()),
    "payload NaN": lambda q, _: q.enqueue("t", {"x": math.nan}),
    "payload too big": lambda q, _: q.enqueue("t", "x" * (600 * 1024)),
    "negative delay": lambda q, _: q.enqueue("t", None, delay_ms=-1),
    "text delay": lambda q, _: q.enqueue("t", None, delay_ms="5"),
    "bool delay": lambda q, _: q.enqueue("t", None, delay_ms=True),
    "float delay": lambda q, _: q.enqueue("t", None, delay_ms=1.5),
    "naive run_at": lambda q, _: q.enqueue("t", None, run_at=datetime(2030, 1, 1)),
    "run_at and delay": lambda q, _: q.enqueue(
        "t", None, run_at=datetime.now().astimezone(), delay_ms=1
    ),
    "empty task": lambda q, _: q.enqueue("", None),
    "task with space": lambda q, _: q.enqueue("a b", None),
    "zero attempts": lambda q, _: q.enqueue("t", None, max_attempts=0),
    "job id escaping the tag": lambda q, _: q.enqueue("t", None, job_id="x}{y"),
    "negative jitter": lambda q, _: q.enqueue("t", None, jitter_ms=-5),
    "empty key": lambda q, _: q.enqueue("t", None, key=""),
    "backoff not a Backoff": lambda q, _: q.enqueue("t", None, backoff={"base_ms": 1}),  # type: ignore[arg-type]
    "one bad job in a batch": lambda q, _: q.enqueue_many(
        [JobSpec("t", {"ok": 1}), JobSpec("t", {"ok": 2}), JobSpec("t", {1, 2})]
    ),
    "claim negative limit": lambda q, _: q.claim("w", limit=-1),
    "claim huge limit": lambda q, _: q.claim("w", limit=10_000),
    "claim zero lease": lambda q, _: q.claim("w", lease_ms=0),
    "claim empty worker": lambda q, _: q.claim("", limit=1),
    "heartbeat zero lease": lambda q, j: q.heartbeat([(j, "1-x")], lease_ms=0),
    "complete unknown job": lambda q, _: q.complete("nope", "1-x"),
    "complete wrong token": lambda q, j: q.complete(j, "99-deadbeef"),
    "complete result not JSON": lambda q, j: q.complete(j, q.get_job(j).token or "", object()),
    "fail wrong token": lambda q, j: q.fail(j, "99-deadbeef", RuntimeError("x")),
    "fail unknown job": lambda q, _: q.fail("nope", "1-x", RuntimeError("x")),
    "fail negative delay": lambda q, j: q.fail(
        j, q.get_job(j).token or "", ValueError(), delay_ms=-1
    ),
    "cancel unknown job": lambda q, _: q.cancel("nope"),
    "cancel bad id": lambda q, _: q.cancel("a{b}"),
    "get unknown job": lambda q, _: q.get_job("nope"),
    "list bad state": lambda q, _: q.list_jobs("running"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_refused_call_changes_nothing(
    seeded: tuple[Queue, str, str], client: redis.Redis, case: str
) -> None:
    q, leased, _ = seeded
    before = dump_queue(client, q)
    with pytest.raises(SchedulerError) as info:
        BAD_CALLS[case](q, leased)
    assert str(info.value), "the error must say what is wrong"
    assert dump_queue(client, q) == before


def test_error_types_are_specific(seeded: tuple[Queue, str, str]) -> None:
    q, leased, _ = seeded
    with pytest.raises(InvalidPayload):
        q.enqueue("t", object())
    with pytest.raises(BadArgument):
        q.enqueue("t", None, delay_ms=-1)
    with pytest.raises(StaleToken):
        q.complete(leased, "99-deadbeef")
    with pytest.raises(JobNotFound):
        q.get_job("nope")
    with pytest.raises(BadArgument):
        Backoff(base_ms=-1)
    with pytest.raises(BadArgument):
        Queue(q.client, "bad{name}")


def test_server_refuses_malformed_arguments(
    seeded: tuple[Queue, str, str], client: redis.Redis
) -> None:
    """A client that skips our Python checks (another language, a bug) meets the same refusal
    inside the script, before its first write."""
    q, _, _ = seeded
    before = dump_queue(client, q)
    good = ["id1", "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", ""]
    bad = ["id2", "t", "{}", "in", "-7", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", ""]
    with pytest.raises(BadArgument, match="time_ms"):
        q._execute(Script("enqueue", ["2", *good, *bad]))
    for backoff in ("1000,0.5,1000,0.0", "1000,2.0,1000,1.5", "x", "1000,2.0,-1,0.0"):
        bad_backoff = [*good[:6], backoff, *good[7:]]
        with pytest.raises(BadArgument, match="backoff"):
            q._execute(Script("enqueue", ["2", *good, *bad_backoff]))
    # Each distinct task name / backoff text is checked once per call: any other than one
    # already checked is still checked, after a repeat of a good one.
    for task in ("t t", "", "x" * 201):
        with pytest.raises(BadArgument, match="task"):
            q._execute(Script("enqueue", ["3", *good, *good, good[0], task, *good[2:]]))
    bad_backoff = [*good[:6], "1000,0.5,1000,0.0", *good[7:]]
    with pytest.raises(BadArgument, match="backoff"):
        q._execute(Script("enqueue", ["3", *good, *good, *bad_backoff]))
    assert dump_queue(client, q) == before
    # ... and a repeat of a good one is accepted: three jobs, one task and backoff text.
    three = [[f"m{i}", *good[1:]] for i in range(3)]
    reply = q._execute(Script("enqueue", ["3", *[x for job in three for x in job]]))
    assert reply[0] == "ccc"


# enqueue.lua's job fields (the 12 of an older client's call): index -> the name a refusal gives.
_NUMBERS = {4: "time_ms", 5: "max_attempts", 7: "timeout_ms", 9: "idem_ttl_ms", 10: "result_ttl_ms"}


def test_server_checks_every_number_of_a_batch_not_only_repeats(
    seeded: tuple[Queue, str, str], client: redis.Redis
) -> None:
    """Within one call enqueue.lua parses a number field's text once while the jobs repeat it
    (issue 16, bulk): a text that differs is still checked wherever it comes, and each job
    stores its own values."""
    q, _, _ = seeded
    before = dump_queue(client, q)
    good = ["g", "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", ""]
    for i, name in _NUMBERS.items():
        for value in ("-7", "1.5", " 3", "x"):
            bad = [*good]
            bad[i] = value
            jobs = [[f"n{k}", *job[1:]] for k, job in enumerate((good, good, bad, good))]
            with pytest.raises(BadArgument, match=name):
                q._execute(Script("enqueue", ["4", *[x for job in jobs for x in job]]))
    assert dump_queue(client, q) == before
    # Alternating texts: each job keeps its own (a remembered value is never another job's).
    a = [*good]
    b = [*good[:4], "60000", "7", good[6], "2000", "", "1000", "5000", ""]
    jobs = [[f"alt{k}", *job[1:]] for k, job in enumerate((a, b, a, b, b, a))]
    reply = q._execute(Script("enqueue", ["6", *[x for job in jobs for x in job]]))
    assert reply[0] == "cccccc"
    for k, job in enumerate((a, b, a, b, b, a)):
        got = q.get_job(f"alt{k}")
        assert got is not None
        assert got.max_attempts == int(job[5])
        assert got.fields.get("timeout_ms", "0") == job[7]
        assert got.fields.get("result_ttl_ms", "") == job[10]
        delayed = job[4] != "0"
        assert (q.status(f"alt{k}") == JobState.SCHEDULED) is delayed


def test_in_and_at_share_the_time_text_but_not_its_range_or_meaning(
    seeded: tuple[Queue, str, str], client: redis.Redis
) -> None:
    """enqueue.lua remembers an 'in' delay's text (issue 16): an 'at' time of the same text is
    neither let through as a delay (its range is wider) nor read as one (it is absolute)."""
    q, _, _ = seeded
    before = dump_queue(client, q)
    good = ["g", "t", "{}", "in", "0", "5", "1000,2.0,1000,0.0", "0", "", "1000", "", ""]
    # An instant in 1979; beyond the longest delay (MAX_DELAY_MS, 3,650 days) as a delay.
    beyond = str(MAX_DELAY_MS + 1)
    for times in ((("at", beyond), ("in", beyond)), (("in", "0"), ("at", beyond), ("in", beyond))):
        jobs = [[f"x{k}", *good[1:3], *when_ms, *good[5:]] for k, when_ms in enumerate(times)]
        with pytest.raises(BadArgument, match="time_ms"):
            q._execute(Script("enqueue", [str(len(jobs)), *[x for job in jobs for x in job]]))
    assert dump_queue(client, q) == before
    order = ("in", "at", "in", "at")
    jobs = [[f"y{k}", *good[1:3], when, "60000", *good[5:]] for k, when in enumerate(order)]
    sent_ms = int(client.time()[0]) * 1000
    assert q._execute(Script("enqueue", ["4", *[x for job in jobs for x in job]]))[0] == "cccc"
    for k, when in enumerate(order):
        score = client.zscore(q.keys.due, f"y{k}")
        if when == "at":
            assert score == 60_000
        else:
            assert score is not None and score >= sent_ms + 60_000


def test_hand_edited_job_hash_is_parked_not_lost(q: Queue, client: redis.Redis) -> None:
    """An operator's typo in redis-cli must not crash workers nor lose the other jobs."""
    broken = q.enqueue("t", {"n": 1})
    healthy = q.enqueue("t", {"n": 2})
    client.hset(q.keys.job(broken), "attempts", "lots")
    batch = q.claim("w", limit=10)
    assert [j.id for j in batch.jobs] == [healthy]
    job = q.get_job(broken)
    assert (job.state, job.dead_reason) == ("dead", "invalid job: attempts")
    assert client.zrange(q.keys.dead, 0, -1) == [broken]


def test_pickle_in_payload_is_never_unpickled(q: Queue, client: redis.Redis) -> None:
    import pickle

    job_id = q.enqueue("t", {"n": 1})
    client.hset(q.keys.job(job_id), "payload", pickle.dumps({"evil": 1}).hex())
    (job,) = q.claim("w", limit=1).jobs
    with pytest.raises(ValueError):
        job.payload()


def test_a_url_or_the_wrong_kind_of_client_is_refused_at_construction(redis_url: str) -> None:
    """Each of these was accepted, then failed at its first call with a TypeError or an
    AttributeError ('str' object has no attribute 'sadd', a coroutine never awaited); a
    Worker on a blocking client started and exited 1 ('presence failed')."""
    import asyncio

    from scheduler import AsyncQueue, Registry
    from scheduler.core.connection import connect, connect_async
    from scheduler.worker import Worker

    # Each kind as the run's server needs (a RedisCluster on a cluster run).
    sync_client, async_client = connect(redis_url), connect_async(redis_url)
    refused: list[tuple[Callable[[], object], str]] = [
        (lambda: Queue(redis_url, "q"), r"not a URL: use Queue\.from_url\(url\)"),
        (lambda: AsyncQueue(redis_url, "q"), r"not a URL: use AsyncQueue\.from_url\(url\)"),
        (lambda: Queue(async_client, "q"), "Queue needs a blocking client"),
        (lambda: AsyncQueue(sync_client, "q"), "AsyncQueue needs a redis.asyncio client"),
        (lambda: Worker(sync_client, Registry()), "needs a redis.asyncio client"),
        (lambda: Worker(AsyncQueue(async_client, "q"), Registry()), r"pass q\.client"),
    ]
    for make, message in refused:
        with pytest.raises(BadArgument, match=message):
            make()
    assert isinstance(Queue(sync_client, "q"), Queue)  # the right kinds still pass
    assert isinstance(AsyncQueue(async_client, "q"), AsyncQueue)
    sync_client.close()
    asyncio.run(async_client.aclose())
