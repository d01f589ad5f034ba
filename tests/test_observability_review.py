"""Observability review: each transition counted once in the per-minute stats (lua bump_stat),
re-sent and refused calls counting nothing, the counters against what is in Redis, and the
worker's metrics and log events under the glossary's words (docs/glossary.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import Backoff, JobNotFound, Queue, Registry
from scheduler.admin.doctor import repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.core.vocabulary import OUTCOMES, STAT_FIELDS
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.metrics import UNKNOWN_TASK, WorkerMetrics
from scheduler.worker.outcomes import JobOutcome
from scheduler.worker.registry import JobContext
from tests.conftest import Clock
from tests.embedded_worker import worker_thread

MIN_MS = 60_000


def counters(client: redis.Redis, q: Queue) -> dict[str, int]:
    """Every stats counter of the queue summed over all its minute buckets (late_* left out)."""
    out: dict[str, int] = {}
    for key in client.scan_iter(match=f"{q.keys.prefix}stats:*", count=1000):
        for field, value in client.hgetall(key).items():
            name = str(field)
            if not name.startswith("late"):
                out[name] = out.get(name, 0) + int(value)
    return {k: v for k, v in out.items() if v}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    keys = set(before) | set(after)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    return {k: v for k, v in d.items() if v}


# --- complete / fail / release: a re-sent call counts nothing more -------------------------


def test_a_re_sent_complete_counts_done_once(q: Queue, client: redis.Redis) -> None:
    a = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    assert counters(client, q) == {"claim": 1}
    q.complete(a, job.token, "r")
    q.complete(a, job.token, "r")  # the reply lost, the call sent again
    assert q.complete_many([(a, job.token, "r"), (a, job.token, "r")]) == ["done", "done"]
    assert counters(client, q) == {"claim": 1, "done": 1}


@pytest.mark.parametrize(("max_attempts", "word"), [(3, "retry"), (1, "dead")])
def test_a_re_sent_fail_counts_its_fail_and_outcome_once(
    q: Queue, client: redis.Redis, max_attempts: int, word: str
) -> None:
    a = q.enqueue("t", 1, max_attempts=max_attempts)
    (job,) = q.claim("w", limit=1).jobs
    for _ in range(2):  # the reply lost, the call sent again
        assert q.fail(a, job.token, ("E", "m", ""), delay_ms=60_000).status == word
    assert counters(client, q) == {"claim": 1, "fail": 1, word: 1}


def test_a_re_sent_release_counts_one_release(q: Queue, client: redis.Redis) -> None:
    a = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    assert q.release([(a, job.token), (a, job.token)]) == ["released", "released"]
    assert q.release([(a, job.token)]) == ["released"]
    assert counters(client, q) == {"claim": 1, "release": 1}
    assert q.counts().due == 1


def test_a_complete_after_cancel_counts_no_done(q: Queue, client: redis.Redis) -> None:
    a = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    assert q.cancel(a) == "leased"
    assert q.complete_many([(a, job.token, "r")]) == ["cancelled"]
    assert counters(client, q) == {"claim": 1, "cancel": 1}


# --- cancel, requeue, purge ----------------------------------------------------------------


def test_cancel_counts_only_a_job_it_cancelled(q: Queue, client: redis.Redis) -> None:
    a = q.enqueue("t", 1, delay_ms=600_000)
    b = q.enqueue("t", 2, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.complete(b, job.token, None)
    before = counters(client, q)
    assert q.cancel(a) == "scheduled"
    assert [q.cancel(a), q.cancel(b)] == ["cancelled", "done"]
    with pytest.raises(JobNotFound):
        q.cancel("nosuchjob")
    assert delta(before, counters(client, q)) == {"cancel": 1}


def test_requeue_dead_counts_the_jobs_it_moved(q: Queue, client: redis.Redis) -> None:
    ids = [q.enqueue("t", i, max_attempts=1) for i in range(3)]
    for job in q.claim("w", limit=3).jobs:
        q.fail(job.id, job.token, ("E", "m", ""))
    before = counters(client, q)
    assert q.requeue_dead([ids[0], ids[0], ids[1], "nosuchjob"]) == 2
    assert q.requeue_dead([ids[0]]) == 0  # re-sent: no longer dead
    assert delta(before, counters(client, q)) == {"requeue_dead": 2}
    assert q.counts().dead == 1 and q.counts().due == 2


def test_purge_writes_no_counter(q: Queue, client: redis.Redis) -> None:
    """No stats counter names a purge (STAT_FIELDS, glossary): purging changes no counter, and
    in particular takes nothing off `dead` (new dead letters), which counts what died."""
    a = q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(a, job.token, ("E", "m", ""))
    before = counters(client, q)
    assert q.purge_dead([a, a]) == 1
    assert counters(client, q) == before
    assert "purge" not in STAT_FIELDS


# --- claim, the reaper, start deadlines ----------------------------------------------------


def test_claim_counts_the_jobs_it_leased_once(q: Queue, client: redis.Redis) -> None:
    for i in range(5):
        q.enqueue("t", i)
    got = q.claim("w", limit=3).jobs
    got += q.claim("w", limit=10).jobs
    assert len(got) == 5
    assert q.claim("w", limit=10).jobs == []
    assert counters(client, q) == {"claim": 5}


def test_a_lapse_reaped_back_to_due_is_one_expired_and_no_retry(
    q: Queue, client: redis.Redis
) -> None:
    a = q.enqueue("t", 1, max_attempts=3)
    (job,) = q.claim("w", limit=1).jobs
    client.zadd(q.keys.leased, {a: server_now_ms(client) - 1_000})
    before = counters(client, q)
    assert q.claim("w2", limit=0).jobs == []
    q.claim("w2", limit=0)  # a second call finds nothing more to reap
    assert delta(before, counters(client, q)) == {"expired": 1}
    (again,) = q.claim("w2", limit=1).jobs
    assert again.id == a
    # the old worker's complete is refused: no done
    assert q.complete_many([(a, job.token, "x")]) != ["done"]
    assert delta(before, counters(client, q)) == {"expired": 1, "claim": 1}


def test_a_start_deadline_park_at_claim_is_one_dead_and_no_claim(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(MIN_MS)
    a = q.enqueue("t", 1, start_within_ms=1_000)
    b = q.enqueue("t", 2, max_attempts=3)
    clock.set_ms(MIN_MS + 5_000)  # a's window is gone
    assert [j.id for j in q.claim("w", limit=5).jobs] == [b]
    assert q.counts().dead == 1 and q.get_job(a).state == "dead"
    assert counters(client, q) == {"claim": 1, "dead": 1}


def test_a_retry_past_the_start_deadline_is_one_fail_and_one_dead(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(MIN_MS)
    a = q.enqueue("t", 1, start_within_ms=10_000, max_attempts=5)
    (job,) = q.claim("w", limit=1).jobs
    out = q.fail(a, job.token, ("E", "m", ""), delay_ms=60_000)
    assert out.status == "dead"
    assert counters(client, q) == {"claim": 1, "fail": 1, "dead": 1}


# --- a worker's metrics and log lines against the stats of the same run --------------------

review_tasks = Registry()


@review_tasks.task(name="ok")
def ok_task(payload: Any, ctx: JobContext) -> Any:
    return payload


@review_tasks.task(name="bad", backoff=Backoff(1, 1.0, 1, 0.0))
def bad_task(payload: Any, ctx: JobContext) -> None:
    raise RuntimeError("no")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def captured(q: Queue) -> tuple[logging.Logger, Records]:
    """A worker logger of this test's own, at INFO, keeping its records."""
    log = logging.getLogger(f"scheduler.worker.review.{q.name}")
    log.setLevel(logging.INFO)
    log.propagate = False
    seen = Records()
    log.addHandler(seen)
    return log, seen


