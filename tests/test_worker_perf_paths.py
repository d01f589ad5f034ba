"""The worker's hot-path shortcuts keep its behaviour: the per-job metrics kept as plain numbers
publish what prometheus-client objects would; claim hysteresis never holds an idle worker; at
WARNING nothing is logged per job."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis.asyncio as aredis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler import AsyncQueue, Queue
from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import parse_stored_backoff
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.execution import Running
from scheduler.worker.metrics import _BUCKETS_S, WorkerMetrics
from scheduler.worker.registry import Registry
from scheduler.worker.settings import CLAIM_MIN_FREE
from tests.embedded_worker import worker_thread
from tests.workers.procs import wait_for

registry = Registry()


@registry.task("quick")
def quick(payload: Any, ctx: Any) -> int:
    return 1


def samples(reg: CollectorRegistry, prefixes: tuple[str, ...]) -> dict[Any, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.name.startswith(prefixes) and not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_plain_number_metrics_publish_what_prometheus_objects_would() -> None:
    values_s = [0.0, 0.001, 0.0011, 0.3, 1.0, 7.5, 299.0, 300.0, 301.0, 5000.0]
    ours = WorkerMetrics()
    ref = CollectorRegistry()
    lat = Histogram("scheduler_job_lateness_seconds", "", ["queue", "task"], buckets=_BUCKETS_S,
                    registry=ref)  # fmt: skip
    dur = Histogram("scheduler_job_duration_seconds", "", ["queue", "task"], buckets=_BUCKETS_S,
                    registry=ref)  # fmt: skip
    jobs = Counter("scheduler_jobs", "", ["queue", "task", "outcome"], registry=ref)
    for i, v in enumerate(values_s):
        task = "a" if i % 3 else "b"
        ours.per_task("q", task).lateness.observe(v)
        lat.labels("q", task).observe(v)
        ours.per_task("q", task).duration.observe(v / 2)
        dur.labels("q", task).observe(v / 2)
        ours.per_task("q", task).done += 1
        jobs.labels("q", task, "done").inc()
    ours.outcome("q", "a", "retry", 3)
    jobs.labels("q", "a", "retry").inc(3)
    ours.outcome("q", "b", "done")
    jobs.labels("q", "b", "done").inc()
    names = ("scheduler_job_", "scheduler_jobs_total")
    got, want = samples(ours.registry, names), samples(ref, names)
    assert got == want
    assert got[("scheduler_jobs_total", (("outcome", "done"), ("queue", "q"), ("task", "b")))] == 5


def test_an_outcome_word_outside_the_vocabulary_is_refused() -> None:
    m = WorkerMetrics()
    with pytest.raises(ValueError, match="unknown outcome"):
        m.outcome("q", "t", "completed")
    assert samples(m.registry, ("scheduler_jobs_total",)) == {}


def idle_worker(**settings: Any) -> Worker:
    # Never connects: the tests below ask the claim policy only.
    return Worker(aredis.Redis(), registry, WorkerSettings(**settings))


def busy(w: Worker, n: int) -> None:
    for i in range(n):
        w.running[("q", f"j{i}")] = cast(Running, SimpleNamespace(started_s=time.monotonic()))


def test_an_idle_worker_claims_at_once_even_for_one_free_slot() -> None:
    w = idle_worker(concurrency=16, prefetch=100)
    w._mean_run_s = 0.001  # short jobs: the hysteresis is in force
    assert not w._hold_claim(1)
    busy(w, 1)  # the same free count while busy waits for a batch's worth
    assert w._hold_claim(1)
    assert w._hold_claim(CLAIM_MIN_FREE - 1)
    assert not w._hold_claim(CLAIM_MIN_FREE)


def test_long_jobs_or_a_small_worker_never_hold_a_claim() -> None:
    w = idle_worker(concurrency=16, prefetch=100)
    busy(w, 16)
    assert not w._hold_claim(1)  # no run time known yet
    w._mean_run_s = 1.0  # long jobs: claim as soon as a slot frees
    assert not w._hold_claim(1)
    small = idle_worker(concurrency=2, prefetch=0)
    small._mean_run_s = 0.001
    busy(small, 1)
    assert not small._hold_claim(1)  # the threshold is at most half the capacity


def test_a_run_longer_than_a_heartbeat_interval_stops_the_prefetch() -> None:
    # claiming._one_runs_long: the jobs a worker claims ahead wait behind its runs; behind one
    # that has gone on past an interval (a hang, no timeout) they are not claimed at all.
    w = idle_worker(concurrency=4, prefetch=100, heartbeat_ms=1_000, lease_ms=3_000)
    w._mean_run_s = 0.001  # short jobs: prefetching
    run = cast(Running, SimpleNamespace(started_s=time.monotonic()))
    w.running[("q", "j")] = run
    assert w._room() == 4 + 100 - 1
    run.started_s = time.monotonic() - 2.0  # two intervals ago
    assert w._room() == 4 - 1  # the free slots only


def test_a_busy_short_job_worker_holding_claims_still_runs_every_job(
    redis_url: str, q: Queue
) -> None:
    # Logic, not timing: a hold is released by job ends, so none is left unclaimed.
    settings = WorkerSettings(queues=(q.name,), concurrency=4, prefetch=100, batch_size=30)

    def fast(w: Worker) -> None:
        w._mean_run_s = 0.001

    ids = q.enqueue_many([registry.job_spec("quick", {"i": i}) for i in range(300)])
    with worker_thread(redis_url, registry, settings, setup=fast):
        wait_for(lambda: q.counts().due == 0 and q.counts().leased == 0, what="drained")
        lone = q.enqueue("quick", {})  # the worker is idle again: claimed at once
        wait_for(lambda: q.status(lone) == "done", what="lone job done")
    assert all(q.status(i) == "done" for i in ids)


class CountingLogger(logging.Logger):
    def __init__(self) -> None:
        super().__init__("scheduler.worker.perf-test", logging.WARNING)
        self.records = 0

    def _log(self, *args: Any, **kwargs: Any) -> None:
        self.records += 1


def test_at_warning_a_job_that_succeeds_logs_nothing(redis_url: str, q: Queue) -> None:
    log = CountingLogger()
    ids = q.enqueue_many([registry.job_spec("quick", {"i": i}) for i in range(20)])
    with worker_thread(redis_url, registry, WorkerSettings(queues=(q.name,)), logger=log):
        wait_for(lambda: all(q.status(i) == "done" for i in ids), what="jobs done")
        during = log.records
    assert during == 0


def test_a_stored_backoff_text_parses_to_one_shared_object() -> None:
    text = "1500,3.0,90000,0.1"
    first = parse_stored_backoff(text)
    assert first == Backoff(1500, 3.0, 90000, 0.1)
    assert parse_stored_backoff(text) is first  # cached: no parse, no new object per job
    assert parse_stored_backoff("1500,3.0,90000,nope") is None  # unreadable stays unreadable
    assert parse_stored_backoff("1500,3.0,90000,nope") is None


def test_claimed_jobs_of_one_task_share_their_backoff(redis_url: str, q: Queue) -> None:
    aq_client = aredis.Redis.from_url(redis_url, decode_responses=True)
    b = Backoff(2500, 1.5, 70000, 0.2)
    q.enqueue_many([registry.job_spec("quick", {"i": i}, backoff=b) for i in range(3)])

    async def claim() -> list[Any]:
        try:
            batch = await AsyncQueue(aq_client, q.name).claim("w1", limit=3, lease_ms=5000)
            return [j.backoff for j in batch.jobs]
        finally:
            await aq_client.aclose()

    got = asyncio.run(claim())
    assert len(got) == 3 and got[0] == b
    assert got[1] is got[0] and got[2] is got[0]
