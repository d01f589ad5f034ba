"""A hand-written leased-ZSET score no reader expects (`ZADD leased inf <id>`): the operator's
`jobs list --state leased` and `jobs show <id>` still list/show the job and exit 0, with no
traceback and no "unreadable stored data" refusal (issue 14 leftover; the score is clamped as
claim.lua clamps one, see codec._score_ms)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from tests.redis_server import RedisProcess, require_binary

QUEUE = "hostile"
HOSTILE_SCORES = [float("inf"), float("-inf"), 1e300, -5.0]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProcess]:
    proc = RedisProcess(require_binary("redis-server", "hostile-score tests")).start()
    try:
        yield proc
    finally:
        proc.cleanup()


@pytest.fixture
def leased(server: RedisProcess) -> Iterator[tuple[redis.Redis, Queue, str]]:
    client = redis.Redis.from_url(server.url)
    client.flushdb()  # a private server, started above
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
    server: RedisProcess, leased: tuple[redis.Redis, Queue, str], score: float
) -> None:
    client, q, jid = leased
    client.zadd(q.keys.leased, {jid: score})
    result = run_cli(server.url, "jobs", "list", "--state", "leased", "--json")
    assert result.exit_code == 0, result.output
    assert [j["id"] for j in json.loads(result.output)["jobs"]] == [jid]
    table = run_cli(server.url, "jobs", "list", "--state", "leased")
    assert table.exit_code == 0 and jid in table.output
    assert "unreadable stored data" not in table.output


@pytest.mark.parametrize("score", HOSTILE_SCORES, ids=str)
def test_jobs_show_shows_a_job_with_a_hostile_score(
    server: RedisProcess, leased: tuple[redis.Redis, Queue, str], score: float
) -> None:
    client, q, jid = leased
    client.zadd(q.keys.leased, {jid: score})
    result = run_cli(server.url, "jobs", "show", jid, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["id"] == jid and shown["state"] == "leased" and "leased" in shown["places"]
    table = run_cli(server.url, "jobs", "show", jid)
    assert table.exit_code == 0 and jid in table.output
    assert "unreadable stored data" not in table.output
