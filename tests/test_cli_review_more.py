"""The operator CLI review, beyond tests/test_cli_review.py: the reviewer's unconfirmed findings
(an unparsable `demo --url`, Ctrl-C on `stats --watch`) and the edges of the fixes (every place
of the wrong type is a doctor finding, a stored record that is not a string, the worker's
setting ranges, a stats row with an error)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core import exits
from scheduler.core.errors import BadArgument, UnreadableRecord
from scheduler.core.partitions import Layout
from scheduler.worker import SettingsError, WorkerSettings

Run = Callable[..., Result]
SCHEDULER = str(Path(sys.executable).parent / "scheduler")


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url])

    return run


def test_demo_refuses_a_url_redis_py_cannot_parse_as_usage() -> None:
    url = "redis://default:pw-More-3@127.0.0.1:notaport/0"
    result = CliRunner().invoke(main, ["demo", "--url", url])
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert "pw-More-3" not in result.output and "invalid --url" in result.output
    assert not isinstance(result.exception, ValueError)  # no traceback: a usage error


def test_ctrl_c_ends_stats_watch_cleanly(redis_url: str, q: Queue) -> None:
    q.enqueue("t")
    # faulthandler: a process that does not end is sent SIGABRT below, and its stack shows
    # where it hung. It showed the watch sleeping on, the SIGINT ignored: a suite started in
    # the background by a shell (`make test &`) inherits SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored, as it should. The child gets the default back, as a terminal's.
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        [SCHEDULER, "stats", "--watch", "--json", "--interval", "0.1", "-q", q.name,
         "--url", redis_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline())["queues"]
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"no end 30 s after SIGINT; its stack:\n{err[-4000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # a failure left them open: ResourceWarnings
            if pipe is not None:
                pipe.close()
    assert proc.returncode == exits.EXIT_OK and "Aborted" not in err, err


@pytest.mark.parametrize("place", ["due", "leased", "dead", "flow_held"])
def test_doctor_reports_every_place_of_another_type(
    cli: Run, q: Queue, client: redis.Redis, place: str
) -> None:
    q.enqueue("t")
    key = getattr(q.keys, place)
    client.delete(key)
    client.set(key, "hand-written")
    result = cli("doctor", "--no-server", "--json", "-q", q.name)
    findings = json.loads(result.stdout)["findings"]
    assert any(f["code"] == "wrong-type" and key in f["message"] for f in findings), findings
    assert result.exit_code == exits.EXIT_FAILED


def test_a_partition_record_of_another_type_is_a_doctor_finding(
    cli: Run, client: redis.Redis, queue_name: str
) -> None:
    key = f"sched:{{{queue_name}}}:partitions"
    client.hset(key, "a", "b")
    try:
        result = cli("doctor", "--no-server", "--json", "-q", queue_name)
        stats = cli("stats", "--json", "-q", queue_name)
    finally:
        client.delete(key)
    codes = [f["code"] for f in json.loads(result.stdout)["findings"]]
    assert codes == ["unreadable-layout"] and result.exit_code == exits.EXIT_FAILED
    (row,) = json.loads(stats.stdout)["queues"]
    assert "WRONGTYPE" in row["error"] and stats.exit_code == exits.EXIT_FAILED


def test_stats_rows_say_error_null_when_readable(cli: Run, q: Queue) -> None:
    q.enqueue("t")
    result = cli("stats", "--json", "-q", q.name)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["queues"]
    assert row["error"] is None and row["due"] == 1


def test_keys_of_a_plain_queue_has_no_partitions(cli: Run, q: Queue) -> None:
    q.enqueue("t")
    data = json.loads(cli("keys", "--json", "-q", q.name).stdout)
    assert data["partitions"] is None and data["exists"] is True


@pytest.mark.parametrize("record", ["1|²|a", "1|1|a{b}", "2|1|a", "1|2|a"])
def test_an_unreadable_partition_record_is_unreadable_record(record: str) -> None:
    with pytest.raises(UnreadableRecord):
        Layout.parse("q", record)
    assert issubclass(UnreadableRecord, BadArgument)  # what callers caught before


@pytest.mark.parametrize(
    "change",
    [{"lease_ms": 86_400_001, "heartbeat_ms": 5_000}, {"reap_limit": 10_001},
     {"reap_limit": -1}, {"grace_s": float("nan")}, {"grace_s": float("inf")},
     {"grace_s": 86_401.0}],
    ids=str,
)  # fmt: skip
def test_worker_settings_out_of_their_ranges_are_refused(change: dict[str, float]) -> None:
    with pytest.raises(SettingsError):
        WorkerSettings(**change).check()  # type: ignore[arg-type]
    WorkerSettings(lease_ms=86_400_000, grace_s=86_400.0, reap_limit=10_000).check()


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/abc", "http://x", "redis://127.0.0.1:6379/0?ssl_ca_certs=/n"]
)
def test_a_bad_url_is_named_once_in_its_usage_error(url: str) -> None:
    """The connection's refusal already names the URL ('invalid Redis URL <url>: why'): the CLI
    printed it twice ('invalid --url <url>: invalid Redis URL <url>: why')."""
    result = CliRunner().invoke(main, ["stats", "--url", url])
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert result.output.count(url) == 1, result.output
    assert "invalid --url" in result.output
