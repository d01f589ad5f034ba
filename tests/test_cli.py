"""The read commands (`stats`, `jobs`, `workers`, `keys`) against a real Redis through click's
CliRunner: --json output parsed back, human output rendered, and every bad input refused with
a clear message and the documented exit code, without changing anything."""

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
from tests.conftest import dump_queue

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})  # wide tables: whole ids and messages

    def run(*args: str, input: str | None = None, url: str = redis_url) -> Result:
        return runner.invoke(main, [*args, "--url", url], input=input, catch_exceptions=False)

    return run


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one(data: dict[str, Any], queue: str) -> dict[str, Any]:
    (row,) = [r for r in data["queues"] if r["queue"] == queue]
    return row


@pytest.fixture
def busy(q: Queue) -> dict[str, str]:
    """One job in each place: due, scheduled, leased, dead, done."""
    ids = {
        "done": q.enqueue("mail", {"n": 1}),
        "dead": q.enqueue("mail", {"n": 2}),
        "leased": q.enqueue("sms", {"n": 3}),
    }
    ids["due"] = q.enqueue("mail", {"n": 4}, delay_ms=0)
    ids["scheduled"] = q.enqueue("mail", {"n": 5}, delay_ms=3_600_000)
    got = {j.id: j for j in q.claim("w-1", limit=3).jobs}
    assert set(got) == {ids["done"], ids["dead"], ids["leased"]}
    q.complete(ids["done"], got[ids["done"]].token, {"sent": True})
    q.fail(ids["dead"], got[ids["dead"]].token, ValueError("bad address"), retryable=False)
    return ids


def test_stats_json_matches_the_queue(cli: Run, q: Queue, busy: dict[str, str]) -> None:
    row = one(ok_json(cli("stats", "--json", "-q", q.name)), q.name)
    assert (row["due"], row["scheduled"], row["leased"], row["dead"]) == (1, 1, 1, 1)
    assert row["oldest_overdue_id"] == busy["due"] and row["overdue_ms"] >= 0
    # A test may straddle a minute boundary: the 5 and 60 minute windows hold both minutes.
    for window in ("5m", "60m"):
        counts = row["windows"][window]
        assert (counts["claim"], counts["done"], counts["fail"], counts["dead"]) == (3, 1, 1, 1)


def test_stats_discovers_queues_and_renders_a_table(
    cli: Run, q: Queue, busy: dict[str, str]
) -> None:
    data = ok_json(cli("stats", "--json"))
    assert q.name in [r["queue"] for r in data["queues"]]
    result = cli("stats", "-q", q.name)
    assert result.exit_code == 0 and q.name in result.stdout
    assert "+dead (new dead letters)" in result.stdout


def test_stats_watch_refreshes(cli: Run, q: Queue, busy: dict[str, str]) -> None:
    result = cli("stats", "--watch", "--count", "3", "--interval", "0.1", "--json", "-q", q.name)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.exit_code == 0 and len(lines) == 3
    assert all(one(d, q.name)["dead"] == 1 for d in lines)
    table = cli("stats", "--watch", "--count", "2", "--interval", "0.1", "-q", q.name)
    assert table.exit_code == 0 and q.name in table.stdout


def test_jobs_list_by_state_task_and_page(cli: Run, q: Queue) -> None:
    ids = [q.enqueue("a" if i % 2 else "b", {"i": i}, job_id=f"j{i}") for i in range(6)]
    due = ok_json(cli("jobs", "list", "--json", "-q", q.name, "--state", "due"))
    assert [j["id"] for j in due["jobs"]] == ids
    page = ok_json(cli("jobs", "list", "--json", "-q", q.name, "--offset", "2", "--limit", "3"))
    assert [j["id"] for j in page["jobs"]] == ids[2:5]
    only_a = ok_json(cli("jobs", "list", "--json", "-q", q.name, "--task", "a", "--offset", "1"))
    assert [j["id"] for j in only_a["jobs"]] == ["j3", "j5"]
    (claimed,) = q.claim("w-9", limit=1, lease_ms=60_000).jobs
    leased = ok_json(cli("jobs", "list", "--json", "-q", q.name, "--state", "leased"))
    (row,) = leased["jobs"]
    assert (row["id"], row["worker"], row["token"]) == (claimed.id, "w-9", claimed.token)
    assert 0 < row["lease_left_ms"] <= 60_000
    assert (
        ok_json(cli("jobs", "list", "--json", "-q", q.name, "--state", "scheduled"))["jobs"] == []
    )
    human = cli("jobs", "list", "-q", q.name, "--state", "leased")
    assert human.exit_code == 0 and "lease left" in human.stdout


def test_jobs_show_everything(cli: Run, q: Queue) -> None:
    job_id = q.enqueue("mail", {"to": "x@example.org"}, max_attempts=4)
    (first,) = q.claim("w-1", limit=1).jobs
    q.fail(job_id, first.token, KeyError("smtp down"), delay_ms=0)
    (second,) = q.claim("w-2", limit=1, lease_ms=45_000).jobs
    data = ok_json(cli("jobs", "show", "--json", "-q", q.name, job_id))
    assert data["payload"] == {"to": "x@example.org"} and data["payload_error"] is None
    assert (data["state"], data["attempts"], data["max_attempts"]) == ("leased", 2, 4)
    assert (data["token"], data["fence"], data["worker"]) == (second.token, second.fence, "w-2")
    assert 0 < data["lease_left_ms"] <= 45_000 and data["places"] == ["leased"]
    (err,) = data["errors"]
    assert (err["type"], err["message"], err["attempt"]) == ("KeyError", "'smtp down'", 1)
    human = cli("jobs", "show", "-q", q.name, job_id)
    assert human.exit_code == 0 and "smtp down" in human.stdout and "w-2" in human.stdout


