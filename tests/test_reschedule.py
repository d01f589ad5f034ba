"""Moving a waiting job's run time (lua/reschedule.lua, Queue.reschedule), on a real Redis: a
scheduled job runs now, a due one later, a retry sooner, and its record, due score and
priority index agree; a job that is not waiting is refused with why, and bad input changes
nothing."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.errors import BadArgument, CorruptKey, JobNotFound
from tests.conftest import delete_queue

HOUR_MS = 3_600_000


def test_a_scheduled_job_runs_now_and_a_due_one_later(client: redis.Redis, q: Queue) -> None:
    later = q.enqueue("echo", {"n": 1}, delay_ms=HOUR_MS)
    now = q.enqueue("echo", {"n": 2})
    client.delete(q.keys.wake)
    assert q.reschedule(later, delay_ms=0) == "rescheduled"
    assert client.llen(q.keys.wake) >= 1, "idle workers sleeping towards the old head not woken"
    assert q.reschedule(now, delay_ms=HOUR_MS) == "rescheduled"
    assert q.status(later) == "due" and q.status(now) == "scheduled"
    batch = q.claim("w1", limit=10)
    assert [j.id for j in batch.jobs] == [later]
    assert batch.jobs[0].run_at_ms <= batch.now_ms and json.loads(batch.jobs[0].payload_json) == {
        "n": 1
    }
    run_at = q.get_job(now).run_at_ms
    assert run_at is not None and HOUR_MS - 5_000 < run_at - batch.now_ms <= HOUR_MS


def test_a_retry_waiting_out_its_backoff_runs_now(q: Queue) -> None:
    job_id = q.enqueue("echo", None, max_attempts=3)
    (job,) = q.claim("w1").jobs
    out = q.fail(job_id, job.token, ("E", "boom", ""), delay_ms=HOUR_MS)
    assert out.status == "retry" and q.claim("w1").jobs == []
    assert q.reschedule(job_id, run_at=datetime.now(UTC) - timedelta(seconds=5)) == "rescheduled"
    batch = q.claim("w1")
    (again,) = batch.jobs
    # The stored run time moved too (a claimed job reads it from its record): not "early".
    assert again.id == job_id and again.run_at_ms <= batch.now_ms
    assert again.attempts == 2 and again.fence == job.fence + 1


def test_a_job_that_is_not_waiting_is_refused_with_why(client: redis.Redis, q: Queue) -> None:
    leased, done, dead, gone = (q.enqueue("echo", None, job_id=f"j{i}") for i in range(4))
    held = {j.id: j for j in q.claim("w1", limit=4).jobs}
    q.complete(done, held[done].token)
    q.fail(dead, held[dead].token, ("E", "x", ""), retryable=False)
    q.release([(gone, held[gone].token)])
    q.cancel(gone)
    assert [q.reschedule(j, delay_ms=0) for j in (leased, done, dead, gone)] == [
        "leased", "done", "dead", "cancelled",
    ]  # fmt: skip
    with pytest.raises(JobNotFound):
        q.reschedule("no-such-job", delay_ms=0)
    # A job flow control holds (its key's one slot is taken) runs when let go.
    q.enqueue("echo", None, job_id="k1", concurrency_key="acct", concurrency_limit=1)
    q.enqueue("echo", None, job_id="k2", concurrency_key="acct", concurrency_limit=1)
    assert [j.id for j in q.claim("w1", limit=5).jobs] == ["k1"]
    assert q.reschedule("k2", delay_ms=HOUR_MS) == "held"
    # A schedule's occurrence: its slot is its id.
    q.schedule("nightly", "echo", every_ms=HOUR_MS)
    pending = q.get_schedule("nightly").pending
    assert pending and q.reschedule(pending, delay_ms=0) == "schedule"


def test_bad_input_changes_nothing(client: redis.Redis, q: Queue) -> None:
    job_id = q.enqueue("echo", None, delay_ms=HOUR_MS)
    before = client.zscore(q.keys.due, job_id)
    bad: list[dict[str, object]] = [
        {},
        {"delay_ms": 0, "run_at": datetime.now(UTC)},
        {"delay_ms": -1},
        {"delay_ms": 3651 * 86_400_000},
        {"delay_ms": "5"},
        {"run_at": datetime(2030, 1, 1)},  # naive
        {"run_at": datetime(2300, 1, 1, tzinfo=UTC)},
    ]
    for kwargs in bad:
        with pytest.raises(BadArgument):
            q.reschedule(job_id, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(BadArgument):
        q.reschedule("bad id with spaces", delay_ms=0)
    assert client.zscore(q.keys.due, job_id) == before
    # A job key edited by hand into another type: refused whole.
    client.delete(q.keys.job(job_id))
    client.set(q.keys.job(job_id), "x")
    with pytest.raises(CorruptKey):
        q.reschedule(job_id, delay_ms=0)
    assert client.zscore(q.keys.due, job_id) == before


def test_a_prioritised_job_moves_in_its_level_index_too(client: redis.Redis, q: Queue) -> None:
    job_id = q.enqueue("echo", None, priority=5)
    index = q.keys.prefix + "flow:pdue:5"
    q.reschedule(job_id, delay_ms=HOUR_MS)
    assert client.zscore(index, job_id) == client.zscore(q.keys.due, job_id)
    assert q.claim("w1").jobs == []
    q.reschedule(job_id, delay_ms=0)
    assert client.zscore(index, job_id) == client.zscore(q.keys.due, job_id)
    assert [j.id for j in q.claim("w1").jobs] == [job_id]


def test_partitioned_and_async_queues_reschedule_by_id(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        ids = pq.enqueue_many([JobSpec("echo", None, delay_ms=HOUR_MS) for _ in range(3)])
        assert [pq.reschedule(j, delay_ms=0) for j in ids[:2]] == ["rescheduled"] * 2

        async def main() -> str:
            aclient = connect_async(redis_url)
            try:
                part = pq.part_of(ids[2])
                return await AsyncQueue(aclient, part.name).reschedule(ids[2], delay_ms=0)
            finally:
                await aclient.aclose()

        assert asyncio.run(main()) == "rescheduled"
        assert {pq.status(j) for j in ids} == {"due"}
    finally:
        for p in pq.parts:
            delete_queue(client, p)
        client.delete(f"sched:{{{queue_name}}}:partitions")


def test_the_cli_reschedules_and_says_why_not(redis_url: str, q: Queue) -> None:
    job_id = q.enqueue("echo", None, delay_ms=HOUR_MS)
    run = CliRunner().invoke
    base = ["jobs", "reschedule", "--url", redis_url, "-q", q.name]
    r = run(main, [*base, job_id, "--now"])
    assert (r.exit_code, r.output) == (0, f"{job_id}: rescheduled\n")
    assert q.status(job_id) == "due"
    r = run(main, [*base, job_id, "--in", "2h", "--json"])
    assert (r.exit_code, json.loads(r.output)["status"]) == (0, "rescheduled")
    assert q.status(job_id) == "scheduled"
    r = run(main, [*base, job_id, "--at", "2031-01-01T09:00:00Z"])
    assert r.exit_code == 0
    assert q.get_job(job_id).run_at_ms == int(
        datetime(2031, 1, 1, 9, tzinfo=UTC).timestamp() * 1000
    )
    for bad in ([], ["--now", "--in", "5m"], ["--at", "tomorrow"], ["--in", "-5m"]):
        r = run(main, [*base, job_id, *bad])
        assert r.exit_code == 2, (bad, r.output)
    assert q.reschedule(job_id, delay_ms=0) == "rescheduled"
    assert [j.id for j in q.claim("w1").jobs] == [job_id]
    r = run(main, [*base, job_id, "--now"])
    assert (r.exit_code, r.output) == (1, f"{job_id}: leased\n")
    r = run(main, [*base, "no-such-job", "--now"])
    assert r.exit_code == 1 and "no job" in r.output


@pytest.mark.parametrize("claimed_before", [False, True])
def test_the_time_it_was_enqueued_stays_when_the_run_time_moves(
    q: Queue, claimed_before: bool
) -> None:
    # A job enqueued to run at once keeps no enqueued_ms in its spec record: it is read as the
    # due score, its first run time. Moving that score must not move when it was enqueued
    # (before: `jobs show` said it was enqueued an hour from now).
    job_id = q.enqueue("echo", None, max_attempts=3)
    enqueued_ms = q.get_job(job_id).fields["enqueued_ms"]
    if claimed_before:  # a retry: the hash holds enqueued_ms; it stays as well
        (job,) = q.claim("w1").jobs
        q.fail(job_id, job.token, ("E", "boom", ""), delay_ms=1)
    assert q.reschedule(job_id, delay_ms=HOUR_MS) == "rescheduled"
    moved = q.get_job(job_id)
    assert moved.fields["enqueued_ms"] == enqueued_ms, (enqueued_ms, moved.fields)
    assert moved.run_at_ms is not None and moved.run_at_ms > int(enqueued_ms) + HOUR_MS - 5_000
    assert q.reschedule(job_id, delay_ms=0) == "rescheduled"
    (again,) = q.claim("w1").jobs
    assert q.get_job(job_id).fields["enqueued_ms"] == enqueued_ms
    assert again.attempts == (2 if claimed_before else 1)