def jobs_total(w: Worker, q: Queue, task: str, outcome: str) -> float:
    labels = {"queue": q.name, "task": task, "outcome": outcome}
    return w.metrics.registry.get_sample_value("scheduler_jobs_total", labels) or 0.0


def test_a_workers_metrics_and_log_events_agree_with_the_stats(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    log, seen = captured(q)
    ok = [q.enqueue("ok", {"i": i}) for i in range(6)]
    bad = [q.enqueue("bad", {}, max_attempts=2) for _ in range(2)]
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=5000)
    with worker_thread(redis_url, review_tasks, settings, logger=log) as w:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            c = q.counts()
            if c.dead == 2 and c.due == c.leased == 0:
                break
            time.sleep(0.02)
        m = w.metrics.registry
        stats = counters(client, q)
        assert all(q.status(i) == "done" for i in ok)
        assert stats == {"claim": 10, "done": 6, "fail": 4, "retry": 2, "dead": 2}
        assert jobs_total(w, q, "ok", "done") == stats["done"]
        assert jobs_total(w, q, "bad", "retry") == stats["retry"]
        assert jobs_total(w, q, "bad", "dead") == stats["dead"]
        lateness = sum(
            m.get_sample_value("scheduler_job_lateness_seconds_count", {"queue": q.name, "task": t})
            or 0.0
            for t in ("ok", "bad")
        )
        assert lateness == stats["claim"]
    events = [str(getattr(r, "event", "")) for r in seen.records if hasattr(r, "event")]
    assert set(events) <= {"claimed", *OUTCOMES}
    assert events.count("claimed") == stats["claim"]
    assert events.count("done") == stats["done"]
    assert events.count("retry") == stats["retry"] and events.count("dead") == stats["dead"]
    # WARNING and above: nothing about a job that ran to done (issue 16's happy path)
    loud = [r for r in seen.records if r.levelno >= logging.WARNING]
    assert {getattr(r, "job_id", None) for r in loud} <= set(bad)


