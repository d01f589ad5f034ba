"""A pool child that exits cleanly (--max-jobs, --max-memory-mb) hands its last counts to the
supervisor, which carries them on in its slot's counters (scheduler/cli/worker_pool_metrics.py):
the slot's `process` series keep growing across the recycling instead of falling back to 0."""

from __future__ import annotations

from pathlib import Path

import redis

from scheduler import Queue
from scheduler.cli.worker_pool_metrics import Carry, relabel_merge
from tests.test_worker_pool import spawn_pool, stop
from tests.test_worker_pool_metrics import free_port, linux_only, per_process, scrape
from tests.workers.procs import wait_for


@linux_only
def test_a_recycled_childs_counts_are_not_lost(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    """--max-jobs 1: each child runs one job and exits 0; the pool starts another in its slot.
    Before: a child's counts went with it (the new one starts at 0), so after 6 jobs a scrape
    counted none of them done (or one per slot not yet recycled). Now every job is counted,
    once, in its slot, and the series never go down from one scrape to the next."""
    port = free_port()
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--max-jobs", "1",
                      "--metrics-port", str(port), log=pool_log)  # fmt: skip
    try:
        ids = [q.enqueue("echo", i) for i in range(6)]
        wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=90, what="all done")
        seen: list[dict[str, float]] = []

        def counted() -> bool:
            seen.append(per_process(scrape(port), "scheduler_jobs", "scheduler_jobs_total",
                                    queue=q.name, outcome="done"))  # fmt: skip
            return sum(seen[-1].values()) >= 6

        wait_for(counted, what="6 done counted over the slots", timeout_s=30)
    finally:
        stop(pool, pool_log)
    assert sum(seen[-1].values()) == 6, seen
    # A counter never goes down from the last scrape that had it. A slot with no ready child
    # (between a recycled child and the next) is missing from a scrape, by design (its
    # scheduler_pool_process_up is 0): a missing series is no reset, so it is not read as 0.
    last: dict[str, float] = {}
    for scrape_ in seen:
        for slot, value in scrape_.items():
            assert value >= last.get(slot, 0.0), seen
            last[slot] = value


def test_carry_adds_counters_and_histograms_but_not_gauges() -> None:
    final = """# HELP jobs_total Jobs.
# TYPE jobs_total counter
jobs_total{outcome="done"} 3.0
jobs_total{outcome="dead"} 1.0
# HELP in_flight Running now.
# TYPE in_flight gauge
in_flight 2.0
# HELP run_seconds Run time.
# TYPE run_seconds histogram
run_seconds_bucket{le="+Inf"} 4.0
run_seconds_count 4.0
run_seconds_sum 1.5
"""
    now = """# HELP jobs_total Jobs.
# TYPE jobs_total counter
jobs_total{outcome="done"} 2.0
# HELP in_flight Running now.
# TYPE in_flight gauge
in_flight 1.0
# HELP run_seconds Run time.
# TYPE run_seconds histogram
run_seconds_bucket{le="+Inf"} 2.0
run_seconds_count 2.0
run_seconds_sum 0.5
"""
    carry = Carry()
    carry.add(0, final)
    carry.add(0, final)  # two recycled children of slot 0
    fams = {f.name: f for f in relabel_merge({0: now, 1: now}, carry)}
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in fams.values() for s in f.samples}  # fmt: skip
    p0, p1 = ("process", "0"), ("process", "1")
    assert values[("jobs_total", (("outcome", "done"), p0))] == 8.0
    assert values[("jobs_total", (("outcome", "dead"), p0))] == 2.0  # the new child has none yet
    assert values[("jobs_total", (("outcome", "done"), p1))] == 2.0  # no carry of its own
    assert values[("in_flight", (p0,))] == 1.0
    assert values[("run_seconds_count", (p0,))] == 10.0
    assert values[("run_seconds_sum", (p0,))] == 3.5
    carry.forget(0)  # a crash: the slot's series start again, as Prometheus expects of a reset
    fams = {f.name: f for f in relabel_merge({0: now}, carry)}
    assert [s.value for s in fams["jobs"].samples] == [2.0]
