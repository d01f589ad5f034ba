"""Start-up checks in the worker and the CLI: Redis settings that can lose jobs give a warning,
or a refusal with --strict, before anything is written."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from scheduler.admin.redis_cli import connection_flags
from scheduler.cli.main import main
from tests.redis_server import RedisProcess, require_binary


@pytest.fixture(scope="module")
def volatile_url() -> Iterator[str]:
    """A server that keeps nothing on disk (persistence off) and may evict keys."""
    binary = require_binary("redis-server", "a server with unsafe settings")
    server = RedisProcess(binary, ["--maxmemory-policy", "allkeys-lru"]).start()
    try:
        yield server.url
    finally:
        server.cleanup()


def test_strict_worker_refuses_a_server_that_can_lose_jobs(volatile_url: str) -> None:
    res = CliRunner().invoke(
        main, ["worker", "tests.workers.basic:registry", "--url", volatile_url, "--strict"]
    )
    assert res.exit_code == 1, res.output  # a refusal, as with enqueue --strict (issue 14)
    assert "maxmemory-policy" in res.output and "persistence" in res.output


def test_strict_enqueue_refuses_and_writes_nothing(volatile_url: str) -> None:
    res = CliRunner().invoke(main, ["enqueue", "t", "--url", volatile_url, "-q", "strictq",
                                    "--strict"])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "noeviction" in res.output
    client = redis.Redis.from_url(volatile_url)
    assert client.keys("sched:{strictq}:*") == []


def test_enqueue_warns_but_accepts_without_strict(volatile_url: str) -> None:
    res = CliRunner().invoke(main, ["enqueue", "t", "--url", volatile_url, "-q", "warnq"])
    assert res.exit_code == 0, res.output
    assert "warning:" in res.output and "maxmemory-policy" in res.output
    # A settings finding, not a Redis failure: labelled so (issue 14), each finding once.
    assert "redis error" not in res.output and "server settings (error)" in res.output
    assert res.output.count("[persistence-off]") == 1
    client = redis.Redis.from_url(volatile_url, decode_responses=True)
    assert client.zcard("sched:{warnq}:due") == 1


def test_doctor_and_startup_share_one_judgement_of_unseen_snapshots() -> None:
    """With CONFIG refused, AOF off does not prove persistence off (RDB may be on): every user of
    health.check_server (doctor, worker, CLI) gets a warning, not an error."""
    from scheduler.admin.health import check_server

    info = {"redis_version": "7.0.15", "aof_enabled": 0, "maxmemory_policy": "noeviction"}
    assert [(f.code, f.severity) for f in check_server(info, {})] == [
        ("persistence-unknown", "warning")
    ]
    assert [f.code for f in check_server(info, {"save": ""})] == ["persistence-off"]


def test_worker_and_stats_show_the_settings_finding_once_not_as_a_redis_error(
    volatile_url: str,
) -> None:
    """The persistence warning once per process (issue 14): the worker logs each finding once at
    start, labelled as a settings finding; `stats`, plain or watching, repeats none of it."""
    cmd = [sys.executable, "-c", "from scheduler.cli.main import main; main()", "worker",
           "scheduler.cli.demo_tasks:registry", "--url", volatile_url, "-q", "warnw"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the start-up check runs before the start line
            lines.append(line)
            if " started: " in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert text.count("[persistence-off]") == 1 and text.count("[eviction-policy]") == 1, text
    assert "redis error" not in text.lower() and "server settings (error)" in text
    # Its fix names the worker's server (a unix socket here), not the default local one.
    flags = " ".join(connection_flags(volatile_url))
    assert flags and f"fix: redis-cli {flags} CONFIG SET" in text, text
    runner = CliRunner()
    for args in (["stats"], ["stats", "--watch", "--count", "3", "--interval", "0.1"]):
        res = runner.invoke(main, [*args, "--url", volatile_url])
        assert res.exit_code == 0, res.output
        assert "[persistence-off]" not in res.output and "redis error" not in res.output.lower()
