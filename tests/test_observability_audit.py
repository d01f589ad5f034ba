"""From an audit of observability accuracy: what `scheduler stats`, the counts and the worker's
metrics tell an operator agrees with the queue's real state."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.workers import live_workers
from scheduler.cli.main import main
from scheduler.core.vocabulary import STAT_FIELDS
from scheduler.operations.requests import Script
from tests.conftest import Clock, delete_queue
from tests.test_dashboard import make_client
from tests.test_flow_visibility import hold_one_of_each
from tests.workers.procs import ROOT


def test_stats_names_no_overdue_job_when_only_held_jobs_are_due(redis_url: str, q: Queue) -> None:
    # Every due job is set aside by flow control; the due set's head is the parent scheduled
    # an hour from now, which is not overdue and must not be named as the oldest overdue job.
    hold_one_of_each(q)
    out = CliRunner().invoke(main, ["stats", "--json", "-q", q.name, "--url", redis_url])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["queues"]
    assert row["due"] == 3 and row["overdue_ms"] == 0
    assert row["oldest_overdue_id"] is None


def test_stats_windows_hold_the_outcome_counters_only_as_the_dashboard_doc_says(
    redis_url: str, q: Queue
) -> None:
    # docs/dashboard.md said `stats --json` summed claim's lateness fields into its windows
    # (late_max_ms summed); the windows hold the stats counters alone (STAT_FIELDS).
    q.enqueue("t", 1)
    assert len(q.claim("w", limit=1).jobs) == 1
    out = CliRunner().invoke(main, ["stats", "--json", "-q", q.name, "--url", redis_url])
    (row,) = json.loads(out.stdout)["queues"]
    for window in row["windows"].values():
        assert set(window) == set(STAT_FIELDS)
    assert window["claim"] == 1
    doc = " ".join((ROOT / "docs" / "dashboard.md").read_text().split())
    assert "sums these fields into its windows" not in doc
    assert "leaves these fields out of its windows" in doc


def _beat(q: Queue, pid: str) -> None:
    args = ["w-fixed", "15000", "beat", "box1", pid, q.name, "0", "4"]
    q._execute(Script("worker_beat", args))


def test_a_worker_restarted_under_the_same_id_shows_its_own_start(
    tq: tuple[Queue, Clock],
) -> None:
    # A worker with a fixed --worker-id (or a pool's child, `<id>.<k>`) killed and started
    # again before its presence hash expired (3 heartbeats): `scheduler workers` and the
    # dashboard showed the dead process's start time beside the new pid, so a crash loop read
    # as a long uptime. A beat from another process (host, pid) starts the clock again.
    q, clock = tq
    clock.set_ms(1_000_000)
    _beat(q, "101")
    clock.set_ms(1_005_000)
    _beat(q, "101")
    assert q.client.hget(q.keys.worker("w-fixed"), "started_ms") == "1000000"
    clock.set_ms(1_007_000)  # pid 101 crashed; its replacement beats within the hash's TTL
    _beat(q, "202")
    (w,), gone = live_workers(q.client, q.keys)
    assert not gone and (w.pid, w.started_ms) == (202, 1_007_000)
    clock.set_ms(1_012_000)
    _beat(q, "202")
    assert live_workers(q.client, q.keys)[0][0].started_ms == 1_007_000


def test_the_job_page_says_a_due_job_waits_for_its_paused_queue(
    client: redis.Redis, q: Queue
) -> None:
    # With a live worker, a due job of a paused queue was said to wait "for a free worker
    # slot": the operator looked for busy workers while nothing is claimed until a resume.
    job_id = q.enqueue("mail.send", {"x": 1})
    q._execute(Script("worker_beat", ["w-live", "30000", "beat", "box1", "7", q.name, "0", "4"]))
    with make_client(client, q) as web:
        page = web.get(f"/queues/{q.name}/jobs/{job_id}").text
        assert 'data-reason="waiting-for-worker"' in page
        assert q.pause() == "paused"
        page = web.get(f"/queues/{q.name}/jobs/{job_id}").text
        assert 'data-reason="queue-paused"' in page
        assert 'data-reason="waiting-for-worker"' not in page
        q.resume()
        page = web.get(f"/queues/{q.name}/jobs/{job_id}").text
        assert 'data-reason="queue-paused"' not in page


def test_workers_lists_a_worker_of_two_queues_under_each(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    # A worker run with --queue A --queue B beats on both. `scheduler workers` listed it under
    # the first queue only (the partitions' dedupe spanned every queue), so queue B read as
    # having no live worker; a partitioned queue's partitions still list it once.
    other = Queue(client, q.name + "-b")
    try:
        for each in (q, other):
            args = ["w-both", "30000", "beat", "box1", "7", f"{q.name},{other.name}", "0", "4"]
            each._execute(Script("worker_beat", args))
        out = CliRunner().invoke(
            main, ["workers", "--json", "-q", q.name, "-q", other.name, "--url", redis_url]
        )
        assert out.exit_code == 0, out.output
        rows = json.loads(out.stdout)["workers"]
        assert sorted((w["queue"], w["id"]) for w in rows) == sorted(
            [(q.name, "w-both"), (other.name, "w-both")]
        )
    finally:
        delete_queue(client, other)


def test_the_readme_says_how_to_read_the_queue_gauges_of_several_workers() -> None:
    # Every worker exports the queue's own gauges (one counts call per heartbeat), so with
    # several workers (not one pool) sum() counts each job once per worker: the README told a
    # pool's users so, not those running workers side by side (containers, hosts).
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "max by (queue, state) (scheduler_queue_jobs)" in readme


def test_counts_oldest_due_is_none_while_nothing_is_due(q: Queue) -> None:
    """Queue.counts' docstring (and QueueCounts') says oldest_due_ms is None when nothing is
    due; it was the earliest run time of the due index, in the future for a queue whose jobs
    are all scheduled later (stats --json showed it as the oldest due job)."""
    q.enqueue("later", None, delay_ms=3_600_000)
    c = q.counts()
    assert c.due == 0 and c.scheduled == 1
    assert c.oldest_due_ms is None
    jid = q.enqueue("now", None)
    c = q.counts()
    assert c.due == 1 and c.oldest_due_ms is not None and c.oldest_due_ms <= c.now_ms
    assert c.oldest_due_ms == q.get_job(jid).run_at_ms
