"""Running a recurring schedule once now (lua/schedule_run.lua, Queue.run_schedule_now): one job
due now, written as the schedule's own runs are (task, payload, job and flow options, the
`schedule` field), the schedule itself untouched (next run, paused state, what it remembers);
a missing or unreadable schedule is refused with nothing written. Real scripts, a test clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, Backoff, BadArgument, Queue, ScheduleNotFound
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from tests.conftest import Clock, dump_queue

HOUR_MS = 3_600_000
T0 = 1_000 * HOUR_MS + 123  # between two slots of an hourly schedule
# What differs between two runs of one schedule: when, and (an occurrence only) its slot.
WHEN = ("run_at_ms", "enqueued_ms", "slot_ms")
OPTIONS = {
    "max_attempts": 3,
    "backoff": Backoff(base_ms=2_000, factor=3.0, cap_ms=60_000, jitter=0.0),
    "timeout_ms": 45_000,
    "priority": 7,
    "concurrency_key": "reports",
    "concurrency_limit": 2,
    "rate_limit": "5/1m",
}


def _schedule_keys(client: redis.Redis, q: Queue, name: str) -> tuple[object, ...]:
    """Everything stored of the schedule: its hash, its cron buffer, the refill and name sets."""
    return (
        client.hgetall(q.keys.schedule(name)),
        client.zrange(q.keys.schedule_slots(name), 0, -1, withscores=True),
        sorted(client.smembers(q.keys.schedules)),
        sorted(client.smembers(q.keys.schedules_refill)),
    )


def _without_when(fields: Mapping[Any, Any]) -> dict[Any, Any]:
    return {k: v for k, v in fields.items() if k not in WHEN}


def test_the_job_is_due_now_with_the_schedules_task_payload_and_options(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("report", "report.build", {"tenant": 7}, every_ms=HOUR_MS, **OPTIONS)  # type: ignore[arg-type]
    occurrence = q.get_schedule("report").pending
    client.delete(q.keys.wake)  # the tokens the definition left
    job_id = q.run_schedule_now("report")
    assert client.llen(q.keys.wake) == 1  # idle workers woken: it is due now
    assert job_id != occurrence and not job_id.startswith("schedule:")
    job = q.get_job(job_id)
    assert (job.state, job.task, job.payload_json) == ("due", "report.build", '{"tenant":7}')
    assert int(job.fields["run_at_ms"]) == T0  # due now, on the server's clock
    assert "slot_ms" not in job.fields  # no slot of the schedule
    # Stored as the schedule's own occurrence is, when aside: the schedule's name, the job
    # options and the flow options (priority, concurrency key and limit, rate limit).
    mine, its = client.hgetall(q.keys.job(job_id)), client.hgetall(q.keys.job(occurrence))
    assert _without_when(mine) == _without_when(its)
    assert mine["schedule"] == "report" and "slot_ms" in its
    assert client.zscore(q.keys.prefix + "flow:pdue:7", job_id) == T0  # its priority level
    (claimed,) = q.claim("w", limit=10).jobs  # the occurrence is an hour away
    assert claimed.id == job_id and claimed.schedule == "report"
    assert (claimed.max_attempts, claimed.timeout_ms) == (3, 45_000)
    assert claimed.backoff == OPTIONS["backoff"] and claimed.payload() == {"tenant": 7}


def test_the_schedule_is_unchanged_before_and_after_the_job_runs(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("nightly", "report.build", cron="0 3 * * *", tz="Europe/Berlin")
    before, stored = q.get_schedule("nightly"), _schedule_keys(client, q, "nightly")
    job_id = q.run_schedule_now("nightly")
    assert q.get_schedule("nightly") == before and _schedule_keys(client, q, "nightly") == stored
    (claimed,) = q.claim("w").jobs
    q.complete(claimed.id, claimed.token, "ok")
    # Its run ends as any job's; the schedule neither re-arms nor remembers it as a slot.
    assert claimed.id == job_id and q.status(job_id) == "done"
    assert q.get_schedule("nightly") == before and _schedule_keys(client, q, "nightly") == stored
    assert q.schedule("nightly", "report.build", cron="0 3 * * *", tz="Europe/Berlin") == (
        "unchanged"
    )


def test_a_paused_schedule_runs_now_and_stays_paused(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("p", "t", every_ms=HOUR_MS)
    assert q.pause_schedule("p") == "paused"
    stored = _schedule_keys(client, q, "p")
    job_id = q.run_schedule_now("p")
    (claimed,) = q.claim("w").jobs
    assert claimed.id == job_id
    q.complete(job_id, claimed.token)
    assert q.get_schedule("p").paused and _schedule_keys(client, q, "p") == stored
    clock.set_ms(T0 + 3 * HOUR_MS)
    assert q.claim("w").jobs == []  # still paused: no run of its own
    assert q.resume_schedule("p") == "resumed"
    assert q.get_schedule("p").next_run_ms == 1_004 * HOUR_MS


def test_the_job_outlives_a_pause_or_remove_of_its_schedule(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("gone", "t", every_ms=HOUR_MS)
    job_id = q.run_schedule_now("gone")
    assert q.pause_schedule("gone") == "paused" and q.remove_schedule("gone") == "removed"
    assert [j.id for j in q.claim("w").jobs] == [job_id]  # a job of its own
    assert q.list_schedules() == []  # its claim armed nothing


def test_an_unknown_schedule_is_refused_and_nothing_is_written(
    client: redis.Redis, q: Queue
) -> None:
    q.schedule("other", "t", every_ms=HOUR_MS)
    before = dump_queue(client, q)
    with pytest.raises(ScheduleNotFound, match=f"no schedule 'nope' in queue '{q.name}'"):
        q.run_schedule_now("nope")
    with pytest.raises(BadArgument):  # what get_schedule raised before: callers still catch it
        q.run_schedule_now("nope")
    with pytest.raises(ScheduleNotFound):  # the same typed error as a run of it
        q.get_schedule("nope")
    q.remove_schedule("other")
    removed = dump_queue(client, q)
    with pytest.raises(ScheduleNotFound):  # removed: nothing left to run
        q.run_schedule_now("other")
    assert dump_queue(client, q) == removed
    for bad in ("a b", "", "x" * 65):
        with pytest.raises(BadArgument, match="schedule name"):
            q.run_schedule_now(bad)
    assert dump_queue(client, q) == removed and before != removed


def test_an_unreadable_definition_is_refused_and_nothing_is_written(
    client: redis.Redis, q: Queue
) -> None:
    q.schedule("edited", "t", every_ms=HOUR_MS)
    client.hdel(q.keys.schedule("edited"), "task")  # a hand edit the scripts cannot read
    client.set(q.keys.schedule("typed"), "a string")  # a key edited into another type
    before = dump_queue(client, q)
    for name in ("edited", "typed"):
        with pytest.raises(BadArgument, match=f"schedule '{name}' definition unreadable"):
            q.run_schedule_now(name)
    assert dump_queue(client, q) == before


def test_a_given_job_id_makes_a_resent_call_create_nothing_twice(
    client: redis.Redis, q: Queue
) -> None:
    q.schedule("s", "t", every_ms=HOUR_MS)
    assert q.run_schedule_now("s", job_id="manual-1") == "manual-1"
    once = dump_queue(client, q)
    assert q.run_schedule_now("s", job_id="manual-1") == "manual-1"  # its reply was lost
    assert dump_queue(client, q) == once
    for bad in ("schedule:s:1", "no spaces", ""):  # occurrences' ids; malformed ids
        with pytest.raises(BadArgument, match="invalid job id"):
            q.run_schedule_now("s", job_id=bad)
    assert dump_queue(client, q) == once


def test_the_async_client(client: redis.Redis, q: Queue, redis_url: str) -> None:
    q.schedule("s", "t", {"a": 1}, every_ms=HOUR_MS)

    async def run() -> str:
        aclient = connect_async(redis_url)
        try:
            aq = AsyncQueue(aclient, q.name)
            with pytest.raises(ScheduleNotFound):
                await aq.run_schedule_now("nope")
            return await aq.run_schedule_now("s")
        finally:
            await aclient.aclose()

    job_id = asyncio.run(run())
    assert q.get_job(job_id).fields["schedule"] == "s" and q.status(job_id) == "due"


@pytest.mark.pq(suffix="-p")
def test_a_partitioned_queue_runs_it_in_the_schedules_partition(
    client: redis.Redis, pq: PartitionedQueue, redis_url: str
) -> None:
    pq.schedule("nightly", "report", {"x": 1}, every_ms=HOUR_MS)
    k = pq.layout.partition_of_schedule("nightly")
    job_id = pq.run_schedule_now("nightly")
    assert job_id.startswith(f"p{k}.")  # tagged: the job's own calls find its partition
    assert pq.get_job(job_id).fields["schedule"] == "nightly" and pq.counts().due == 1
    elsewhere = f"p{(k + 1) % 3}.mine"
    with pytest.raises(BadArgument, match=f"give an id tagged 'p{k}.'"):
        pq.run_schedule_now("nightly", job_id=elsewhere)
    with pytest.raises(ScheduleNotFound):
        pq.run_schedule_now("nope")
    with pytest.raises(BadArgument, match="is partitioned"):  # a plain Queue on its name
        Queue(client, pq.name).run_schedule_now("nightly")

    async def run() -> str:
        aclient = connect_async(redis_url)
        try:
            return await (await AsyncPartitionedQueue.open(aclient, pq.name)).run_schedule_now(
                "nightly"
            )
        finally:
            await aclient.aclose()

    again = asyncio.run(run())
    assert again.startswith(f"p{k}.") and pq.status(again) == "due" and pq.counts().due == 2


def test_cli_prints_the_job_id_and_exits_1_for_an_unknown_schedule(
    client: redis.Redis, q: Queue, redis_url: str
) -> None:
    q.schedule("nightly", "report.build", {"x": 1}, cron="0 3 * * *")
    base = ["--url", redis_url, "--queue", q.name]
    run = CliRunner().invoke
    out = run(main, ["schedules", "run", "nightly", *base])
    assert out.exit_code == 0, out.output
    job_id = out.output.strip()
    assert q.get_job(job_id).fields["schedule"] == "nightly" and q.status(job_id) == "due"
    out = run(main, ["schedules", "run", "nightly", *base, "--json"])
    data = json.loads(out.output)
    assert out.exit_code == 0 and data.pop("job_id") != job_id
    assert data == {"queue": q.name, "schedule": "nightly", "status": "created"}
    before = dump_queue(client, q)
    out = run(main, ["schedules", "run", "nope", *base])
    assert (out.exit_code, out.output.strip()) == (1, "nope: missing")  # as pause / remove say
    out = run(main, ["schedules", "run", "nope", *base, "--json"])
    assert out.exit_code == 1
    assert json.loads(out.output) == {"queue": q.name, "schedule": "nope", "status": "missing"}
    assert run(main, ["schedules", "run", "a:b", *base]).exit_code == 2  # a malformed name
    assert dump_queue(client, q) == before
