"""Review of metrics and log accuracy: a mixed workload (successes, retries, parks, timeouts,
RetryLater, cancels of pending and running jobs, a hand-edited payload, an unknown task, a
stale settle) run by an embedded worker and by a `--processes 2` pool; every counter,
histogram and gauge checked against what happened (the per-minute stats the scripts write,
the handlers' own side effects, the log's transition lines), the words against the glossary
and the metric names against the docs."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import Backoff, Queue, Registry, RetryLater
from scheduler.cli.main import main
from scheduler.core.connection import connect
from scheduler.core.vocabulary import OUTCOMES
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.metrics import UNKNOWN_TASK, WorkerMetrics
from scheduler.worker.registry import JobContext
from tests.conftest import delete_queue
from tests.embedded_worker import worker_thread
from tests.fixtures.pools import SUPERVISORS, kill_leftovers
from tests.redis_server import RedisProcess, require_server
from tests.test_worker_pool import spawn_pool, stop
from tests.test_worker_pool_metrics import answering, free_port, per_process, scrape
from tests.workers.procs import ROOT, wait_for

# -- helpers ------------------------------------------------------------------------------------


def counters(client: redis.Redis, q: Queue) -> dict[str, int]:
    """Every stats counter of the queue summed over its minute buckets (late_* left out)."""
    out: dict[str, int] = {}
    for key in client.scan_iter(match=f"{q.keys.prefix}stats:*", count=1000):
        for field, value in client.hgetall(key).items():
            if not str(field).startswith("late"):
                out[str(field)] = out.get(str(field), 0) + int(value)
    return {k: v for k, v in out.items() if v}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, job_id: str | None = None) -> list[str]:
        return [
            str(getattr(r, "event", ""))
            for r in self.records
            if hasattr(r, "event") and (job_id is None or getattr(r, "job_id", "") == job_id)
        ]


def captured(name: str) -> tuple[logging.Logger, Records]:
    log = logging.getLogger(f"scheduler.worker.review_metrics.{name}")
    log.setLevel(logging.INFO)
    log.propagate = False
    seen = Records()
    log.handlers[:] = [seen]
    return log, seen


def value(w: Worker, name: str, **labels: str) -> float:
    return w.metrics.registry.get_sample_value(name, labels) or 0.0


def by_outcome(w: Worker, q: Queue) -> dict[tuple[str, str], float]:
    """scheduler_jobs_total of queue q: (task, outcome) -> value, zeros left out."""
    out: dict[tuple[str, str], float] = {}
    for fam in w.metrics.registry.collect():
        for s in fam.samples:
            if s.name == "scheduler_jobs_total" and s.labels["queue"] == q.name and s.value:
                out[(s.labels["task"], s.labels["outcome"])] = s.value
    return out


def hist_total(w: Worker, q: Queue, family: str, part: str) -> float:
    total = 0.0
    for fam in w.metrics.registry.collect():
        for s in fam.samples:
            if s.name == f"{family}_{part}" and s.labels.get("queue") == q.name:
                total += s.value
    return total


def until(cond: Any, bound_s: float = 20.0) -> None:
    deadline = time.monotonic() + bound_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


# -- the embedded worker's mixed workload ----------------------------------------------------

tasks = Registry()
runs: dict[str, int] = {}
release_stuck = threading.Event()
FAST = Backoff(10, 1.0, 10, 0.0)


def ran(task: str) -> None:
    runs[task] = runs.get(task, 0) + 1


@tasks.task(name="ok")
async def ok_task(payload: Any, ctx: JobContext) -> Any:
    ran("ok")
    return payload


@tasks.task(name="flaky", backoff=FAST)
async def flaky_task(payload: Any, ctx: JobContext) -> int:
    ran("flaky")
    if ctx.attempt < 2:
        raise RuntimeError("first attempt fails")
    return 1


@tasks.task(name="bad", backoff=FAST)
def bad_task(payload: Any, ctx: JobContext) -> None:
    ran("bad")
    raise RuntimeError("always fails")


@tasks.task(name="later")
async def later_task(payload: Any, ctx: JobContext) -> int:
    ran("later")
    if ctx.attempt < 2:
        raise RetryLater(10, "busy")
    return 2


@tasks.task(name="stuck", timeout_s=0.2)
def stuck_task(payload: Any, ctx: JobContext) -> None:
    ran("stuck")
    release_stuck.wait(0.6)  # a sync handler runs on past its timeout (abandoned thread)


@tasks.task(name="astuck", timeout_s=0.2)
async def astuck_task(payload: Any, ctx: JobContext) -> None:
    ran("astuck")
    await asyncio.sleep(30)


@tasks.task(name="slow")
async def slow_task(payload: Any, ctx: JobContext) -> None:
    ran("slow")
    await asyncio.sleep(30)


def test_a_mixed_workload_is_counted_once_under_the_glossary_words(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    runs.clear()
    release_stuck.clear()
    log, seen = captured(q.name)
    for i in range(4):
        q.enqueue("ok", {"i": i})
    edited = q.enqueue("ok", {"i": 99})  # its stored payload edited by hand: not JSON
    head = str(client.get(q.keys.spec(edited))).rsplit("|", 1)[0]
    client.set(q.keys.spec(edited), head + "|{not json")
    q.enqueue("flaky", {}, max_attempts=3)
    q.enqueue("bad", {}, max_attempts=2)
    q.enqueue("later", {}, max_attempts=3)
    q.enqueue("stuck", {}, max_attempts=1)
    q.enqueue("astuck", {}, max_attempts=1)
    q.enqueue("nope", {}, max_attempts=1)  # no handler in this worker
    pending = q.enqueue("ok", {}, delay_ms=600_000)
    assert q.cancel(pending) == "scheduled"
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=5000, concurrency=4)
    with worker_thread(redis_url, tasks, settings, logger=log) as w:
        running = q.enqueue("slow", {})
        until(lambda: q.status(running) == "leased")
        assert q.cancel(running) == "leased"

        def idle() -> bool:
            c = q.counts()
            return (
                c.due == c.leased == c.scheduled == 0
                and value(w, "scheduler_jobs_total", queue=q.name, task="slow", outcome="cancelled")
                == 1
                and value(w, "scheduler_abandoned_threads") == 0
                and value(w, "scheduler_queue_jobs", queue=q.name, state="dead") == 5
                # The gauges are read at each heartbeat: one read since the queue went idle.
                and sum(
                    value(w, "scheduler_queue_jobs", queue=q.name, state=s)
                    for s in ("due", "scheduled", "leased")
                )
                == 0
            )

        until(idle)
        got = by_outcome(w, q)
        stats = counters(client, q)
        lateness_n = hist_total(w, q, "scheduler_job_lateness_seconds", "count")
        duration_n = hist_total(w, q, "scheduler_job_duration_seconds", "count")
        gauges = {
            "in_flight": value(w, "scheduler_jobs_in_flight"),
            "abandoned": value(w, "scheduler_abandoned_threads"),
            **{
                s: value(w, "scheduler_queue_jobs", queue=q.name, state=s)
                for s in ("due", "scheduled", "leased", "lapsed", "moving", "dead")
            },
            "overdue": value(w, "scheduler_queue_oldest_overdue_seconds", queue=q.name),
            "paused": value(w, "scheduler_queue_paused", queue=q.name),
        }
        stuck_s = value(w, "scheduler_job_duration_seconds_sum", queue=q.name, task="stuck")
    assert got == {
        ("ok", "done"): 4,
        ("ok", "dead"): 1,  # the hand-edited payload: InvalidPayload, parked
        ("flaky", "retry"): 1,
        ("flaky", "done"): 1,
        ("bad", "retry"): 1,
        ("bad", "dead"): 1,
        ("later", "retry"): 1,
        ("later", "done"): 1,
        ("stuck", "timeout"): 1,
        ("stuck", "dead"): 1,
        ("astuck", "timeout"): 1,
        ("astuck", "dead"): 1,
        (UNKNOWN_TASK, "dead"): 1,
        ("slow", "cancelled"): 1,
    }
    # The stats the scripts wrote: the same events; `cancel` also counts the pending one.
    assert stats == {"claim": 15, "done": 6, "fail": 8, "retry": 3, "dead": 5, "cancel": 2}
    for word in ("done", "retry", "dead"):
        assert sum(v for (_, o), v in got.items() if o == word) == stats[word]
    # Every claim once in the lateness histogram; every handler that started once in the
    # run-time histogram (the handlers' own count: not the unknown task, not the bad payload).
    assert lateness_n == stats["claim"]
    assert duration_n == sum(runs.values()) == stats["claim"] - 2
    # Units: a run stopped at its 0.2 s timeout is 0.2 (seconds), not 200.
    assert 0.15 < stuck_s < 5
    # Idle: the gauges say so.
    assert gauges == {
        "in_flight": 0,
        "abandoned": 0,
        "due": 0,
        "scheduled": 0,
        "leased": 0,
        "lapsed": 0,
        "moving": 0,
        "dead": 5,
        "overdue": 0,
        "paused": 0,
    }
    # The log: one transition line per counted outcome, under the same word.
    events = seen.events()
    assert set(events) <= {"claimed", *OUTCOMES}
    assert events.count("claimed") == stats["claim"]
    for word in OUTCOMES:
        assert events.count(word) == sum(v for (_, o), v in got.items() if o == word), word


hog_tasks = Registry()
hog_runs: list[str] = []


@hog_tasks.task(name="hog")
async def hog_task(payload: Any, ctx: JobContext) -> str:
    """The first run blocks its worker's loop (no heartbeat) until another worker has run the
    job to done: its lease lapses there and its own complete comes back stale."""
    hog_runs.append(ctx.token)
    if len(hog_runs) == 1:
        c = connect(payload["url"])
        q = Queue(c, ctx.queue)
        deadline = time.monotonic() + 20
        while q.status(ctx.job_id) != "done" and time.monotonic() < deadline:
            time.sleep(0.02)
        c.close()
    return "x"


def test_a_stale_settle_is_one_stale_on_the_late_worker_and_one_done_on_the_other(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    hog_runs.clear()
    log_a, seen_a = captured(q.name + ".a")
    log_b, seen_b = captured(q.name + ".b")
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=1000)
    with worker_thread(redis_url, hog_tasks, settings, logger=log_a) as a:
        job = q.enqueue("hog", {"url": redis_url})
        until(lambda: len(hog_runs) == 1)
        with worker_thread(redis_url, hog_tasks, settings, logger=log_b) as b:
            until(lambda: q.status(job) == "done")
            until(
                lambda: (
                    value(a, "scheduler_jobs_total", queue=q.name, task="hog", outcome="stale") == 1
                )
            )
    assert len(hog_runs) == 2 and hog_runs[0] != hog_runs[1]
    assert by_outcome(a, q) == {("hog", "stale"): 1}
    assert by_outcome(b, q) == {("hog", "done"): 1}
    # A held the job past its 1 s lease: its run time says so, in seconds.
    assert value(a, "scheduler_job_duration_seconds_sum", queue=q.name, task="hog") > 1.0
    assert counters(client, q) == {"claim": 2, "expired": 1, "done": 1}
    assert seen_a.events(job) == ["claimed", "stale"]
    assert seen_b.events(job) == ["claimed", "done"]
    (line,) = [r for r in seen_a.records if getattr(r, "event", "") == "stale"]
    assert getattr(line, "refused", "") == "complete"


# -- findings: the embedded worker ---------------------------------------------------------


def test_an_unknown_tasks_job_cancelled_while_its_fail_is_pending_counts_one_cancel(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    """The report of the unknown task's fail fails for a while (a transient error on the
    report path; the heartbeats go through). The job is cancelled meanwhile: the heartbeat
    sees `cancelled` and the fail, once sent, is refused `cancelled`. One cancel, one
    outcome: a registered task's failed run in the same position counts `cancelled` once
    (its run is finished, heartbeat.py _lost only forgets it). The unknown task's run
    (dispatch.py _prepare: _queue_fail without r.finished) counted it twice, logged two
    `cancelled` lines and would call the outcome hooks twice."""
    outage = threading.Event()
    outage.set()

    def flaky_reports(w: Worker) -> None:
        send = w._send_reports

        async def guarded() -> None:
            if outage.is_set():
                raise redis.ConnectionError("report path down")
            await send()

        w._send_reports = guarded  # type: ignore[method-assign]

    log, seen = captured(q.name)
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=5000)
    with worker_thread(redis_url, tasks, settings, logger=log, setup=flaky_reports) as w:
        job = q.enqueue("nope", {}, max_attempts=1)
        until(lambda: "claimed" in seen.events(job))
        assert q.cancel(job) == "leased"
        until(lambda: "cancelled" in seen.events(job))
        outage.clear()
        # The fail sent and its answer read (the reporter's backoff is at most 1 s).
        until(lambda: not w._fails and not any(w._sending), bound_s=5)
        cancelled = value(
            w, "scheduler_jobs_total", queue=q.name, task=UNKNOWN_TASK, outcome="cancelled"
        )
    assert counters(client, q) == {"claim": 1, "cancel": 1}
    assert seen.events(job) == ["claimed", "cancelled"]
    assert cancelled == 1


def _documented_loops() -> set[str]:
    (help_text,) = [
        f.documentation
        for f in WorkerMetrics().registry.collect()
        if f.name == "scheduler_redis_backoffs"
    ]
    m = re.search(r"loop: ([a-z, ]+);", help_text)
    assert m, help_text
    return {w.strip() for w in m.group(1).split(",")}


def test_a_worker_started_before_its_redis_counts_backoffs_under_a_documented_loop() -> None:
    """Every embedded worker reads its queues' partitions records first (partitioned_start.py)
    and retries that read while Redis does not answer (a container started before its Redis):
    counted as loop="queues". The metric's help and the README list the loops as claim,
    heartbeat, presence, report, wake, release: a dashboard or alert built on those words
    misses this one."""
    server = RedisProcess(require_server("a server started late"))
    try:
        settings = WorkerSettings(queues=("late-start",), heartbeat_ms=100)
        with worker_thread(server.url, Registry(), settings) as w:
            until(lambda: value(w, "scheduler_redis_errors_total") >= 1, bound_s=5)
            server.start()
            until(lambda: w.names_read, bound_s=5)
            loops = {
                s.labels["loop"]
                for fam in w.metrics.registry.collect()
                for s in fam.samples
                if s.name == "scheduler_redis_backoffs_total"
            }
    finally:
        server.cleanup()
    assert loops, "no backoff counted"
    assert loops <= _documented_loops(), (loops, _documented_loops())


def _docs_text() -> str:
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(parts)


def test_every_metric_name_the_docs_give_is_exported() -> None:
    names = {fam.name for fam in WorkerMetrics().registry.collect()}
    names |= {"scheduler_pool_process_up", "scheduler_pool_process_retired"}
    named = set(re.findall(r"\bscheduler_[a-z_]+", _docs_text()))
    assert named, "no metric named in the docs"
    for n in named:
        assert n in names or n.removesuffix("_total") in names, n


def test_every_metric_the_worker_exports_is_named_in_the_docs() -> None:
    """The README names most families (`scheduler_jobs_total`, `scheduler_queue_jobs`, ...)
    so alerts can be written from it, but describes four only as "lateness and run-duration
    histograms, an in-flight gauge" (and the Redis error counter not at all): an operator
    must scrape a worker to learn what to query."""
    text = _docs_text()
    missing = []
    for fam in WorkerMetrics().registry.collect():
        shown = fam.name + "_total" if fam.type == "counter" else fam.name
        if fam.name not in text and shown not in text:
            missing.append(shown)
    assert missing == []


# -- the pool ----------------------------------------------------------------------------------


class Pool:
    """One `scheduler worker --processes 2 --metrics-port P` on its own queue, shared by the
    pool tests below in their order (a pool's start is most of such a test's time)."""

    def __init__(self, url: str, log: Path) -> None:
        self.client = connect(url)
        self.q = Queue(self.client, "mx-pool-" + uuid.uuid4().hex[:8])
        self.url, self.log, self.port = url, log, free_port()
        self.proc = spawn_pool(url, self.q.name, "--processes", "2", "--worker-id", "mxp",
                               "--heartbeat-ms", "100", "--metrics-port", str(self.port),
                               log=log)  # fmt: skip

    def per_process(self, family: str, sample: str, **labels: str) -> dict[str, float]:
        return per_process(scrape(self.port), family, sample, **labels)

    def done(self) -> dict[str, float]:
        return self.per_process(
            "scheduler_jobs", "scheduler_jobs_total", queue=self.q.name, outcome="done"
        )


@pytest.fixture(scope="module")
def pool(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    log = tmp_path_factory.mktemp("pool") / "pool.log"
    p = Pool(redis_url, log)
    try:
        wait_for(lambda: answering(p.port) == {"0", "1"}, what="both processes ready")
        yield p
    finally:
        try:
            stop(p.proc, log)
        finally:
            kill_leftovers(log, SUPERVISORS)
            delete_queue(p.client, p.q)
            p.client.close()


def test_a_pools_mixed_workload_sums_to_the_stats_over_its_processes(pool: Pool) -> None:
    """One scrape of the pool's endpoint, summed over the `process` label, equals what the
    scripts counted, each outcome once, and every handler run (the ledger) is once in the
    run-time histogram. (A recycled process's hand-over: tests/test_pool_metrics_handoff.py.)"""
    q, client = pool.q, pool.client
    ids = [q.enqueue("echo", i) for i in range(6)]
    ids += [q.enqueue("boom", {}, max_attempts=2) for _ in range(2)]
    ids += [q.enqueue("boom", {"fatal": True}, max_attempts=3)]
    ids += [q.enqueue("sleep", {"s": 30}, timeout_ms=200, max_attempts=1)]
    ids += [q.enqueue("nope", {}, max_attempts=1)]
    wait_for(lambda: all(q.status(i) in ("done", "dead") for i in ids), timeout_s=60,
             what="every job settled")  # fmt: skip
    stats = counters(client, q)
    seen: dict[str, Any] = {}

    def agrees() -> bool:
        fams = scrape(pool.port)
        seen["jobs"] = {
            o: sum(
                per_process(
                    fams, "scheduler_jobs", "scheduler_jobs_total", queue=q.name, outcome=o
                ).values()
            )
            for o in OUTCOMES
        }
        late = "scheduler_job_lateness_seconds"
        run = "scheduler_job_duration_seconds"
        seen["late"] = sum(per_process(fams, late, late + "_count").values())
        seen["run"] = sum(per_process(fams, run, run + "_count").values())
        seen["flight"] = per_process(fams, "scheduler_jobs_in_flight", "scheduler_jobs_in_flight")
        return seen["late"] == stats["claim"] and all(
            seen["jobs"][o] == stats.get(o, 0) for o in ("done", "retry", "dead")
        )

    wait_for(agrees, timeout_s=30, what=f"the scrape to agree with {stats}")
    assert stats == {"claim": 13, "done": 6, "fail": 7, "retry": 2, "dead": 5}, stats
    assert {o: n for o, n in seen["jobs"].items() if n} == {
        "done": 6,
        "retry": 2,
        "dead": 5,
        "timeout": 1,
    }, seen
    ledger = [str(e).split("|")[3] for e in client.lrange(f"test:ledger:{q.name}", 0, -1)]
    assert seen["run"] == ledger.count("start") == stats["claim"] - 1  # not the unknown task
    assert seen["flight"] == {"0": 0.0, "1": 0.0}


def test_a_slot_an_operator_stopped_keeps_its_counts_in_the_scrape(pool: Pool) -> None:
    """README: a process that stops cleanly hands its last counts to the supervisor, "the
    slot's series keep growing, nothing counted since the last scrape is lost". A slot stopped
    by `scheduler workers stop` is read (worker_pool_metrics.reaped adds its counts to the
    carry) but never served again (relabel_merge applies a carry only to a slot it fetched):
    its jobs leave the pool's totals, and what it counted since the last scrape is lost."""
    q = pool.q
    ids = [q.enqueue("sync_sleep", {"s": 0.05}) for _ in range(4)]
    wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=60, what="all done")
    want = counters(pool.client, q)["done"]  # every job done on the pool's queue so far
    wait_for(lambda: sum(pool.done().values()) == want, what=f"{want} done counted")
    before = pool.done()
    slot = next(p for p, n in sorted(before.items()) if n > 0)
    out = CliRunner().invoke(
        main, ["workers", "stop", f"mxp.{int(slot) + 1}", "-q", q.name, "--url", pool.url]
    )
    assert out.exit_code == 0, out.output
    retired = ("scheduler_pool_process_retired", "scheduler_pool_process_retired")
    wait_for(lambda: pool.per_process(*retired) == {slot: 1.0}, what="the slot retired")
    after = pool.done()
    assert after == before, (before, after)
