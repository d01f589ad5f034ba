"""A partitioned queue (client/partitioned.py) in the public surface: the CLI works on the
logical name as on one queue (stats and discovery list it once, listings merge, ids route to
their partition), `open_queue` returns the right client, and the asyncio client has every
method of the sync one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis
from click.testing import CliRunner

from scheduler import JobSpec, Queue, open_queue, open_queue_async
from scheduler.admin.inspection import logical_queues
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from tests.test_parity import parity_problems


def run(redis_url: str, *args: str) -> Any:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, [*args, "--url", redis_url, "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stderr: the server-settings warnings


def kill_one_per_partition(pq: PartitionedQueue) -> list[str]:
    """One job dies in each partition, 1 ms apart on each partition's test clock (a client
    that reads the clock key, not TIME): the merged order is by that time."""
    died = []
    start_ms = pq.counts().now_ms
    for k, part in enumerate(pq.parts):
        clocked = Queue(part.client, part.name, _clock="test")
        part.client.set(clocked.keys.test_clock, start_ms + k)
        job = clocked.claim("w", limit=1).jobs[0]
        clocked.fail(job.id, job.token, ValueError("x"), retryable=False)
        died.append(job.id)
    return died


def test_stats_and_discovery_show_the_logical_queue_once(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(7)])
    found = logical_queues(client)
    assert pq.name in found and not {p.name for p in pq.parts} & set(found)
    rows = run(redis_url, "stats", "-q", pq.name)["queues"]
    assert [(r["queue"], r["due"], r["partitions"]) for r in rows] == [(pq.name, 7, 3)]
    assert rows[0]["oldest_overdue_id"] in {j.id for j in pq.list_jobs("due")}
    every = [r["queue"] for r in run(redis_url, "stats")["queues"]]
    assert every.count(pq.name) == 1 and not {p.name for p in pq.parts} & set(every)


def test_jobs_list_merges_and_show_routes_by_id(redis_url: str, pq: PartitionedQueue) -> None:
    now_ms = pq.counts().now_ms
    # Round robin: run times interleave across the partitions; merged, in run-time order.
    ids = [pq.enqueue("t", {"n": i}) for i in range(6)]
    listed = run(redis_url, "jobs", "list", "-q", pq.name, "--state", "due")["jobs"]
    assert sorted(j["id"] for j in listed) == sorted(ids)
    assert [j["run_at_ms"] for j in listed] == sorted(j["run_at_ms"] for j in listed)
    page = run(redis_url, "jobs", "list", "-q", pq.name, "--offset", "2", "--limit", "3")
    assert [j["id"] for j in page["jobs"]] == [j["id"] for j in listed[2:5]]
    shown = run(redis_url, "jobs", "show", "-q", pq.name, ids[4])
    assert shown["id"] == ids[4] and shown["queue"] == pq.name
    assert shown["partition"] == pq.part_of(ids[4]).name and shown["run_at_ms"] >= now_ms - 60_000


def test_dead_list_requeue_and_purge_on_the_logical_name(
    redis_url: str, pq: PartitionedQueue
) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(3)])
    died = kill_one_per_partition(pq)
    listed = run(redis_url, "dead", "list", "-q", pq.name)
    assert listed["total"] == 3 and [j["id"] for j in listed["jobs"]] == died[::-1]
    done = run(redis_url, "dead", "requeue", "-q", pq.name, "--yes", "--id", died[1])
    assert (done["matched"], done["done"]) == (1, 1) and pq.status(died[1]) == "due"
    purged = run(redis_url, "dead", "purge", "-q", pq.name, "--yes")
    assert purged["done"] == 2 and pq.counts().dead == 0


def test_schedules_enqueue_and_doctor_on_the_logical_name(
    redis_url: str, pq: PartitionedQueue
) -> None:
    run(redis_url, "schedules", "add", "nightly", "report", "-q", pq.name, "--every-ms", "60000")
    home = pq.parts[pq.layout.partition_of_schedule("nightly")]
    assert [p.name for p in pq.parts if p.list_schedules()] == [home.name]
    listed = run(redis_url, "schedules", "list", "-q", pq.name)["schedules"]
    assert [s["name"] for s in listed] == ["nightly"]
    assert run(redis_url, "schedules", "pause", "nightly", "-q", pq.name)["status"] == "paused"
    assert run(redis_url, "schedules", "remove", "nightly", "-q", pq.name)["status"] == "removed"
    job_id = run(redis_url, "enqueue", "t", "-q", pq.name, "--key", "k9")["id"]
    assert pq.part_of(job_id) is pq.parts[pq.layout.partition_of_key("k9")]
    assert pq.status(job_id) == "due"
    checked = run(redis_url, "doctor", "-q", pq.name, "--no-server")
    assert checked["ok"] and checked["queues"] == [p.name for p in pq.parts]


def test_open_queue_returns_the_stored_kind(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    opened = open_queue(client, pq.name)
    assert isinstance(opened, PartitionedQueue) and opened.layout == pq.layout
    plain = open_queue(client, pq.name + "-plain")
    assert type(plain) is Queue and plain.name == pq.name + "-plain"

    async def main() -> tuple[object, object]:
        aclient = connect_async(redis_url)
        try:
            plain = await open_queue_async(aclient, pq.name + "-plain")
            return await open_queue_async(aclient, pq.name), plain
        finally:
            await aclient.aclose()

    apq, aplain = asyncio.run(main())
    assert isinstance(apq, AsyncPartitionedQueue) and apq.layout == pq.layout
    assert not isinstance(aplain, AsyncPartitionedQueue)


def test_the_async_partitioned_queue_has_every_sync_method() -> None:
    # part_of only routes (no I/O), so it stays a plain method in both.
    problems = parity_problems(PartitionedQueue, AsyncPartitionedQueue)
    assert problems == ["part_of: not a coroutine function in AsyncPartitionedQueue"]


def test_async_schedules_and_requeue_act_as_the_sync_ones(
    redis_url: str, pq: PartitionedQueue
) -> None:
    pq.enqueue_many([JobSpec("t", None) for _ in range(3)])
    died = kill_one_per_partition(pq)

    async def main() -> tuple[list[str], int, str, list[str], str]:
        aclient = connect_async(redis_url)
        try:
            aq = await AsyncPartitionedQueue.open(aclient, pq.name)
            dead = [j.id for j in await aq.list_jobs("dead")]
            moved = await aq.requeue_dead(died[:2])
            made = await aq.schedule("hourly", "report", None, every_ms=3_600_000)
            names = [s.name for s in await aq.list_schedules()]
            paused = await aq.pause_schedule("hourly")
            return dead, moved, made, names, paused
        finally:
            await aclient.aclose()

    dead, moved, made, names, paused = asyncio.run(main())
    assert dead == died[::-1] and moved == 2 and pq.counts().dead == 1
    assert (made, names, paused) == ("created", ["hourly"], "paused")
    assert pq.get_schedule("hourly").paused


def test_worker_metrics_label_partitions_by_their_logical_queue() -> None:
    from prometheus_client import generate_latest

    from scheduler import QueueCounts
    from scheduler.worker.metrics import WorkerMetrics

    m = WorkerMetrics()
    m.logical = {"q.p0": "q", "q.p1": "q"}
    m.outcome("q.p0", "t", "done")
    m.outcome("q.p1", "t", "done", 2)
    m.outcome("q.p1", "t", "retry")
    m.outcome("plain", "t", "done")
    m.set_depth(
        "q.p0",
        QueueCounts(now_ms=10, due=3, scheduled=0, leased=1, dead=0, oldest_due_ms=None, lapsed=0),
    )
    m.set_depth(
        "q.p1",
        QueueCounts(now_ms=12, due=4, scheduled=2, leased=0, dead=5, oldest_due_ms=None, lapsed=0),
    )
    m.set_depth(
        "q.p0",
        QueueCounts(now_ms=20, due=1, scheduled=0, leased=1, dead=0, oldest_due_ms=None, lapsed=0),
    )
    text = generate_latest(m.registry).decode()
    assert 'scheduler_jobs_total{outcome="done",queue="q",task="t"} 3.0' in text
    assert 'scheduler_jobs_total{outcome="retry",queue="q",task="t"} 1.0' in text
    assert 'scheduler_jobs_total{outcome="done",queue="plain",task="t"} 1.0' in text
    assert 'scheduler_queue_jobs{queue="q",state="due"} 5.0' in text  # 1 (latest p0) + 4
    assert 'scheduler_queue_jobs{queue="q",state="dead"} 5.0' in text
    assert "q.p0" not in text and "q.p1" not in text


def test_dead_retention_is_refused_on_the_logical_name(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    result = CliRunner().invoke(
        main, ["dead", "retention", "-q", pq.name, "--max-count", "5", "--yes", "--url", redis_url]
    )
    assert result.exit_code == 1 and "is partitioned" in result.output
    assert pq.parts[0].name in result.output
    assert not client.exists(pq.parts[0].keys.config)  # nothing written, anywhere
    assert not client.exists(f"sched:{{{pq.name}}}:config")
