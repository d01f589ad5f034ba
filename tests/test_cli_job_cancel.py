"""`scheduler jobs cancel` (scheduler/cli/job_cancel.py): by id (a plain or partitioned
queue's), or every waiting job of a state and task at once; a schedule's pending run and jobs
of other states or tasks are left; a declined confirmation or bad usage changes nothing."""

from __future__ import annotations

import json
from typing import Any

import redis
from click.testing import CliRunner, Result

from scheduler import JobSpec, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import exits
from tests.conftest import dump_queue
from tests.fixtures.partitioned import delete_partitioned


def cancel(redis_url: str, queue: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(
        main, ["jobs", "cancel", "--url", redis_url, "--queue", queue, *args], input=stdin
    )


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def test_ids_are_cancelled_and_an_unknown_or_finished_one_is_exit_1(
    redis_url: str, q: Queue
) -> None:
    due = q.enqueue("send", None)
    running = q.enqueue("send", None, delay_ms=0)
    q.client.zadd(q.keys.due, {running: 0})  # first in line for the claim below
    lease = q.claim("w1", limit=1).jobs[0]
    assert lease.id == running
    done = q.enqueue("send", None)
    q.client.zadd(q.keys.due, {done: 0})
    finished = q.claim("w1", limit=1).jobs[0]
    q.complete(finished.id, finished.token, "ok")
    got = cancel(redis_url, q.name, due, running, "--json")
    assert got.exit_code == 0, got.output
    assert as_json(got)["jobs"] == {due: "due", running: "leased"}
    assert q.status(due) == q.status(running) == "cancelled"
    again = cancel(redis_url, q.name, due)  # a re-run: already cancelled is fine
    assert again.exit_code == 0 and f"{due}: cancelled (was cancelled)" in again.output
    bad = cancel(redis_url, q.name, done, "no-such-job")
    assert bad.exit_code == exits.EXIT_FAILED
    assert f"{done}: not cancelled (was done)" in bad.output
    assert "no-such-job: not cancelled (was missing)" in bad.output
    assert q.status(done) == "done"


def test_a_state_and_task_select_only_their_jobs(redis_url: str, q: Queue) -> None:
    send = q.enqueue_many([JobSpec("send", {"i": i}) for i in range(5)])
    other = q.enqueue_many([JobSpec("other", {"i": i}) for i in range(3)])
    later = q.enqueue("send", None, delay_ms=3_600_000)
    q.schedule("nightly", "send", cron="* * * * *")  # its pending run is left
    before = dump_queue(q.client, q)
    declined = cancel(redis_url, q.name, "--state", "due", "--task", "send", stdin="n\n")
    assert declined.exit_code == 1 and "Cancel 5 due job(s) of task 'send'" in declined.output
    assert dump_queue(q.client, q) == before
    got = cancel(redis_url, q.name, "--state", "due", "--task", "send", "--yes", "--json")
    assert got.exit_code == 0, got.output
    assert as_json(got) == {"queue": q.name, "state": "due", "task": "send", "matched": 5,
                            "cancelled": 5, "before": {"due": 5}}  # fmt: skip
    assert {q.status(i) for i in send} == {"cancelled"}
    assert {q.status(i) for i in other} == {"due"} and q.status(later) == "scheduled"
    assert q.get_schedule("nightly").pending != ""
    got = cancel(redis_url, q.name, "--state", "scheduled", "--yes", "--json")
    assert as_json(got)["cancelled"] == 1 and q.status(later) == "cancelled"
    none = cancel(redis_url, q.name, "--state", "scheduled")  # nothing left: nothing asked
    assert none.exit_code == 0 and "no scheduled job(s) in" in none.output
    assert q.get_schedule("nightly").pending != ""


def test_held_jobs_are_cancelled(redis_url: str, q: Queue) -> None:
    jobs = [q.enqueue("t", concurrency_key="k", concurrency_limit=1) for _ in range(3)]
    running = q.claim("w1", limit=3).jobs  # one runs, the other two are set aside (held)
    assert len(running) == 1
    held = [j for j in jobs if j != running[0].id]
    assert q.client.zcard(q.keys.flow_held) == 2
    got = cancel(redis_url, q.name, "--state", "held", "--yes", "--json")
    assert as_json(got)["cancelled"] == 2, got.output
    assert {q.status(i) for i in held} == {"cancelled"} and q.status(running[0].id) == "leased"


def test_a_partitioned_queue_by_state_and_by_id(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        ids = pq.enqueue_many([JobSpec("send", {"i": i}) for i in range(12)])
        assert len({pq.part_of(i).name for i in ids}) > 1  # spread over partitions
        one = cancel(redis_url, queue_name, ids[0], "--json")
        assert one.exit_code == 0 and as_json(one)["jobs"] == {ids[0]: "due"}
        got = cancel(redis_url, queue_name, "--state", "due", "--yes", "--json")
        assert as_json(got)["cancelled"] == 11, got.output
        assert {pq.status(i) for i in ids} == {"cancelled"}
    finally:
        delete_partitioned(client, pq)


def test_bad_usage_changes_nothing(redis_url: str, q: Queue) -> None:
    job = q.enqueue("send", None)
    before = dump_queue(q.client, q)
    for args in ([job, "--state", "due"], [], ["--task", "send", job], ["bad id!"]):
        got = cancel(redis_url, q.name, *args)
        assert got.exit_code == exits.EXIT_USAGE, (args, got.output)
    assert dump_queue(q.client, q) == before
