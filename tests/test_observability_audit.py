"""From an audit of observability accuracy: what `scheduler stats`, the counts and the worker's
metrics tell an operator agrees with the queue's real state."""

from __future__ import annotations

import json

from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from tests.test_flow_visibility import hold_one_of_each


def test_stats_names_no_overdue_job_when_only_held_jobs_are_due(redis_url: str, q: Queue) -> None:
    # Every due job is set aside by flow control; the due set's head is the parent scheduled
    # an hour from now, which is not overdue and must not be named as the oldest overdue job.
    hold_one_of_each(q)
    out = CliRunner().invoke(main, ["stats", "--json", "-q", q.name, "--url", redis_url])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["queues"]
    assert row["due"] == 3 and row["overdue_ms"] == 0
    assert row["oldest_overdue_id"] is None
