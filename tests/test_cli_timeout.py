"""`scheduler enqueue --timeout 30s` (issue 14's CLI list): the run time limit as a duration, like
`--in`; `--timeout-ms` still takes milliseconds; both at once, or a bad duration, is a usage error
and writes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.exits import EXIT_OK, EXIT_USAGE

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url])

    return run


@pytest.mark.parametrize(
    ("args", "timeout_ms"),
    [(("--timeout", "30s"), 30_000), (("--timeout", "1h30m"), 5_400_000),
     (("--timeout-ms", "1500"), 1500), ((), 0)],
)  # fmt: skip
def test_enqueue_timeout_as_a_duration_or_in_ms(
    cli: Run, q: Queue, args: tuple[str, ...], timeout_ms: int
) -> None:
    res = cli("enqueue", "t", "-q", q.name, *args)
    assert res.exit_code == EXIT_OK, res.output
    assert q.get_job(res.stdout.strip()).fields.get("timeout_ms", "0") == str(timeout_ms)


@pytest.mark.parametrize(
    "args",
    [("--timeout", "1m", "--timeout-ms", "5"), ("--timeout-ms", "5", "--timeout", "1m"),
     ("--timeout", "soon"), ("--timeout", "-5s")],
)  # fmt: skip
def test_enqueue_bad_timeout_is_usage_and_writes_nothing(
    cli: Run, q: Queue, client: redis.Redis, args: tuple[str, ...]
) -> None:
    res = cli("enqueue", "t", "-q", q.name, *args)
    assert res.exit_code == EXIT_USAGE, res.output
    assert list(client.scan_iter(match=q.keys.pattern())) == []


def test_schedules_add_takes_the_same_timeout(cli: Run, q: Queue, client: redis.Redis) -> None:
    res = cli("schedules", "add", "s", "t", "-q", q.name, "--every-ms", "60000", "--timeout", "2m")
    assert res.exit_code == EXIT_OK, res.output
    (job_id,) = client.zrange(q.keys.due, 0, -1)
    assert q.get_job(str(job_id)).fields.get("timeout_ms") == "120000"
