"""The CLI speaks one language (issue 14): one exit-code table for every command, an unknown
queue refused alike everywhere, one --json shape, tables readable at 80 columns, one default
URL, and the new write options (`schedules add`, `enqueue --timeout-ms / --backoff`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.common import DEFAULT_URL
from scheduler.cli.main import main
from scheduler.core import exits
from tests.conftest import dump_queue

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "80"})

    def run(*args: str, url: str = redis_url, input: str | None = None) -> Result:
        return runner.invoke(main, [*args, "--url", url], input=input, catch_exceptions=False)

    return run


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- one exit-code table ---------------------------------------------------------------------
def test_worker_and_cli_share_one_table() -> None:
    from scheduler import worker
    from scheduler.cli import common

    assert common.EXIT_FORBIDDEN == worker.EXIT_REDIS_REFUSED == exits.EXIT_FORBIDDEN
    assert common.EXIT_UNREACHABLE == worker.EXIT_REDIS == 3
    assert worker.EXIT_IMPORT == 4 and worker.EXIT_USAGE == common.EXIT_USAGE == 2
    codes = [c for c, _ in exits.EXIT_CODES]
    assert len(codes) == len(set(codes))


def test_help_shows_the_table() -> None:
    text = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["--help"]).stdout
    for code, meaning in exits.EXIT_CODES:
        assert " ".join(f"{code} {meaning}".split()) in " ".join(text.split())


QUEUE_COMMANDS = [
    ["stats"], ["jobs", "list"], ["workers"], ["dead", "list"], ["dead", "requeue", "--yes"],
    ["dead", "purge", "--yes"], ["doctor"], ["schedules", "list"], ["schedules", "pause", "s"],
    ["schedules", "resume", "s"], ["schedules", "remove", "s"], ["jobs", "show", "some-id"],
    ["jobs", "reschedule", "some-id", "--now"],
]  # fmt: skip
EVERY_COMMAND = [
    *QUEUE_COMMANDS, ["keys"], ["enqueue", "t"],
    ["schedules", "add", "s", "t", "--every-ms", "1000"],
    ["worker", "tests.workers.basic:registry"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", EVERY_COMMAND, ids=" ".join)
def test_unreachable_redis_is_3_everywhere(cli: Run, cmd: list[str], tmp_path: Path) -> None:
    result = cli(*cmd, url=f"unix://{tmp_path}/no.sock")
    assert result.exit_code == exits.EXIT_UNREACHABLE, result.output
    assert "cannot reach Redis" in result.output


@pytest.mark.parametrize("cmd", EVERY_COMMAND, ids=" ".join)
def test_bad_queue_name_is_2_everywhere(
    cli: Run, q: Queue, client: redis.Redis, cmd: list[str]
) -> None:
    q.enqueue("t", {"seed": 1})
    before = dump_queue(client, q)
    result = cli(*cmd, "-q", "a{b}")
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert "invalid queue name" in result.output
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("cmd", QUEUE_COMMANDS, ids=" ".join)
def test_unknown_queue_is_1_everywhere(cli: Run, q: Queue, cmd: list[str]) -> None:
    q.enqueue("t", {"seed": 1})
    result = cli(*cmd, "-q", "no-such-queue-x2")
    assert result.exit_code == exits.EXIT_FAILED, result.output
    assert "no queue named 'no-such-queue-x2'" in result.stderr and q.name in result.stderr


def test_worker_registry_not_importable_is_4(cli: Run) -> None:
    result = cli("worker", "no_such_module:registry")
    assert result.exit_code == exits.EXIT_IMPORT and "cannot import" in result.output


def test_schedule_missing_is_1(cli: Run, q: Queue) -> None:
    q.enqueue("t", {"seed": 1})
    result = cli("schedules", "pause", "nope", "-q", q.name)
    assert result.exit_code == exits.EXIT_FAILED and "missing" in result.output


# -- one --json shape ------------------------------------------------------------------------
def test_every_json_is_one_indented_object(cli: Run, q: Queue) -> None:
    job_id = q.enqueue("t", {"n": 1})
    q.schedule("nightly", "report", {"day": [1, 2]}, cron="0 3 * * *")
    commands = {
        ("stats",): "queues", ("jobs", "list"): "jobs", ("jobs", "show", job_id): "id",
        ("workers",): "workers", ("keys",): "keys", ("dead", "list"): "jobs",
        ("dead", "purge", "--yes"): "matched", ("doctor", "--no-server"): "findings",
        ("schedules", "list"): "schedules", ("enqueue", "t"): "id",
        ("schedules", "pause", "nightly"): "status",
    }  # fmt: skip
    for cmd, key in commands.items():
        result = cli(*cmd, "-q", q.name, "--json")
        data = ok_json(result)
        assert isinstance(data, dict) and key in data, cmd
        assert result.stdout.startswith("{\n  "), cmd  # indented, not compact
    listed = ok_json(cli("schedules", "list", "-q", q.name, "--json"))
    assert listed["queue"] == q.name
    (s,) = listed["schedules"]
    assert s["name"] == "nightly" and s["payload"] == {"day": [1, 2]}  # a value, not a string


# -- tables at 80 columns and in a pipe ------------------------------------------------------
def test_dead_list_at_80_columns_keeps_ids_whole(cli: Run, q: Queue) -> None:
    ids = [
        q.enqueue("mail.receipt", {"n": i}, max_attempts=1, job_id=f"order-{i:04d}-{'7f3a' * 7}")
        for i in range(3)
    ]
    for job in q.claim("w", limit=3).jobs:
        error = ValueError("the mail server refused the recipient address: mailbox unavailable")
        q.fail(job.id, job.token, error)
    out = cli("dead", "list", "-q", q.name).stdout
    assert all(i in out for i in ids), out
    words = out.split()
    assert {"unavailable", "exhausted", "mail.receipt"} <= set(words)  # never folded mid-word
    assert max(len(line) for line in out.splitlines()) <= 80


# -- one default URL -------------------------------------------------------------------------
def test_one_default_url_everywhere() -> None:
    assert DEFAULT_URL == "redis://localhost:6379/0"
    for cmd in (["stats"], ["worker"], ["schedules", "list"], ["enqueue"]):
        text = CliRunner(env={"COLUMNS": "200"}).invoke(main, [*cmd, "--help"]).stdout
        assert DEFAULT_URL in text, cmd


def test_worker_takes_max_abandoned_threads(cli: Run) -> None:
    bad = cli("worker", "tests.workers.basic:registry", "--max-abandoned-threads", "0")
    assert bad.exit_code == exits.EXIT_USAGE and "max_abandoned_threads" in bad.output


# -- readable `jobs show`, and the new write options ----------------------------------------
def test_jobs_show_dead_job_has_no_relative_run_time(cli: Run, q: Queue) -> None:
    job_id = q.enqueue("t", {"n": 1}, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(job.id, job.token, ValueError("x"))
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in cli("jobs", "show", "-q", q.name, job_id).stdout.splitlines()
        if line.count("│") >= 3 and line.split("│")[1].strip()
    }
    assert "run in" not in rows and "late by" not in rows and "run_in_ms" not in rows
    assert rows["run_at"].endswith("+00:00") and rows["run_at_ms"].isdigit()


def test_schedules_add_creates_and_refuses_bad_input(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    created = ok_json(cli("schedules", "add", "nightly", "report", "--cron", "0 3 * * *",
                          "--payload", '{"a": 1}', "--backoff", "500,3,60000,0",
                          "--timeout-ms", "9000", "-q", q.name, "--json"))  # fmt: skip
    assert created["status"] == "created"
    (s,) = q.list_schedules()
    assert (s.name, s.task, s.cron) == ("nightly", "report", "0 3 * * *")
    assert json.loads(s.payload_json) == {"a": 1}
    before = dump_queue(client, q)
    for bad in (
        ["--cron", "61 * * * *"],
        [],
        ["--cron", "* * * * *", "--every-ms", "5"],
        ["--every-ms", "1000", "--backoff", "1,2"],
        ["--every-ms", "1000", "--payload", "{"],
    ):
        result = cli("schedules", "add", "other", "t", *bad, "-q", q.name)
        assert result.exit_code == exits.EXIT_USAGE, (bad, result.output)
    assert dump_queue(client, q) == before


def test_enqueue_timeout_and_backoff(cli: Run, q: Queue, client: redis.Redis) -> None:
    job_id = cli("enqueue", "t", "--timeout-ms", "1500", "--backoff", "250,2,10000,0.5",
                 "-q", q.name).stdout.strip()  # fmt: skip
    fields = q.get_job(job_id).fields
    assert fields["timeout_ms"] == "1500" and "250" in fields.get("backoff", "")
    before = dump_queue(client, q)
    for bad in (["--backoff", "x,2,3,0"], ["--backoff", "1,0.5,3,0"], ["--timeout-ms", "-1"]):
        assert cli("enqueue", "t", *bad, "-q", q.name).exit_code == exits.EXIT_USAGE, bad
    assert dump_queue(client, q) == before


def test_cron_errors_name_the_field_and_tell_never_fires_apart(cli: Run, q: Queue) -> None:
    def add(cron: str) -> Result:
        return cli("schedules", "add", "s", "t", "--cron", cron, "-q", q.name)

    out_of_range = add("61 * * * *")
    assert out_of_range.exit_code == exits.EXIT_USAGE
    assert "minute field: 61 is out of range 0-59" in out_of_range.stderr
    assert "day-of-month field: 32" in add("0 9 32 * *").stderr
    never = add("0 9 30 2 *")
    assert never.exit_code == exits.EXIT_USAGE and "never fires" in never.stderr
    malformed = add("0 9 * * * * *")
    assert malformed.exit_code == exits.EXIT_USAGE and "never fires" not in malformed.stderr


def test_schedules_list_shows_a_cron_next_run_in_its_own_time_zone_too(cli: Run, q: Queue) -> None:
    q.schedule("morning", "report", cron="0 9 * * *", tz="Europe/Berlin")
    q.schedule("tick", "report", every_ms=60_000)
    out = cli("schedules", "list", "-q", q.name)
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stdout.splitlines() if x.startswith("morning"))
    assert re.search(r"next \S+\+00:00 \(\S+T09:00:00\+0[12]:00 Europe/Berlin\)", line), line
    tick = next(x for x in out.stdout.splitlines() if x.startswith("tick"))
    assert "(" not in tick.split("next", 1)[1]  # UTC / every_ms: one time is enough


def test_a_death_by_signal_is_explained_beside_the_table() -> None:
    """A worker killed by a signal no handler could take (SIGTERM in its first ~0.6 s or after
    it stopped: 143; SIGKILL: 137) exits 128+N, a code the table did not explain: the help,
    README and docs/security.md say what it means for its jobs."""
    root = Path(__file__).resolve().parent.parent
    help_text = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["--help"]).stdout
    for text in (
        help_text,
        (root / "README.md").read_text(encoding="utf-8"),
        (root / "docs" / "security.md").read_text(encoding="utf-8"),
    ):
        assert " ".join(exits.SIGNAL_NOTE.split()) in " ".join(text.split())
