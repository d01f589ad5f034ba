"""Pausing a whole queue (lua/queue_pause.lua, lua/queue_resume.lua, claim.lua's check), on a
real Redis: a paused queue's claims lease nothing, while enqueues are accepted, held leases
settle and lapsed leases are still reaped; resume wakes idle workers; a hand-edited config is
refused with a typed error and changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, JobSpec, Queue
from scheduler.cli.main import main
from scheduler.cli.worker_pool_metrics import QUEUE_LEVEL
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.errors import CorruptKey
from scheduler.worker.metrics import WorkerMetrics
from tests.conftest import delete_queue
from tests.workers.procs import spawn_worker, stop_all, wait_for


def test_a_paused_queue_leases_nothing_until_resumed(q: Queue) -> None:
    ids = q.enqueue_many([JobSpec("echo", {"i": i}) for i in range(3)])
    assert q.counts().paused is False
    assert q.pause() == "paused"
    before = q.counts()
    assert q.pause() == "already"
    assert q.counts().paused_ms == before.paused_ms  # the first pause's time is kept
    assert before.paused and abs(before.paused_ms - before.now_ms) < 1_000  # type: ignore[operator]
    batch = q.claim("w1", limit=10)
    assert batch.jobs == [] and batch.next_ms == -1  # nothing to come back for
    later = q.enqueue("echo", {"i": 3})  # still accepted, and waits
    assert {q.status(j) for j in [*ids, later]} == {"due"}
    assert q.resume() == "resumed"
    assert q.resume() == "active"
    assert q.counts().paused is False
    assert sorted(j.id for j in q.claim("w1", limit=10).jobs) == sorted([*ids, later])


def test_held_leases_settle_and_lapsed_ones_are_reaped_while_paused(q: Queue) -> None:
    a, b = q.enqueue("echo", None), q.enqueue("echo", None, max_attempts=1)
    # a's and b's leases are to lapse (200 ms); c's is not (a minute): with one 200 ms lease
    # for all three, a stall past it before c's heartbeat (a loaded machine) lapsed c too.
    held = {j.id: j for j in q.claim("w1", limit=2, lease_ms=200).jobs}
    c = q.enqueue("echo", None)
    held |= {j.id: j for j in q.claim("w1", limit=1, lease_ms=60_000).jobs}
    assert set(held) == {a, b, c}
    q.pause()
    _, beat = q.heartbeat([(c, held[c].token)], lease_ms=60_000)
    assert beat == {c: "held"}
    q.complete(c, held[c].token, "ok")  # a job already running finishes as usual
    time.sleep(0.3)  # a's and b's leases lapse
    batch = q.claim("w2", limit=10)
    assert batch.jobs == []
    assert q.status(c) == "done"
    assert q.status(a) == "due" and q.get_job(a).fields["lapses"] == "1"  # reaped, not leased
    assert q.status(b) == "dead"  # its only attempt was used up
    q.resume()
    assert [j.id for j in q.claim("w2", limit=10).jobs] == [a]


def test_a_hand_edited_config_is_refused_whole(client: redis.Redis, q: Queue) -> None:
    job = q.enqueue("echo", None)
    client.set(q.keys.config, "not a hash")
    with pytest.raises(CorruptKey):
        q.pause()
    with pytest.raises(CorruptKey):
        q.resume()
    assert client.get(q.keys.config) == "not a hash"
    # An unreadable config is no pause (doctor reports the key): the queue keeps running.
    assert q.counts().paused is False
    assert [j.id for j in q.claim("w1").jobs] == [job]
    client.delete(q.keys.config)
    client.hset(q.keys.config, "paused_ms", "soon")  # a value that is no time still pauses
    assert q.counts().paused_ms == 0
    q.enqueue("echo", None, job_id="j2")
    assert q.claim("w1").jobs == []
    assert q.resume() == "resumed"


def test_a_worker_idles_on_a_paused_queue_and_resume_wakes_it(
    redis_url: str, q: Queue, tmp_path: Path
) -> None:
    q.pause()
    ids = q.enqueue_many([JobSpec("echo", {"i": i}) for i in range(20)])
    log = tmp_path / "worker.log"
    w = spawn_worker(redis_url, q.name, log=str(log))
    try:
        wait_for(lambda: q.client.exists(q.keys.workers) == 1, what="the worker up")
        time.sleep(1.0)  # it claims (and is answered nothing) meanwhile
        assert {q.status(j) for j in ids} == {"due"}, "a paused queue's job ran"
        said = [json.loads(line) for line in log.read_text().splitlines() if "paused" in line]
        assert [(m["level"], m["msg"].endswith(q.name)) for m in said] == [("warning", True)]
        assert q.resume() == "resumed"
        # Woken by the resume (its idle safety net is 30 s): well within the wait below.
        wait_for(lambda: {q.status(j) for j in ids} == {"done"}, 15, "all done after resume")
    finally:
        stop_all([w])


def test_async_and_partitioned_queues_pause_every_part(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=3)
    try:
        pq.parts[1].pause()  # a pause cut short part-way shows, and pausing again completes it
        assert pq.counts().paused_ms == pq.parts[1].counts().paused_ms is not None
        assert pq.pause() == "paused"
        assert [p.counts().paused for p in pq.parts] == [True, True, True]
        assert pq.pause() == "already"
        pq.enqueue_many([JobSpec("echo", None) for _ in range(6)])
        assert all(p.claim("w1").jobs == [] for p in pq.parts)

        async def main() -> tuple[str, str, bool]:
            aclient = connect_async(redis_url)
            try:
                aq = AsyncQueue(aclient, pq.parts[0].name)
                first = await aq.resume()
                again = await aq.resume()
                return first, again, (await aq.counts()).paused
            finally:
                await aclient.aclose()

        assert asyncio.run(main()) == ("resumed", "active", False)
        assert pq.counts().paused  # the other two still are
        assert pq.resume() == "resumed" and pq.resume() == "active"
        assert sum(len(p.claim("w1").jobs) for p in pq.parts) == 6
    finally:
        for p in pq.parts:
            delete_queue(client, p)
        client.delete(f"sched:{{{queue_name}}}:partitions")


def test_the_cli_pauses_and_resumes_and_stats_says_so(redis_url: str, q: Queue) -> None:
    q.enqueue("echo", None)
    run = CliRunner().invoke
    base = ["--url", redis_url, "-q", q.name]
    r = run(main, ["pause", *base])
    assert (r.exit_code, r.output) == (0, f"{q.name}: paused\n")
    r = run(main, ["pause", *base, "--json"])
    assert (r.exit_code, json.loads(r.output)) == (0, {"queue": q.name, "status": "already"})
    r = run(main, ["stats", *base])
    assert r.exit_code == 0 and f"{q.name} (paused)" in r.output
    row = json.loads(run(main, ["stats", *base, "--json"]).output)["queues"][0]
    assert row["paused_ms"] == q.counts().paused_ms is not None
    assert q.claim("w1").jobs == []
    r = run(main, ["resume", *base])
    assert (r.exit_code, r.output) == (0, f"{q.name}: resumed\n")
    assert run(main, ["resume", *base]).output == f"{q.name}: active\n"
    assert (
        json.loads(run(main, ["stats", *base, "--json"]).output)["queues"][0]["paused_ms"] is None
    )
    r = run(main, ["pause", "--url", redis_url, "-q", q.name + "-typo"])
    assert r.exit_code == 1 and "no queue named" in r.output
    assert len(q.claim("w1").jobs) == 1


def test_the_cli_resumes_a_paused_queue_whose_only_key_is_its_config(
    redis_url: str, q: Queue
) -> None:
    assert q.pause() == "paused"  # an empty queue: its config is its only key
    run = CliRunner().invoke
    r = run(main, ["resume", "--url", redis_url, "-q", q.name])
    assert (r.exit_code, r.output) == (0, f"{q.name}: resumed\n")
    assert q.counts().paused is False


def test_the_worker_metrics_export_the_pause(q: Queue) -> None:
    m = WorkerMetrics()
    paused = {"queue": q.name}
    m.set_depth(q.name, q.counts())
    assert m.registry.get_sample_value("scheduler_queue_paused", paused) == 0.0
    q.pause()
    m.set_depth(q.name, q.counts())
    assert m.registry.get_sample_value("scheduler_queue_paused", paused) == 1.0
    # A partitioned queue is one series: paused while any partition is.
    m.logical = {"jobs.p0": "jobs", "jobs.p1": "jobs"}
    m.set_depth("jobs.p0", q.counts())
    m.set_depth("jobs.p1", dataclasses.replace(q.counts(), paused_ms=None))
    assert m.registry.get_sample_value("scheduler_queue_paused", {"queue": "jobs"}) == 1.0
    assert "scheduler_queue_paused" in QUEUE_LEVEL  # served once by a pool, not per process
