"""Jobs flow control sets aside (flow:held: a concurrency or rate limit, parents not done) are
counted in `counts().due` but are not in the `due` index: they are listed as `held`
(list_jobs, `jobs list --state held`, the dashboard's held tab). No listing showed them."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from tests.test_dashboard import make_client


def test_held_jobs_are_listed_as_held(redis_url: str, client: redis.Redis, q: Queue) -> None:
    parent = q.enqueue("t", 0, delay_ms=3_600_000)
    children = [q.enqueue("t", i, after=[parent]) for i in range(3)]
    assert q.counts().due == 3  # counted as due now (docs/flow-control.md)
    assert q.list_jobs("due") == []
    held = q.list_jobs("held")
    assert [j.id for j in held] == children  # by run_at, then id: enqueue order here
    assert all(j.state == "held" for j in held)  # JobState.HELD (before: 'due')
    assert [j.id for j in q.list_jobs("held", offset=1, limit=1)] == children[1:2]
    assert [j.id for j in q.list_jobs("scheduled")] == [parent]
    args = ["jobs", "list", "-q", q.name, "--state", "held", "--url", redis_url]
    out = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert [r["id"] for r in json.loads(out.stdout)["jobs"]] == children
    table = CliRunner(env={"COLUMNS": "200"}).invoke(main, args, catch_exceptions=False).stdout
    assert all(c in table for c in children) and "held:" in table
    with make_client(client, q) as web:
        page = web.get(f"/queues/{q.name}?state=held").text
        assert all(c in page for c in children)
        assert "?state=held" in web.get(f"/queues/{q.name}").text  # the tab


def test_a_held_child_due_later_shows_why_it_is_held(redis_url: str, q: Queue) -> None:
    parent = q.enqueue("t", 0, delay_ms=3_600_000)
    child = q.enqueue("t", 1, after=[parent], delay_ms=7_200_000)
    (held,) = q.list_jobs("held")
    assert held.id == child and held.state == "held"  # its run_at later too (before: scheduled)
    args = ["jobs", "list", "-q", q.name, "--state", "held", "--url", redis_url, "--json"]
    out = CliRunner().invoke(main, args, catch_exceptions=False)
    (row,) = json.loads(out.stdout)["jobs"]
    assert row["flow"] and "waiting" in row["flow"]
