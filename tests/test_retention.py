"""Retention of finished jobs is decided where they finish: the task's default, else the
worker's option, else 1 h. A producer's Queue(result_ttl_ms=...) does not govern it."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.exits import EXIT_USAGE
from scheduler.worker import WorkerSettings
from scheduler.worker.registry import Registry
from scheduler.worker.settings import SettingsError
from tests.embedded_worker import worker_thread
from tests.workers.procs import wait_for

registry = Registry()


@registry.task("plain")
def plain(payload: Any, ctx: Any) -> str:
    return "ok"


# 30 s, not less: the worker stops before the test reads the job (a 5 s TTL expired first under
# CI load); still half the worker option below, so the task default is what decided it.
@registry.task("brief", result_ttl_ms=30_000)
def brief(payload: Any, ctx: Any) -> str:
    return "ok"


def finished_pttl_ms(redis_url: str, q: Queue, client: redis.Redis, task: str,
                     settings: WorkerSettings) -> int:  # fmt: skip
    job_id = q.enqueue(task, {})
    with worker_thread(redis_url, registry, settings):
        wait_for(lambda: q.status(job_id) == "done", what=f"{task} done")
    assert q.get_job(job_id).result_json == '"ok"'
    return int(client.pttl(q.keys.job(job_id)))


def test_the_worker_option_sets_the_ttl_of_what_it_completes(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    # The producer asks for a day: that is not what decides it.
    producer = Queue(client, q.name, result_ttl_ms=86_400_000)
    ttl = finished_pttl_ms(redis_url, producer, client, "plain",
                           WorkerSettings(queues=(q.name,), result_ttl_ms=60_000))  # fmt: skip
    assert 0 < ttl <= 60_000


def test_without_an_option_the_default_is_one_hour(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    ttl = finished_pttl_ms(redis_url, q, client, "plain", WorkerSettings(queues=(q.name,)))
    assert 60_000 < ttl <= codec.RESULT_TTL_MS


def test_the_task_default_wins_over_the_worker_option(
    redis_url: str, q: Queue, client: redis.Redis
) -> None:
    ttl = finished_pttl_ms(redis_url, q, client, "brief",
                           WorkerSettings(queues=(q.name,), result_ttl_ms=60_000))  # fmt: skip
    assert 0 < ttl <= 30_000


@pytest.mark.parametrize("bad", [0, -1, codec.LIMITS["result_ttl_ms"][1] + 1, 1.5, True])
def test_a_retention_outside_the_limits_is_refused(bad: Any) -> None:
    with pytest.raises(SettingsError, match="result_ttl_ms"):
        WorkerSettings(result_ttl_ms=bad).check()
    r = Registry()
    with pytest.raises(BadArgument, match="result_ttl_ms"):
        r.task("t", result_ttl_ms=bad)
    assert r.names() == []


def test_the_cli_flag_is_checked_before_anything_starts() -> None:
    out = CliRunner().invoke(main, ["worker", "tests.test_retention:registry",
                                    "--result-ttl-ms", "0"])  # fmt: skip
    assert out.exit_code == EXIT_USAGE, out.output
    assert "result_ttl_ms" in out.output
