"""The fixes of tests/test_cli_bulk_review.py's defects, from the other side: `jobs cancel
--state`'s (score, id) cursor (cli/job_select.py) when more ids of one ms leave between two
pages than its slack, `jobs list --task`'s cut and the --scan-from that goes on past it, and
`jobs cancel --state` stopped midway saying what it did first."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import JobSpec, Queue
from scheduler.cli import job_cancel, job_select
from scheduler.cli import jobs as cli_jobs
from scheduler.cli.main import main

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url])

    return run


def test_the_cursor_takes_each_id_once_when_many_of_its_ms_leave_or_come(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 ids of one score: after the first page, 500 of the ids read leave (more than the
    slack) and 200 come on both sides of the cursor: every id there all along is read once."""
    monkeypatch.setattr(job_select, "_PAGE", 1000)
    key = q.keys.prefix + "test-cursor"
    ids = [f"id{i:05d}" for i in range(3000)]
    client.zadd(key, dict.fromkeys(ids, 5))
    read: list[str] = []
    pages = job_select._pages(client, key, "-inf", "+inf")
    read += next(pages)
    client.zrem(key, *ids[100:600])
    client.zadd(key, {**{f"id{i:05d}x": 5 for i in range(0, 2000, 20)}, "id99999": 4})
    for page in pages:
        read += page
    client.delete(key)
    assert len(read) == len(set(read))
    assert set(ids[:100] + ids[600:]) <= set(read) and "id99999" not in read


def test_a_cut_task_scan_goes_on_with_scan_from(
    cli: Run, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_jobs, "_TASK_SCAN_MAX", 1000)
    q.enqueue_many([JobSpec("a", {"i": i}) for i in range(1000)])
    wanted = q.enqueue_many([JobSpec("b", {"i": i}) for i in range(5)])
    out = json.loads(cli("jobs", "list", "--json", "-q", q.name, "--task", "b").stdout)
    assert (out["jobs"], out["scanned"], out["cut"]) == ([], 1000, True)
    assert out["next_scan_from"] == 1000
    text = cli("jobs", "list", "-q", q.name, "--task", "b")
    assert "--scan-from 1000" in text.stdout, text.stdout
    rest = json.loads(cli("jobs", "list", "--json", "-q", q.name, "--task", "b", "--scan-from",
                          "1000").stdout)  # fmt: skip
    assert [j["id"] for j in rest["jobs"]] == wanted
    assert (rest["scanned"], rest["cut"], rest["next_scan_from"]) == (5, False, None)
    exact = json.loads(cli("jobs", "list", "--json", "-q", q.name, "--task", "a").stdout)
    assert (len(exact["jobs"]), exact["cut"]) == (50, False)  # enough matches: no cut
    assert cli("jobs", "list", "-q", q.name, "--scan-from", "5").exit_code == 2


def test_cancel_state_stopped_midway_says_what_it_did_first(
    cli: Run, q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    q.enqueue_many([JobSpec("t", {"i": i}) for i in range(450)])
    real = job_cancel._cancel_each
    calls: list[int] = []

    def cancel_each(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise redis.ConnectionError("Connection reset by peer")
        real(*args)

    monkeypatch.setattr(job_cancel, "_cancel_each", cancel_each)
    result = cli("jobs", "cancel", "--yes", "--json", "-q", q.name, "--state", "due")
    assert result.exit_code == 3, result.output
    out = json.loads(result.stdout)
    assert (out["matched"], out["cancelled"], out["unconfirmed"]) == (450, 200, 250)
    assert "Connection reset" in out["stopped"] and q.counts().due == 250
