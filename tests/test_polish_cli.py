"""CLI consistency: `stats --watch --interval` has a floor (each refresh reads every queue), and
`schedules add` names its durations as `enqueue` does (--every, --jitter; the -ms spellings are
kept as hidden aliases)."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core import exits
from tests.conftest import dump_queue


@pytest.mark.parametrize("interval", ["0", "0.05", "-1"])
def test_stats_watch_refuses_an_interval_under_the_floor(
    redis_url: str, q: Queue, interval: str
) -> None:
    q.enqueue("t")
    args = ["stats", "--watch", "--json", "--count", "2", "--interval", interval, "-q", q.name]
    result = CliRunner().invoke(main, [*args, "--url", redis_url])
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert result.stdout == ""  # refused before any refresh
    assert "--interval" in result.output and "0.1<=x" in result.output


def test_stats_watch_takes_the_floor(redis_url: str, q: Queue) -> None:
    args = ["stats", "--watch", "--json", "--count", "2", "--interval", "0.1", "-q", q.name]
    result = CliRunner().invoke(main, [*args, "--url", redis_url])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2


# -- schedules add: --every / --jitter as durations, like enqueue's; the -ms spellings still work
def _add(redis_url: str, q: Queue, *args: str) -> Result:
    cmd = ["schedules", "add", "s", "t", "-q", q.name, "--json", *args, "--url", redis_url]
    return CliRunner().invoke(main, cmd)


def test_schedules_add_takes_durations_and_the_old_ms_spellings(redis_url: str, q: Queue) -> None:
    created = _add(redis_url, q, "--every", "1h", "--jitter", "5m")
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["status"] == "created"
    (s,) = q.list_schedules()
    assert (s.every_ms, s.jitter_ms) == (3_600_000, 300_000)
    # An existing script's spelling defines the same schedule: nothing changes.
    again = _add(redis_url, q, "--every-ms", "3600000", "--jitter-ms", "300000")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["status"] == "unchanged"
    mixed = _add(redis_url, q, "--jitter", "300s", "--every-ms", "3600000")
    assert json.loads(mixed.stdout)["status"] == "unchanged"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--every", "1m", "--every-ms", "60000"], "give --every or --every-ms, not both"),
        (["--every-ms", "60000", "--every", "1m"], "give --every or --every-ms, not both"),
        (["--every", "1m", "--jitter-ms", "5", "--jitter", "5s"], "--jitter or --jitter-ms"),
        (["--every", "0s"], "at least 1ms"),
        (["--every-ms", "0"], "at least 1ms"),
        (["--every", "soon"], "invalid duration"),
        (["--every", "1m", "--jitter", "-5s"], "negative"),
        ([], "give --cron or --every"),
    ],
)
def test_schedules_add_refuses_both_spellings_and_bad_durations(
    redis_url: str, q: Queue, client: redis.Redis, args: list[str], message: str
) -> None:
    result = _add(redis_url, q, *args)
    assert result.exit_code == exits.EXIT_USAGE, result.output
    assert message in result.output
    assert dump_queue(client, q) == {}  # nothing written


def test_schedules_add_help_names_the_durations() -> None:
    text = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["schedules", "add", "--help"]).output
    assert "--every DURATION" in text and "--jitter DURATION" in text
    assert "--every-ms N: the same in ms" in text
