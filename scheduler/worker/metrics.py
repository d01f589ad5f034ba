"""Prometheus metrics of one worker process, on a private registry (several Workers in one
process, as in tests, do not collide). Served by `scheduler worker --metrics-port`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from scheduler.core.models import QueueCounts
from scheduler.core.vocabulary import OUTCOMES

# Lateness and run time span a few ms (on-time claims) to minutes (slow handlers).
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
              300)  # fmt: skip


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.outcomes = Counter(
            "scheduler_jobs", "Job outcomes seen by this worker "
            "(stale: a result the server refused; expired: the lease ran out before reporting)",
            ["queue", "task", "outcome"], registry=r,
        )  # fmt: skip
        self.lateness = Histogram(
            "scheduler_job_lateness_seconds", "Claim time minus run_at (server clock)",
            ["queue", "task"], buckets=_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "scheduler_job_duration_seconds", "Handler run time",
            ["queue", "task"], buckets=_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("scheduler_jobs_in_flight", "Jobs running now", registry=r)
        self.depth = Gauge(
            "scheduler_queue_jobs", "Jobs per place, from one counts script call per heartbeat",
            ["queue", "state"], registry=r,
        )  # fmt: skip
        self.redis_errors = Counter(
            "scheduler_redis_errors", "Redis calls that failed and were retried", registry=r
        )
        self.redis_backoffs = Counter(
            "scheduler_redis_backoffs", "Redis errors a worker loop backed off on and retried "
            "(loop: claim, heartbeat, presence, report, wake, release; error: the class, e.g. "
            "OutOfMemoryError for a full server)", ["loop", "error"], registry=r,
        )  # fmt: skip
        self.abandoned_threads = Gauge(
            "scheduler_abandoned_threads", "Sync handler threads stopped (timeout, lease expired) "
            "but still running", registry=r,
        )  # fmt: skip
        self.claim_paused = Gauge(
            "scheduler_claim_paused", "1 while the worker does not claim, by reason",
            ["reason"], registry=r,
        )  # fmt: skip

        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def per_task(self, queue: str, task: str) -> tuple[Any, Any, Any]:
        """(lateness, duration, done counter) children, cached: labels() per job is slow."""
        key = (queue, task)
        c = self._children.get(key)
        if c is None:
            c = (self.lateness.labels(queue, task), self.duration.labels(queue, task),
                 self.outcomes.labels(queue, task, "done"))  # fmt: skip
            self._children[key] = c
        return c

    def outcome(self, queue: str, task: str, outcome: str, n: int = 1) -> None:
        if outcome == "done":
            self.per_task(queue, task)[2].inc(n)
        elif outcome not in OUTCOMES:  # a word outside the vocabulary is a bug, not a new label
            raise ValueError(f"unknown outcome {outcome!r}: not one of {OUTCOMES}")
        else:
            self.outcomes.labels(queue, task, outcome).inc(n)

    def set_depth(self, queue: str, counts: QueueCounts) -> None:
        for state, value in (("due", counts.due), ("scheduled", counts.scheduled),
                             ("leased", counts.leased), ("dead", counts.dead),
                             ("lapsed", counts.lapsed)):  # fmt: skip
            self.depth.labels(queue, state).set(value)
        self.depth.labels(queue, "oldest_overdue_ms").set(counts.oldest_overdue_ms)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics in a daemon thread; returns the bound port (0 picks a free one)."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_address[1])