def test_jobs_show_hand_edited_payload_is_shown_raw(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("t", {"n": 1})
    client.hset(q.keys.job(job_id), "payload", "{broken")
    data = ok_json(cli("jobs", "show", "--json", "-q", q.name, job_id))
    assert data["payload"] == "{broken" and data["payload_error"].startswith("not JSON")


def test_keys_lists_names_types_and_sizes(cli: Run, q: Queue, busy: dict[str, str]) -> None:
    data = ok_json(cli("keys", "--json", "-q", q.name))
    by_name = {k["key"]: k for k in data["keys"]}
    assert by_name[q.keys.due]["type"] == "zset" and by_name[q.keys.due]["size"] == 2
    assert by_name[q.keys.leased]["size"] == 1 and by_name[q.keys.dead]["type"] == "zset"
    fam = {f["pattern"]: f["count"] for f in data["families"]}
    # 5 jobs: a spec record each (this version's enqueue), a hash once claimed (lib/job.lua).
    assert fam[q.keys.prefix + "spec:*"] == 4 and fam[q.keys.prefix + "job:*"] == 3
    assert all(k.startswith(q.keys.prefix) for k in by_name)
    human = cli("keys", "-q", q.name)
    assert human.exit_code == 0 and f"'{q.keys.due}'" in human.stdout  # quoted for the shell


def test_workers_shows_live_ones_only(cli: Run, q: Queue, client: redis.Redis) -> None:
    now = server_now_ms(client)
    client.zadd(q.keys.workers, {"w-live": now, "w-gone": now - 60_000})
    client.hset(q.keys.worker("w-live"), mapping={
        "host": "box1", "pid": 4242, "queues": f"{q.name},other", "started_ms": now - 5_000,
        "last_heartbeat_ms": now, "in_flight": 3, "concurrency": 8,
    })  # fmt: skip
    client.pexpire(q.keys.worker("w-live"), 60_000)
    data = ok_json(cli("workers", "--json", "-q", q.name))
    (w,) = data["workers"]
    assert (w["id"], w["host"], w["pid"], w["in_flight"], w["concurrency"]) == (
        "w-live", "box1", 4242, 3, 8)  # fmt: skip
    assert w["queues"] == [q.name, "other"] and w["started_ms"] == now - 5_000
    assert data["gone"] == {q.name: ["w-gone"]}
    human = cli("workers", "-q", q.name)
    assert human.exit_code == 0 and "w-live" in human.stdout and "box1" in human.stdout
    # The hash expiring is how a dead worker drops out.
    client.delete(q.keys.worker("w-live"))
    assert ok_json(cli("workers", "--json", "-q", q.name))["workers"] == []


# -- refusals --------------------------------------------------------------------------------
READ_COMMANDS = [
    ["stats"], ["jobs", "list"], ["jobs", "show", "some-id"], ["keys"], ["workers"],
    ["dead", "list"], ["doctor"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", READ_COMMANDS, ids=" ".join)
def test_queue_name_with_braces_is_refused(
    cli: Run, q: Queue, busy: dict[str, str], client: redis.Redis, cmd: list[str]
) -> None:
    before = dump_queue(client, q)
    result = cli(*cmd, "-q", "a{b}")
    assert result.exit_code == 2 and "invalid queue name" in result.stderr
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("cmd", [["stats"], ["jobs", "list"], ["dead", "list"], ["doctor"]],
                         ids=" ".join)  # fmt: skip
def test_unknown_queue_is_refused(cli: Run, q: Queue, busy: dict[str, str], cmd: list[str]) -> None:
    result = cli(*cmd, "-q", "no-such-queue-x1")
    assert result.exit_code == 1
    assert "no queue named 'no-such-queue-x1'" in result.stderr and q.name in result.stderr


def test_unknown_job_id(cli: Run, q: Queue, busy: dict[str, str], client: redis.Redis) -> None:
    before = dump_queue(client, q)
    missing = cli("jobs", "show", "-q", q.name, "nope")
    assert missing.exit_code == 1 and "no job 'nope'" in missing.stderr
    malformed = cli("jobs", "show", "-q", q.name, "x}{y")
    assert malformed.exit_code == 2 and "invalid job id" in malformed.stderr
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("cmd", [*READ_COMMANDS, ["enqueue", "t"], ["dead", "purge", "--yes"]],
                         ids=" ".join)  # fmt: skip
def test_unreachable_redis_exits_3(cli: Run, cmd: list[str], tmp_path: Any) -> None:
    result = cli(*cmd, url=f"unix://{tmp_path}/no.sock")
    assert result.exit_code == 3 and "cannot reach Redis" in result.stderr


def test_bad_options_exit_2(cli: Run, q: Queue, busy: dict[str, str]) -> None:
    assert cli("jobs", "list", "-q", q.name, "--state", "running").exit_code == 2
    assert cli("jobs", "list", "-q", q.name, "--limit", "0").exit_code == 2
    assert cli("stats", url="nonsense://x").exit_code == 2


def test_group_help_documents_exit_codes(cli: Run) -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for line in ("0  ok", "1  findings", "2  bad usage", "3  cannot reach Redis", "4  the worker"):
        assert line in result.stdout
