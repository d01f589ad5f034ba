"""A hand-written leased-ZSET score no reader expects (`ZADD leased inf <id>`): the operator's
`jobs list --state leased` and `jobs show <id>` still list/show the job and exit 0 (no
"unreadable stored data" refusal), and show that one field as unreadable instead of a lease
that ends in the year 2200 or lapsed in 1970 (issue 14 leftover). The API keeps its clamp
(tests/test_hostile_data.py::test_read_views_survive_hostile_numbers)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from tests.redis_server import RedisProcess

QUEUE = "hostile"
HOSTILE_SCORES = [float("inf"), float("-inf"), 1e300, -5.0]


@pytest.fixture
def leased(module_server: RedisProcess) -> Iterator[tuple[redis.Redis, Queue, str]]:
    client = redis.Redis.from_url(module_server.url)
    client.flushdb()  # a private server: module_server in tests/conftest.py
    q = Queue(client, QUEUE)
    jid = q.enqueue("t.x", {})
    (job,) = q.claim("w1", limit=1).jobs
    assert job.id == jid
    yield client, q, jid
    client.close()


def run_cli(url: str, *args: str) -> Result:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [*args, "-q", QUEUE, "--url", url])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: crashed") from result.exception
    return result


@pytest.mark.parametrize("score", HOSTILE_SCORES, ids=str)
def test_jobs_list_leased_lists_a_job_with_a_hostile_score(
    module_server: RedisProcess, leased: tuple[redis.Redis, Queue, str], score: float
) -> None:
    client, q, jid = leased
    client.zadd(q.keys.leased, {jid: score})
    result = run_cli(module_server.url, "jobs", "list", "--state", "leased", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["jobs"]
    assert row["id"] == jid and row["lease_unreadable"] is True
    assert row["lease_until_ms"] is None and row["lease_left_ms"] is None
    table = run_cli(module_server.url, "jobs", "list", "--state", "leased")
    assert table.exit_code == 0 and jid in table.output
    assert "lease unreadable" in table.output and "lease left" not in table.output
    assert "unreadable stored data" not in table.output


@pytest.mark.parametrize("score", HOSTILE_SCORES, ids=str)
def test_jobs_show_shows_a_job_with_a_hostile_score(
    module_server: RedisProcess, leased: tuple[redis.Redis, Queue, str], score: float
) -> None:
    client, q, jid = leased
    client.zadd(q.keys.leased, {jid: score})
    result = run_cli(module_server.url, "jobs", "show", jid, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["id"] == jid and shown["state"] == "leased" and "leased" in shown["places"]
    assert shown["lease_unreadable"] is True and shown["lease_until_ms"] is None
    table = run_cli(module_server.url, "jobs", "show", jid)
    assert table.exit_code == 0 and jid in table.output
    assert "lease until" in table.output and "not a time" in table.output
    assert "lease left" not in table.output and "unreadable stored data" not in table.output


def test_a_real_lease_is_still_shown(
    module_server: RedisProcess, leased: tuple[redis.Redis, Queue, str]
) -> None:
    _, _, jid = leased
    (row,) = json.loads(
        run_cli(module_server.url, "jobs", "list", "--state", "leased", "--json").output
    )["jobs"]
    assert row["lease_unreadable"] is False and 0 < row["lease_left_ms"] <= 30_000
    table = run_cli(module_server.url, "jobs", "show", jid)
    assert "lease left" in table.output and "not a time" not in table.output
