"""`scheduler dead retention`: off by default, shown and set from the CLI, a limit not given is
kept, nothing beyond a new limit is deleted without a confirmation, and bad input changes
nothing (exit codes from scheduler/core/exits.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main
from scheduler.core.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from tests.conftest import dump_queue

Run = Callable[..., Result]
DAY_MS = 86_400_000


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str, stdin: str | None = None) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], input=stdin)

    return run


def park(q: Queue, n: int) -> list[str]:
    """n real dead letters (fail.lua parks them), oldest first."""
    ids = []
    for i in range(n):
        job_id = q.enqueue("t", i, max_attempts=1)
        (job,) = q.claim("w", limit=1).jobs
        assert q.fail(job_id, job.token, ValueError("boom")).status == "dead"
        ids.append(job_id)
    return ids


def retention(cli: Run, q: Queue, *args: str, stdin: str | None = None) -> dict[str, Any]:
    res = cli("dead", "retention", "-q", q.name, "--json", *args, stdin=stdin)
    assert res.exit_code == EXIT_OK, res.output
    data: dict[str, Any] = json.loads(res.stdout[res.stdout.index("{") :])
    return data


def test_off_by_default_and_showing_writes_nothing(cli: Run, q: Queue, client: redis.Redis) -> None:
    park(q, 2)
    before = dump_queue(client, q)
    data = retention(cli, q)
    assert data == {"queue": q.name, "max_age_ms": None, "max_count": None, "changed": False,
                    "dead": 2, "beyond": 0}  # fmt: skip
    human = cli("dead", "retention", "-q", q.name)
    assert human.exit_code == EXIT_OK and "off (every dead job is kept" in human.stdout
    assert dump_queue(client, q) == before


def test_a_limit_with_jobs_beyond_it_asks_first(cli: Run, q: Queue, client: redis.Redis) -> None:
    ids = park(q, 3)
    declined = cli("dead", "retention", "-q", q.name, "--max-count", "2", stdin="n\n")
    assert declined.exit_code == EXIT_FAILED
    assert "1 of 3 dead job(s)" in declined.output
    assert not client.exists(q.keys.config)
    data = retention(cli, q, "--max-count", "2", stdin="y\n")
    assert (data["max_count"], data["changed"], data["beyond"]) == (2, True, 1)
    assert client.hget(q.keys.config, "dead_max_count") == "2"
    # Nothing is deleted by setting it; the next dead letter applies it, oldest first.
    assert sorted(q.dead_ids()) == sorted(ids)
    (newest,) = park(q, 1)
    assert set(q.dead_ids()) == {ids[2], newest}


def test_a_limit_not_given_is_kept_and_off_clears(cli: Run, q: Queue, client: redis.Redis) -> None:
    park(q, 1)
    assert retention(cli, q, "--max-count", "100")["max_count"] == 100
    data = retention(cli, q, "--max-age", "7d")
    assert (data["max_age_ms"], data["max_count"]) == (7 * DAY_MS, 100)
    human = cli("dead", "retention", "-q", q.name)
    assert "max age 7d" in human.stdout and "max count 100" in human.stdout
    data = retention(cli, q, "--max-age", "off")
    assert (data["max_age_ms"], data["max_count"]) == (None, 100)
    data = retention(cli, q, "--off")
    assert (data["max_age_ms"], data["max_count"], data["changed"]) == (None, None, True)
    assert client.hgetall(q.keys.config) == {}


def test_the_jobs_beyond_an_age_are_counted(cli: Run, q: Queue, client: redis.Redis) -> None:
    old, new = park(q, 2)
    ten_days_ago = server_now_ms(client) - 10 * DAY_MS
    client.zadd(q.keys.dead, {old: ten_days_ago})
    client.hset(q.keys.job(old), "dead_ms", ten_days_ago)
    data = retention(cli, q, "--max-age", "7d", "--yes")
    assert (data["dead"], data["beyond"], data["max_age_ms"]) == (2, 1, 7 * DAY_MS)
    assert set(q.dead_ids()) == {old, new}  # applied as jobs die, not by setting it


@pytest.mark.parametrize(
    "args",
    [
        ("--max-age", "0s"),
        ("--max-age", "soon"),
        ("--max-count", "-1"),
        ("--max-count", "1e3"),
        ("--max-count", "99999999999999999"),
        ("--off", "--max-age", "7d"),
    ],
)
def test_bad_input_is_usage_and_changes_nothing(
    cli: Run, q: Queue, client: redis.Redis, args: tuple[str, ...]
) -> None:
    park(q, 1)
    retention(cli, q, "--max-count", "5")
    before = dump_queue(client, q)
    res = cli("dead", "retention", "-q", q.name, *args)
    assert res.exit_code == EXIT_USAGE, res.output
    assert dump_queue(client, q) == before


def test_an_unknown_queue_is_refused(cli: Run, client: redis.Redis) -> None:
    res = cli("dead", "retention", "-q", "no-such-queue", "--max-count", "1")
    assert res.exit_code == EXIT_FAILED and "no queue named" in res.output
    assert not client.exists(Queue(client, "no-such-queue").keys.config)
