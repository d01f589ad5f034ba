"""Prometheus metrics of one worker process, on a private registry (several Workers in one
process, as in tests, do not collide). Served by `scheduler worker --metrics-port`.

The per-job series (outcomes, lateness, run time) are plain ints and floats on the hot path,
published as metric families when scraped (_JobCollector): a prometheus-client call per job
(labels, lock, value objects) cost more CPU than the rest of the job's bookkeeping
(docs/performance.md)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Container, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.client.partitioned_merge import merge_counts
from scheduler.core.models import QueueCounts
from scheduler.core.vocabulary import OUTCOMES

METRICS_ADDR = "0.0.0.0"  # --metrics-port: a worker's, or a pool supervisor's (all interfaces)
# Lateness and run time span a few ms (on-time claims) to minutes (slow handlers).
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_LE = [repr(float(b)) for b in _BUCKETS_S] + ["+Inf"]  # as prometheus-client writes them


class Hist:
    """One histogram child as plain numbers: counts[i] holds values <= _BUCKETS_S[i] (and above
    the bucket before), the last one the rest (+Inf)."""

    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def observe(self, value_s: float) -> None:
        self.counts[bisect_left(_BUCKETS_S, value_s)] += 1
        self.sum_s += value_s


class TaskStats:
    """The per-(queue, task) numbers the hot path touches."""

    __slots__ = ("done", "duration", "lateness")

    def __init__(self) -> None:
        self.lateness = Hist()
        self.duration = Hist()
        self.done = 0


class _JobCollector(Collector):
    def __init__(self, metrics: WorkerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        # Runs in the HTTP thread while the loop writes: copy first (list() of a dict is one C
        # call under the GIL), a scrape may see one job's count without its sum, never an error.
        per_task = list(self._m._tasks.items())
        other = list(self._m._outcomes.items())
        jobs = CounterMetricFamily(
            "scheduler_jobs",
            "Job outcomes seen by this worker (stale: a result the server refused, or a run "
            "stopped as its job was gone; expired: "
            "the lease ran out before reporting; timeout: the run was stopped, and its retry or "
            "dead is counted too; task (unknown): a task this worker has no handler for)",
            labels=["queue", "task", "outcome"],
        )
        for (queue, task), st in per_task:
            if st.done:
                jobs.add_metric([queue, task, "done"], st.done)
        for (queue, task, outcome), n in other:
            jobs.add_metric([queue, task, outcome], n)
        yield jobs
        for name, doc, attr in (
            (
                "scheduler_job_lateness_seconds",
                "Claim time minus run_at (server clock)",
                "lateness",
            ),
            ("scheduler_job_duration_seconds", "Handler run time", "duration"),
        ):
            fam = HistogramMetricFamily(name, doc, labels=["queue", "task"])
            for (queue, task), st in per_task:
                h: Hist = getattr(st, attr)
                counts, total, acc = list(h.counts), h.sum_s, 0
                if not any(counts):
                    continue
                buckets = []
                for le, c in zip(_LE, counts, strict=True):
                    acc += c
                    buckets.append((le, float(acc)))
                fam.add_metric([queue, task], buckets, total)
            yield fam


UNKNOWN_TASK = "(unknown)"  # the task label of jobs whose task this worker has no handler for


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._tasks: dict[tuple[str, str], TaskStats] = {}
        self._outcomes: dict[tuple[str, str, str], int] = {}  # every outcome but done
        # A partition's `queue` label is its logical queue (client/partitioned.py), so a
        # partitioned queue is one series; set by `scheduler worker` after expanding names.
        self.logical: dict[str, str] = {}
        # The registered tasks (the worker sets its Registry): a job of any other name counts
        # under UNKNOWN_TASK, so names nobody registered cannot add series without a bound.
        self.tasks: Container[str] | None = None
        self._depths: dict[str, QueueCounts] = {}  # per queue claimed, for the logical sums
        r.register(_JobCollector(self))
        self.in_flight = Gauge("scheduler_jobs_in_flight", "Jobs running now", registry=r)
        self.depth = Gauge(
            "scheduler_queue_jobs",
            "Jobs per place, from one counts script call per heartbeat (due includes the held "
            "jobs; lapsed: leases past their end, a part of leased; moving: taken out of due "
            "by scheduler queue move)",
            ["queue", "state"],
            registry=r,
        )
        # Its own gauge, in seconds: as a `state` of scheduler_queue_jobs it made any sum over
        # states mix milliseconds with job counts.
        self.oldest_overdue = Gauge(
            "scheduler_queue_oldest_overdue_seconds",
            "How long the oldest due job has waited past its run_at (0 when none is due)",
            ["queue"],
            registry=r,
        )
        self.held = Gauge(
            "scheduler_queue_held_jobs",
            "Due jobs set aside by flow control, by reason (key_limit, rate_window, waiting); "
            "counted in scheduler_queue_jobs{state=due} too",
            ["queue", "reason"],
            registry=r,
        )
        self.paused = Gauge(
            "scheduler_queue_paused",
            "1 while the queue is paused (Queue.pause, scheduler pause): none of its jobs is "
            "claimed; a partitioned queue: while any partition is",
            ["queue"],
            registry=r,
        )
        self.redis_errors = Counter(
            "scheduler_redis_errors", "Redis calls that failed and were retried", registry=r
        )
        self.redis_backoffs = Counter(
            "scheduler_redis_backoffs",
            "Redis errors a worker loop backed off on and retried "
            "(loop: claim, heartbeat, presence, report, wake, release, queues; the last is the "
            "start's read of partitioned queues' records; error: the class, e.g. "
            "OutOfMemoryError for a full server)",
            ["loop", "error"],
            registry=r,
        )
        self.abandoned_threads = Gauge(
            "scheduler_abandoned_threads",
            "Handlers stopped (timeout, lease lost, cancel) but still running: sync threads, async"
            " tasks that ignored their cancel",
            registry=r,
        )
        self.claim_paused = Gauge(
            "scheduler_claim_paused",
            "1 while the worker does not claim, by reason",
            ["reason"],
            registry=r,
        )

    def per_task(self, queue: str, task: str) -> TaskStats:
        """The (queue, task) numbers, created on first use."""
        queue = self.logical.get(queue, queue)
        if self.tasks is not None and task not in self.tasks:
            task = UNKNOWN_TASK
        st = self._tasks.get((queue, task))
        if st is None:
            st = self._tasks[(queue, task)] = TaskStats()
        return st

    def outcome(self, queue: str, task: str, outcome: str, n: int = 1) -> None:
        if outcome == "done":
            self.per_task(queue, task).done += n
        elif outcome not in OUTCOMES:  # a word outside the vocabulary is a bug, not a new label
            raise ValueError(f"unknown outcome {outcome!r}: not one of {OUTCOMES}")
        else:
            if self.tasks is not None and task not in self.tasks:
                task = UNKNOWN_TASK
            key = (self.logical.get(queue, queue), task, outcome)
            self._outcomes[key] = self._outcomes.get(key, 0) + n

    def set_depth(self, queue: str, counts: QueueCounts) -> None:
        label = self.logical.get(queue, queue)
        if label != queue:  # a partition: the logical queue's depth sums its partitions
            self._depths[queue] = counts
            counts = merge_counts(
                [c for q, c in self._depths.items() if self.logical.get(q) == label]
            )
            queue = label
        for state, value in (
            ("due", counts.due),
            ("scheduled", counts.scheduled),
            ("leased", counts.leased),
            ("dead", counts.dead),
            ("lapsed", counts.lapsed),
            ("moving", counts.moving),  # a queue move's, in no other place (queue_move.py)
        ):
            self.depth.labels(queue, state).set(value)
        self.oldest_overdue.labels(queue).set(counts.oldest_overdue_ms / 1000)
        for reason, n in counts.held.items():
            self.held.labels(queue, reason).set(n)
        self.paused.labels(queue).set(1 if counts.paused else 0)

    def serve(self, port: int, addr: str = METRICS_ADDR) -> int:
        """Serve /metrics in a daemon thread; returns the bound port (0 picks a free one)."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_address[1])
