"""The write commands (`enqueue`, `dead requeue | purge`) and `dead list` through CliRunner:
what they write, the confirmation, bulk work in batches, and bad input that writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import JobSpec, Queue
from scheduler.cli.main import main
from tests.conftest import dump_queue

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})  # wide tables: whole ids and messages

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], input=input, catch_exceptions=False)

    return run


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- enqueue ---------------------------------------------------------------------------------
def test_enqueue_now_prints_the_id(cli: Run, q: Queue) -> None:
    result = cli("enqueue", "mail.send", "--payload", '{"to": "a@b.c", "n": [1, 2]}', "-q", q.name)
    assert result.exit_code == 0
    job = q.get_job(result.stdout.strip())
    assert (job.task, job.payload(), job.state, job.max_attempts) == (
        "mail.send", {"to": "a@b.c", "n": [1, 2]}, "due", 5)  # fmt: skip


def test_enqueue_in_and_at(cli: Run, q: Queue) -> None:
    later = ok_json(cli("enqueue", "t", "--in", "1h30m", "--max-attempts", "2", "-q", q.name,
                        "--json"))  # fmt: skip
    job = q.get_job(later["id"])
    assert job.run_at_ms == int(job.fields["enqueued_ms"]) + 5_400_000 and job.max_attempts == 2
    at = ok_json(cli("enqueue", "t", "--at", "2031-02-03T04:05:06+01:00", "-q", q.name, "--json"))
    expected = int(datetime(2031, 2, 3, 3, 5, 6, tzinfo=UTC).timestamp() * 1000)
    assert q.get_job(at["id"]).run_at_ms == expected
    zulu = ok_json(cli("enqueue", "t", "--at", "2031-02-03T03:05:06Z", "-q", q.name, "--json"))
    assert q.get_job(zulu["id"]).run_at_ms == expected


def test_enqueue_takes_every_option_the_api_does(cli: Run, q: Queue) -> None:
    parent = q.enqueue("t", None)
    out = cli("enqueue", "t", "-q", q.name, "--job-id", "nightly-2031-01-01", "--after", parent,
              "--result-ttl", "2h", "--keep-payload", "--jitter", "1s", "--payload", '{"a": 1}',
              "--start-within", "10m")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == "nightly-2031-01-01"
    job = q.get_job("nightly-2031-01-01")
    assert job.fields["parents"] == parent  # waits for it
    [claimed] = q.claim("w", limit=5).jobs
    assert claimed.id == parent
    q.complete(parent, claimed.token)
    assert 0 <= job.run_at_ms - int(job.fields["enqueued_ms"]) <= 1_000  # type: ignore[operator]
    assert q.reschedule(job.id, delay_ms=0) in ("rescheduled", "due")  # past its jitter, now
    [child] = q.claim("w", limit=5).jobs
    assert child.id == "nightly-2031-01-01"
    q.complete(child.id, child.token, "ok")
    done = q.get_job(child.id)
    assert done.payload_json == '{"a":1}'  # --keep-payload
    assert done.fields["result_ttl_ms"] == "7200000"
    again = cli("enqueue", "t", "-q", q.name, "--job-id", "nightly-2031-01-01")
    assert again.stdout.strip() == "nightly-2031-01-01"  # the same id: nothing more written


def test_enqueue_with_a_key_is_idempotent(cli: Run, q: Queue) -> None:
    first = cli("enqueue", "t", "--key", "order-17", "-q", q.name).stdout.strip()
    again = cli("enqueue", "t", "--key", "order-17", "-q", q.name).stdout.strip()
    assert first == again and q.counts().due == 1


BAD_ENQUEUE = {
    "malformed JSON": ["--payload", "{to: 1}"],
    "NaN payload": ["--payload", '{"x": NaN}'],
    "bad duration": ["--in", "5x"],
    "negative duration": ["--in", "-5m"],
    "duration without unit": ["--in", "30"],
    "naive --at": ["--at", "2031-01-01T00:00:00"],
    "garbage --at": ["--at", "tomorrow"],
    "both --at and --in": ["--at", "2031-01-01T00:00:00Z", "--in", "5m"],
    "zero attempts": ["--max-attempts", "0"],
    "task with a space": ["--payload", "1", "--", "bad task"],
    "zero start window": ["--start-within", "0s"],
    "bad job id": ["--job-id", "a b"],
    "job id of a schedule's run": ["--job-id", "schedule:x:1"],
    "zero result ttl": ["--result-ttl", "0s"],
    "missing parent": ["--after", "no-such-job"],
    "bad jitter": ["--jitter", "soon"],
}


@pytest.mark.parametrize("case", sorted(BAD_ENQUEUE))
def test_bad_enqueue_writes_nothing(cli: Run, q: Queue, client: redis.Redis, case: str) -> None:
    q.enqueue("t", {"seed": 1})
    before = dump_queue(client, q)
    args = BAD_ENQUEUE[case]
    task = [] if "--" in args else ["t"]
    result = cli("enqueue", *task, "-q", q.name, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip(), "the error must say what is wrong"
    assert dump_queue(client, q) == before


def test_enqueue_to_a_queue_name_with_braces(cli: Run, client: redis.Redis) -> None:
    result = cli("enqueue", "t", "-q", "evil}{x")
    assert result.exit_code == 2 and "invalid queue name" in result.stderr
    assert list(client.scan_iter(match="sched:{evil*")) == []


# -- dead ------------------------------------------------------------------------------------
@pytest.fixture
def dead3(q: Queue, client: redis.Redis) -> dict[str, str]:
    """Three dead jobs: two 'x' (ValueError), one 'y' (KeyError, died two hours ago)."""
    ids = {n: q.enqueue(t, {"n": n}, max_attempts=1) for n, t in (("x1", "x"), ("x2", "x"),
                                                                     ("y1", "y"))}  # fmt: skip
    for job in q.claim("w", limit=3).jobs:
        exc = KeyError("gone") if job.task == "y" else ValueError("bad")
        assert q.fail(job.id, job.token, exc).status == "dead"
    old = int(q.get_job(ids["y1"]).fields["dead_ms"]) - 2 * 3_600_000
    client.hset(q.keys.job(ids["y1"]), "dead_ms", old)
    client.zadd(q.keys.dead, {ids["y1"]: old})  # the age filters read the dead ZSET's score
    return ids


def test_dead_list_filters(cli: Run, q: Queue, dead3: dict[str, str]) -> None:
    def listed(*args: str) -> list[str]:
        return [
            j["id"] for j in ok_json(cli("dead", "list", "--json", "-q", q.name, *args))["jobs"]
        ]

    assert sorted(listed()) == sorted(dead3.values())
    assert sorted(listed("--task", "x")) == sorted([dead3["x1"], dead3["x2"]])
    assert listed("--error-type", "KeyError") == [dead3["y1"]]
    assert listed("--older-than", "1h") == [dead3["y1"]]
    assert listed("--task", "x", "--older-than", "1h") == []
    assert listed("--id", dead3["x2"]) == [dead3["x2"]]
    row = ok_json(cli("dead", "list", "--json", "-q", q.name, "--id", dead3["x1"]))["jobs"][0]
    assert (row["dead_reason"], row["last_error_type"]) == ("attempts exhausted", "ValueError")
    # The payload is in the job's spec record (lua/lib/job.lua), not its hash: read it there.
    assert (row["payload"], row["payload_error"], row["task"]) == ({"n": "x1"}, None, "x")
    human = cli("dead", "list", "-q", q.name)
    assert human.exit_code == 0 and dead3["y1"] in human.stdout and "KeyError" in human.stdout


def test_dead_requeue_by_task(cli: Run, q: Queue, dead3: dict[str, str]) -> None:
    out = ok_json(cli("dead", "requeue", "--json", "--yes", "-q", q.name, "--task", "x"))
    assert (out["matched"], out["done"]) == (2, 2)
    assert q.get_job(dead3["x1"]).state == "due" and q.get_job(dead3["x1"]).attempts == 0
    assert q.dead_ids() == [dead3["y1"]]


def test_dead_purge_asks_first(
    cli: Run, q: Queue, dead3: dict[str, str], client: redis.Redis
) -> None:
    before = dump_queue(client, q)
    declined = cli("dead", "purge", "-q", q.name, "--error-type", "KeyError", input="n\n")
    assert declined.exit_code == 1 and "Delete for good 1 dead job(s)" in declined.output
    assert dump_queue(client, q) == before
    accepted = cli("dead", "purge", "-q", q.name, "--error-type", "KeyError", input="y\n")
    assert accepted.exit_code == 0 and "purged: 1 of 1" in accepted.stdout
    assert not client.exists(q.keys.job(dead3["y1"]))
    assert sorted(q.dead_ids()) == sorted([dead3["x1"], dead3["x2"]])


def test_dead_nothing_matching_is_not_an_error(cli: Run, q: Queue, dead3: dict[str, str]) -> None:
    out = ok_json(cli("dead", "purge", "--json", "-q", q.name, "--task", "zzz"))
    assert out["matched"] == 0 and len(q.dead_ids()) == 3


def test_dead_unknown_or_bad_id_changes_nothing(
    cli: Run, q: Queue, dead3: dict[str, str], client: redis.Redis
) -> None:
    before = dump_queue(client, q)
    unknown = cli("dead", "requeue", "--yes", "-q", q.name, "--id", dead3["x1"], "--id", "nope")
    assert unknown.exit_code == 1 and "nope" in unknown.stderr
    # Any id of valid Unicode is looked up, as the API's purge_dead does (the dead list may hold
    # ids no API would make): not on it, exit 1; one that cannot be sent, a usage error.
    odd = cli("dead", "purge", "--yes", "-q", q.name, "--id", "a{b}")
    assert odd.exit_code == 1 and "a{b}" in odd.stderr
    bad = cli("dead", "purge", "--yes", "-q", q.name, "--id", "a\udcffb")
    assert bad.exit_code == 2 and "not valid Unicode" in bad.stderr
    bad_age = cli("dead", "purge", "--yes", "-q", q.name, "--older-than", "soon")
    assert bad_age.exit_code == 2
    assert dump_queue(client, q) == before


def test_bulk_requeue_in_batches(cli: Run, q: Queue) -> None:
    ids = q.enqueue_many([JobSpec("bulk", {"i": i}, max_attempts=1) for i in range(250)])
    for job in q.claim("w", limit=250).jobs:
        q.fail(job.id, job.token, RuntimeError("x"))
    assert len(q.dead_ids()) == 250
    out = ok_json(cli("dead", "requeue", "--json", "--yes", "-q", q.name))
    assert (out["matched"], out["done"], out["skipped"]) == (250, 250, 0)
    assert q.dead_ids() == [] and q.counts().due == 250
    assert {j.id for j in q.list_jobs("due", limit=1000)} == set(ids)