def test_a_child_enqueued_after_a_cancelled_parent_is_one_new_dead(
    q: Queue, client: redis.Redis
) -> None:
    parent = q.enqueue("t", 1, delay_ms=600_000)
    assert q.cancel(parent) == "scheduled"
    before = counters(client, q)
    q.enqueue("t", 2, after=[parent])
    assert q.counts().dead == 1
    assert delta(before, counters(client, q)) == {"dead": 1}


def test_a_lapse_the_reaper_parks_counts_the_job_and_its_children_dead_once(
    q: Queue, client: redis.Redis
) -> None:
    a = q.enqueue("t", 1, max_attempts=1)
    for i in range(2):
        q.enqueue("t", i, after=[a])
    assert [j.id for j in q.claim("w", limit=5).jobs] == [a]
    client.zadd(q.keys.leased, {a: server_now_ms(client) - 1_000})
    before = counters(client, q)
    q.claim("w2", limit=0)
    q.claim("w2", limit=0)
    assert q.counts().dead == 3
    assert delta(before, counters(client, q)) == {"expired": 1, "dead": 3}


def test_worker_metric_labels_are_bounded_and_units_named() -> None:
    """No label that grows with jobs (a job id, an error message); times in seconds."""
    m = WorkerMetrics()
    m.tasks = review_tasks
    for word in OUTCOMES:
        m.outcome("q", "ok", word)
    m.outcome("q", "no-such-task-1", "dead")
    m.outcome("q", "no-such-task-2", "dead")
    m.per_task("q", "ok").lateness.observe(0.5)
    m.redis_backoffs.labels("claim", "ConnectionError").inc()
    labels: set[str] = set()
    tasks: set[str] = set()
    for fam in m.registry.collect():
        for s in fam.samples:
            labels |= set(s.labels)
            if "task" in s.labels:
                tasks.add(s.labels["task"])
        if fam.type in ("histogram", "summary"):
            assert fam.name.endswith("_seconds"), fam.name
        assert not fam.name.endswith("_ms"), fam.name
    assert labels <= {"queue", "task", "outcome", "state", "reason", "loop", "error", "le"}
    assert tasks == {"ok", UNKNOWN_TASK}


