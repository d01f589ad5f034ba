"""The metrics endpoint scraped and parsed, the live-worker registry, and the demo command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from scheduler import Queue
from scheduler.worker import Worker, WorkerSettings
from tests.embedded_worker import worker_thread
from tests.workers.basic import registry
from tests.workers.procs import ROOT, wait_for


@pytest.fixture
def in_process_worker(
    redis_url: str, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Worker]:
    monkeypatch.setenv("TEST_REDIS_URL", redis_url)
    result: list[int] = []
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=100, lease_ms=3000)
    with worker_thread(redis_url, registry, settings, exit_codes=result) as w:
        yield w
    assert result == [0]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_match_the_jobs_that_ran(
    in_process_worker: Worker, q: Queue, client: redis.Redis
) -> None:
    w = in_process_worker
    port = w.metrics.serve(0, addr="127.0.0.1")
    ok = q.enqueue_many([registry.job_spec("echo", {"i": i}) for i in range(5)])
    bad = q.enqueue_many([registry.job_spec("boom", {}, max_attempts=2) for _ in range(2)])
    wait_for(lambda: all(q.status(i) == "done" for i in ok) and q.counts().dead == 2)
    qn = q.name

    m = scrape(port)

    def v(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    def depth_seen() -> bool:
        nonlocal m
        m = scrape(port)
        return v("scheduler_queue_jobs", queue=qn, state="dead") == 2

    # The depth gauges come from the heartbeat's counts call: wait for one after the last job.
    wait_for(depth_seen, what="depth gauges")
    assert v("scheduler_jobs_total", queue=qn, task="echo", outcome="done") == 5
    assert v("scheduler_jobs_total", queue=qn, task="boom", outcome="retry") == 2
    assert v("scheduler_jobs_total", queue=qn, task="boom", outcome="dead") == 2
    assert v("scheduler_job_lateness_seconds_count", queue=qn, task="echo") == 5
    assert v("scheduler_job_lateness_seconds_count", queue=qn, task="boom") == 4
    assert v("scheduler_job_duration_seconds_count", queue=qn, task="echo") == 5
    assert v("scheduler_jobs_in_flight") == 0
    assert v("scheduler_queue_jobs", queue=qn, state="due") == 0
    assert v("scheduler_queue_jobs", queue=qn, state="leased") == 0
    # Its own gauge in seconds: no `state` of scheduler_queue_jobs mixes ms into job counts.
    assert ("scheduler_queue_oldest_overdue_seconds", (("queue", qn),)) in m
    assert v("scheduler_queue_oldest_overdue_seconds", queue=qn) == 0
    states = {dict(k[1]).get("state") for k in m if k[0] == "scheduler_queue_jobs"}
    assert states == {"due", "scheduled", "leased", "dead", "lapsed", "moving"}
    assert bad  # both ids dead
    # The live-worker registry read by `scheduler workers`.
    assert client.zscore(q.keys.workers, w.id) is not None
    h = client.hgetall(q.keys.worker(w.id))
    assert h["pid"] == str(os.getpid()) and h["queues"] == qn and h["concurrency"] == "16"
    assert {"host", "started_ms", "last_heartbeat_ms", "in_flight"} <= set(h)
    assert 0 < client.pttl(q.keys.worker(w.id)) <= 300


def test_demo_runs_and_tells_the_story() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [sys.executable, "-c", "from scheduler.cli.main import main; main()", "demo"],
        cwd=ROOT, env=dict(env, COLUMNS="200"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for needle in ("greet (due now)", "greet (due in 5 s)", "retry in 1000 ms",
                   "dead-lettered (attempts exhausted)", "died (signal 9)",
                   "expired after 2000 ms -> claimed again", '"survived a crash"',
                   "All five jobs ended as expected"):  # fmt: skip
        assert needle in text, needle
    # The webhook's story, row by row (200 columns: one line each): its first attempt asks for
    # later, its retry waits the 2 s it asked for (not the 1 s backoff), its second succeeds.
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines()]
    webhook = [(float(r[0].rstrip("s")), re.sub(r"pid \d+", "pid N", r[2])) for r in rows
               if len(r) == 3 and r[1] == "webhook (retry after 2 s)"]  # fmt: skip
    assert [event for _, event in webhook] == [
        "enqueued",
        "started attempt 1 in worker pid N",
        "attempt 1 failed: RetryLater: HTTP 429 Too Many Requests, Retry-After: 2 -> "
        "retry in 2000 ms (its own delay, not the backoff's 1000 ms)",
        "started attempt 2 in worker pid N",
        'done after 2 attempt(s): "delivered (HTTP 200)"',
    ], text
    assert webhook[3][0] - webhook[2][0] >= 2.0, text  # the server held it back that long
