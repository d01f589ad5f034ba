"""CLI consistency: `stats --watch --interval` has a floor (each refresh reads every queue)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core import exits


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