def worker_log_events() -> set[str]:
    """The `event` words the worker's code passes to its transition log lines."""
    root = Path(__file__).resolve().parent.parent / "scheduler" / "worker"
    found: set[str] = set()
    for path in root.glob("*.py"):
        text = path.read_text()
        found |= set(re.findall(r"_log_job\(\s*\"([a-z_]+)\"", text))
    # _stop logs its reason as the event for these three (dispatch.py), not for `shutdown`
    found |= {"expired", "cancelled", "timeout"}
    return found


def test_every_log_event_of_a_transition_is_a_glossary_word() -> None:
    """The glossary: one word per concept in Lua, Python, job states, log events and metrics.
    The claim's log line is `event=claimed`, a word the glossary does not have (its transition
    word is `claim`, the stats counter `claim`, the job's state `leased`)."""
    glossary = (Path(__file__).resolve().parent.parent / "docs" / "glossary.md").read_text()
    words = set(re.findall(r"^\| `?([a-z_]+)`? \|", glossary, flags=re.M))
    events = worker_log_events()
    assert {"done", "released", "claimed"} <= events  # the scan found the call sites
    assert sorted(events - words) == []


# --- schedules: a pending run parked (claim, doctor) is one dead and one re-arm -------------


def _pending(client: redis.Redis, q: Queue, name: str) -> str:
    return str(client.hget(q.keys.schedule(name), "pending"))


