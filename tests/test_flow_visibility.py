"""Held jobs are visible outside the job record (docs/flow-control.md): the counts script
reports them by reason (and no longer takes them off `scheduled`), a partitioned queue sums
them, and the worker's metrics export them as scheduler_queue_held_jobs{queue, reason}."""

from __future__ import annotations

from scheduler import Queue
from scheduler.client.partitioned_merge import merge_counts
from scheduler.core.models import QueueCounts
from scheduler.core.vocabulary import HELD_REASONS
from scheduler.worker.metrics import WorkerMetrics


def hold_one_of_each(q: Queue) -> None:
    """One job held by a key limit, one by a rate window, one waiting for a parent; plus one
    job scheduled an hour from now."""
    for i in range(2):
        q.enqueue("sync", i, concurrency_key="tenant:7", concurrency_limit=1)
    for i in range(2):
        q.enqueue("send", i, rate_limit=(1, 3_600_000))
    parent = q.enqueue("fetch", None, delay_ms=3_600_000)
    q.enqueue("index", None, after=[parent])
    assert len(q.claim("w1", limit=10).jobs) == 2  # one of each limited pair


def test_counts_report_held_jobs_by_reason(q: Queue) -> None:
    hold_one_of_each(q)
    c = q.counts()
    assert c.held == {"key_limit": 1, "rate_window": 1, "waiting": 1}
    assert tuple(c.held) == HELD_REASONS
    assert c.due == 3  # the held ones are due, only set aside
    assert c.scheduled == 1  # the delayed parent only (before: 1 - 3 held = -2)
    assert c.leased == 2


def test_metrics_export_held_jobs_by_reason(q: Queue) -> None:
    hold_one_of_each(q)
    m = WorkerMetrics()
    m.set_depth(q.name, q.counts())
    for reason in HELD_REASONS:
        labels = {"queue": q.name, "reason": reason}
        assert m.registry.get_sample_value("scheduler_queue_held_jobs", labels) == 1.0
    due = m.registry.get_sample_value("scheduler_queue_jobs", {"queue": q.name, "state": "due"})
    assert due == 3.0
    sched = {"queue": q.name, "state": "scheduled"}
    assert m.registry.get_sample_value("scheduler_queue_jobs", sched) == 1.0


def test_a_partitioned_queue_sums_its_partitions_held_jobs() -> None:
    def part(now_ms: int, key: int, rate: int, waiting: int) -> QueueCounts:
        return QueueCounts(now_ms, key + rate + waiting, 0, 0, 0, None, 0, key, rate, waiting)

    merged = merge_counts([part(10, 1, 0, 2), part(12, 3, 4, 0)])
    assert merged.held == {"key_limit": 4, "rate_window": 4, "waiting": 2}
    m = WorkerMetrics()
    m.logical = {"jobs.p0": "jobs", "jobs.p1": "jobs"}
    m.set_depth("jobs.p0", part(10, 1, 0, 2))
    m.set_depth("jobs.p1", part(12, 3, 4, 0))
    labels = {"queue": "jobs", "reason": "key_limit"}
    assert m.registry.get_sample_value("scheduler_queue_held_jobs", labels) == 4.0