def test_a_schedule_run_parked_at_its_start_deadline_is_one_dead_and_one_rearm(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(1_000 * MIN_MS + 1)
    q.schedule("s", "t", every_ms=10 * MIN_MS, start_within_ms=1_000)
    first = _pending(client, q, "s")
    at = int(str(client.hget(q.keys.job(first), "run_at_ms")))
    clock.set_ms(at + 5_000)  # past its start window, before the next slot
    assert q.claim("w", limit=5).jobs == []
    assert q.get_job(first).state == "dead"
    assert _pending(client, q, "s") not in ("", first)
    assert counters(client, q) == {"dead": 1, "rearm": 1}


def _unrunnable_schedule_run(tq: tuple[Queue, Clock], client: redis.Redis) -> str:
    q, clock = tq
    clock.set_ms(1_000 * MIN_MS + 1)
    q.schedule("s", "t", every_ms=10 * MIN_MS)
    first = _pending(client, q, "s")
    at = int(str(client.hget(q.keys.job(first), "run_at_ms")))
    clock.set_ms(at + 1_000)
    client.hdel(q.keys.job(first), "task")  # no worker can run it: claim and doctor park it
    return first


def test_claims_park_of_an_unrunnable_schedule_run_is_one_dead_and_one_rearm(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, _ = tq
    first = _unrunnable_schedule_run(tq, client)
    assert q.claim("w", limit=5).jobs == []
    assert client.hget(q.keys.job(first), "state") == "dead"
    assert counters(client, q) == {"dead": 1, "rearm": 1}


def test_doctors_park_of_an_unrunnable_schedule_run_counts_as_claims_park(
    q: Queue, client: redis.Redis
) -> None:
    """docs: `doctor --fix` is counted as the transition it stands in for (claim's park of
    the same run, above: one dead, one re-arm). Real clock: doctor's scripts read TIME."""
    q.schedule("s", "t", every_ms=10 * MIN_MS)
    first = _pending(client, q, "s")
    client.hdel(q.keys.job(first), "task")
    fixed = repair_queue(client, q.name).fixed
    assert first in {i.job_id for i in fixed}
    assert client.hget(q.keys.job(first), "state") == "dead"
    assert _pending(client, q, "s") not in ("", first)
    assert counters(client, q) == {"dead": 1, "rearm": 1}


@review_tasks.task(name="slow")
async def slow_task(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(600)


def test_a_workers_release_at_its_stop_agrees_with_the_stats(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    log, seen = captured(q)
    ids = [q.enqueue("slow", {"i": i}) for i in range(4)]
    settings = WorkerSettings(queues=(q.name,), concurrency=2, heartbeat_ms=100, grace_s=0)
    with worker_thread(redis_url, review_tasks, settings, logger=log) as w:
        deadline = time.monotonic() + 30
        while q.counts().leased < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # let it claim what it would (not a verdict: the counts say)
    assert q.counts().leased == 0 and q.counts().due == len(ids)
    stats = counters(client, q)
    released = jobs_total(w, q, "slow", "released")
    events = [str(getattr(r, "event", "")) for r in seen.records if hasattr(r, "event")]
    assert stats.get("release", 0) == stats.get("claim", 0) >= 2
    assert released == stats["release"]
    assert events.count("released") == stats["release"]
    assert events.count("claimed") == stats["claim"]


@review_tasks.task(name="stuck", timeout_s=0.2)
async def stuck_task(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(600)


def test_a_timeout_and_a_cancel_while_running_agree_with_the_stats(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    """Metrics: `timeout` then that attempt's `dead`; `cancelled` for the running job the
    heartbeat finds cancelled. Stats: fail + dead, and one cancel; no done anywhere."""
    timed = q.enqueue("stuck", {}, max_attempts=1)
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100)
    with worker_thread(redis_url, review_tasks, settings) as w:
        running = q.enqueue("slow", {})
        deadline = time.monotonic() + 30
        while q.status(running) != "leased" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert q.cancel(running) == "leased"

        # The metric, not only the state: the worker counts `dead` once fail's reply is read,
        # after Redis stored it (a reader may see the state first).
        while time.monotonic() < deadline and not (
            jobs_total(w, q, "slow", "cancelled") and jobs_total(w, q, "stuck", "dead")
        ):
            time.sleep(0.02)
        assert q.status(timed) == "dead"
        got = {(t, o): jobs_total(w, q, t, o) for t in ("slow", "stuck") for o in OUTCOMES}
    assert {k: v for k, v in got.items() if v} == {
        ("stuck", "timeout"): 1,
        ("stuck", "dead"): 1,
        ("slow", "cancelled"): 1,
    }
    assert counters(client, q) == {"claim": 2, "fail": 1, "dead": 1, "cancel": 1}


def test_a_re_sent_claim_counts_its_jobs_and_lateness_once(q: Queue, client: redis.Redis) -> None:
    for i in range(3):
        q.enqueue("t", i)
    first = q.claim("w", limit=3, nonce="n1")
    again = q.claim("w", limit=3, nonce="n1")  # the reply was lost: sent again
    assert [j.token for j in again.jobs] == [j.token for j in first.jobs]
    assert counters(client, q) == {"claim": 3}
    late_n = sum(
        int(client.hget(k, "late_n") or 0)
        for k in client.scan_iter(match=f"{q.keys.prefix}stats:*")
    )
    assert late_n == 3  # docs/dashboard.md: late_n, jobs started that minute


def test_retention_counts_each_trimmed_dead_letter_once(q: Queue, client: redis.Redis) -> None:
    ids = [q.enqueue("t", i, max_attempts=1) for i in range(3)]
    for job in q.claim("w", limit=3).jobs:
        q.fail(job.id, job.token, ("E", "m", ""))
    before = counters(client, q)
    q.set_dead_retention(max_count=1)
    q.claim("w", limit=0)  # claims apply it too
    q.claim("w", limit=0)
    assert q.counts().dead == 1 and q.dead_ids() == [ids[2]]
    assert delta(before, counters(client, q)) == {"dead_trimmed": 2}


def test_stats_json_windows_and_the_table_show_the_counters_redis_holds(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    a, b, c = (q.enqueue("t", i, max_attempts=2) for i in range(3))
    jobs = {j.id: j for j in q.claim("w", limit=3).jobs}
    q.complete(a, jobs[a].token, None)
    q.fail(b, jobs[b].token, ("E", "m", ""), delay_ms=0)
    q.fail(c, jobs[c].token, ("E", "m", ""), retryable=False)
    (again,) = q.claim("w", limit=3).jobs
    q.fail(b, again.token, ("E", "m", ""))
    held = counters(client, q)
    assert held == {"claim": 4, "done": 1, "fail": 3, "retry": 1, "dead": 2}
    run = CliRunner(env={"COLUMNS": "300"})
    out = run.invoke(main, ["stats", "-q", q.name, "--json", "--url", redis_url])
    assert out.exit_code == 0, out.output
    (row,) = [r for r in json.loads(out.stdout)["queues"] if r["queue"] == q.name]
    sixty = {k: v for k, v in row["windows"]["60m"].items() if v}
    assert sixty == held
    assert row["dead"] == 2


def test_a_heartbeat_after_the_reaper_took_the_lapsed_lease_answers_as_documented(
    q: Queue, client: redis.Redis
) -> None:
    """Queue.heartbeat's docstring: `'expired'` (the lease had lapsed), `'stale'` (another
    claim holds the job). A lease that lapsed answers `expired` until a claim's reaper takes
    it; after that, the job due again and held by no claim, it answers `stale`, which the
    docstring gives only for a job another claim holds (complete's docstring does name the
    reaped case). The worker reads every such status as `expired` (heartbeat.py _lost), so
    its metric agrees with the stats; a hand-driven caller is told something untrue."""
    a = q.enqueue("t", 1, max_attempts=3)
    (job,) = q.claim("w", limit=1).jobs
    client.zadd(q.keys.leased, {a: server_now_ms(client) - 1_000})
    assert q.heartbeat([(a, job.token)])[1] == {a: "expired"}  # lapsed, not yet reaped
    q.claim("w2", limit=0)  # another worker's claim reaps it: no claim holds the job now
    assert counters(client, q) == {"claim": 1, "expired": 1}
    assert q.list_jobs("leased") == []
    status = q.heartbeat([(a, job.token)])[1][a]
    doc = " ".join((Queue.heartbeat.__doc__ or "").split())
    assert status == "expired" or "reaped" in doc, (status, doc)


hooked: list[tuple[str, str]] = []
gate_tasks = Registry()
gate = threading.Event()
gated_started = threading.Event()


@gate_tasks.task(name="gated")
def gated_task(payload: Any, ctx: JobContext) -> str:
    gated_started.set()
    gate.wait(30)
    return "ok"


@gate_tasks.on_outcome
def record_outcome(outcome: JobOutcome) -> None:
    hooked.append((outcome.ctx.job_id, outcome.outcome))


def test_an_outcome_given_up_at_stop_reaches_the_hooks_as_the_metric_counts_it(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    """README / Registry.on_outcome: hooks get a JobOutcome for each outcome the worker
    counts, under the metrics' word (`stale` included). An outcome given up at the stop (the
    queue now stored by a newer version: newer_outcomes._given_up) is counted `stale` in the
    metrics, but no hook hears of it, nor does a per-job log line name it."""
    hooked.clear()
    gate.clear()
    gated_started.clear()
    log, seen = captured(q)
    job = q.enqueue("gated", {})
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, grace_s=20)

    def open_gate_once_stopping(w: Worker) -> None:
        deadline = time.monotonic() + 30
        while not w._stop_claiming.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()

    with worker_thread(redis_url, gate_tasks, settings, logger=log) as w:
        # Its handler running, not only its lease taken: a claim answered after the stop began
        # gives its never-started job back (released), which has no outcome to give up.
        assert gated_started.wait(30)
        client.hset(q.keys.config, "generation", str(STORAGE_GENERATION + 1))
        opener = threading.Thread(target=open_gate_once_stopping, args=(w,))
        opener.start()
    opener.join(30)
    client.hdel(q.keys.config, "generation")  # the fixture's cleanup runs this version's code
    assert jobs_total(w, q, "gated", "stale") == 1
    events = [(getattr(r, "job_id", ""), getattr(r, "event", "")) for r in seen.records]
    assert (job, "stale") in hooked, (hooked, [r.getMessage() for r in seen.records])
    assert (job, "stale") in events


def test_a_re_sent_enqueue_of_a_child_parked_at_once_counts_one_dead(
    q: Queue, client: redis.Redis
) -> None:
    parent = q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(parent, job.token, ("E", "m", ""))
    before = counters(client, q)
    for _ in range(2):  # the reply lost: the same id sent again
        assert q.enqueue("t", 2, after=[parent], job_id="child-1") == "child-1"
    q.enqueue("t", 3, after=[parent], key="k1")
    q.enqueue("t", 3, after=[parent], key="k1")  # the same key: the first job's id
    assert q.counts().dead == 3
    assert delta(before, counters(client, q)) == {"dead": 2}


@gate_tasks.task(name="self_cancel")
def self_cancel_task(payload: Any, ctx: JobContext) -> str:
    with redis.Redis.from_url(payload["url"], decode_responses=True) as c:
        Queue(c, ctx.queue).cancel(ctx.job_id)  # cancelled while it runs, before its complete
    return "ran"


def test_a_complete_refused_as_cancelled_is_one_word_in_metric_log_hook_and_stats(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    hooked.clear()
    log, seen = captured(q)
    job = q.enqueue("self_cancel", {"url": redis_url})
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=10_000, lease_ms=30_000)
    with worker_thread(redis_url, gate_tasks, settings, logger=log) as w:
        deadline = time.monotonic() + 30
        while (job, "cancelled") not in hooked and time.monotonic() < deadline:
            time.sleep(0.01)
        got = {o: jobs_total(w, q, "self_cancel", o) for o in OUTCOMES}
    assert {o: n for o, n in got.items() if n} == {"cancelled": 1}
    assert hooked == [(job, "cancelled")]
    refused = [r for r in seen.records if getattr(r, "event", "") == "cancelled"]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING
    assert (getattr(refused[0], "refused", ""), getattr(refused[0], "status", "")) == (
        "complete",
        "cancelled",
    )
    assert counters(client, q) == {"claim": 1, "cancel": 1}
    assert q.get_job(job).state == "cancelled"


def test_a_misfire_skip_is_one_misfire_skip_and_no_claim_or_cancel(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    base = 1_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("m", "t", every_ms=MIN_MS, misfire="run_once")
    first = _pending(client, q, "m")
    at = int(str(client.hget(q.keys.job(first), "run_at_ms")))
    clock.set_ms(at + 5 * MIN_MS + 1_000)  # 5 later slots missed too
    claimed: list[str] = []
    for _ in range(3):
        claimed += [j.id for j in q.claim("w", limit=5).jobs]
    assert len(claimed) == 1 and first not in claimed
    assert client.hget(q.keys.job(first), "skipped") == "misfire"
    c = counters(client, q)
    assert (c.get("misfire_skip"), c.get("claim"), c.get("cancel", 0)) == (1, 1, 0)
    assert c.get("rearm") == 2  # the skip placed the latest missed run, its claim the next


def test_jobs_cancel_of_a_parent_and_its_children_counts_cancels_and_no_dead(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    """docs/cli.md: each job the command cancels goes before any job it waits for, so none is
    parked by its parent's cancel: three cancels, no new dead."""
    parent = q.enqueue("t", 1, delay_ms=600_000)
    kids = [q.enqueue("t", i, after=[parent]) for i in range(2)]
    args = ["jobs", "cancel", parent, *kids, "-q", q.name, "--url", redis_url, "--yes"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert q.counts().dead == 0
    assert counters(client, q) == {"cancel": 3}
