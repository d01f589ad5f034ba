"""What tests/test_review_operator_docs.py's fixes leave unpinned: a partitioned queue's name
still passes `jobs show` / `jobs reschedule`'s unknown-queue check, the worker and the demo
say one line (exit 3) at a --url that is not a Redis, `keys` counts a cron schedule's slots
ZSET as its own family, and a held job waiting for one parent reads "1 job"."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import exits
from tests.conftest import delete_queue
from tests.fixtures.not_redis import http_listener

Run = Callable[..., Result]


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})

    def run(*args: str, at: str | None = None) -> Result:
        return runner.invoke(main, [*args, "--url", at or redis_url])

    return run


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(client, queue_name + "-p", partitions=2)
    yield p
    for part in p.parts:
        delete_queue(client, part)
    client.delete(f"sched:{{{p.name}}}:partitions")


def test_show_and_reschedule_take_a_partitioned_queues_name(cli: Run, pq: PartitionedQueue) -> None:
    job = pq.enqueue("t", None, delay_ms=3_600_000)
    shown = cli("jobs", "show", "--json", "-q", pq.name, job)
    assert shown.exit_code == 0 and json.loads(shown.stdout)["id"] == job, shown.output
    moved = cli("jobs", "reschedule", "-q", pq.name, job, "--now")
    assert moved.exit_code == 0 and f"{job}: rescheduled" in moved.stdout, moved.output


@pytest.fixture
def not_redis() -> Iterator[str]:
    """An HTTP answer on the port (a URL typed with the wrong port); the URL has a password."""
    with http_listener() as port:
        yield f"redis://u:pw-NotRedis-7@127.0.0.1:{port}/0"


@pytest.mark.parametrize(
    "cmd", [["worker", "tests.workers.basic:registry"], ["demo"], ["stats"]], ids=" ".join
)
def test_a_url_that_is_not_redis_says_so(cli: Run, not_redis: str, cmd: list[str]) -> None:
    res = cli(*cmd, at=not_redis)
    assert res.exit_code == exits.EXIT_UNREACHABLE, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "did not answer as a Redis server" in lines[0], res.output
    assert "cannot reach Redis" in lines[0] and "pw-NotRedis-7" not in res.output


def test_keys_counts_a_cron_schedules_slots_on_their_own(cli: Run, q: Queue) -> None:
    q.schedule("nightly", "report.build", {}, cron="0 9 * * *")
    q.schedule("tick", "t.tick", {}, every_ms=3_600_000)
    res = cli("keys", "-q", q.name, "--json")
    assert res.exit_code == 0, res.output
    fams = {f["pattern"]: f for f in json.loads(res.stdout)["families"]}
    slots = fams[q.keys.schedule_slots("*")]
    assert slots["count"] == 1 and slots["about"].startswith("ZSET"), slots
    assert fams[q.keys.prefix + "schedule:*"]["count"] == 2


def test_a_job_waiting_for_one_parent_reads_one_job(cli: Run, q: Queue) -> None:
    parent = q.enqueue("t", None, delay_ms=3_600_000)
    child = q.enqueue("t", None, after=[parent])
    two = q.enqueue("t", None, after=[parent, q.enqueue("t", None, delay_ms=3_600_000)])
    listed = cli("jobs", "list", "--state", "held", "-q", q.name)
    assert listed.exit_code == 0, listed.output
    assert "held: waiting for 1 job" in listed.stdout and "1 jobs" not in listed.stdout
    assert "held: waiting for 2 jobs" in listed.stdout
    shown = cli("jobs", "show", "-q", q.name, child)
    assert "waiting for 1 job" in shown.stdout and "1 jobs" not in shown.stdout, shown.output
    # --json keeps the stored words (lib/flow.lua, docs/flow-control.md)
    data = json.loads(cli("jobs", "show", "--json", "-q", q.name, child).stdout)
    assert data["flow"] == "waiting for 1 jobs"
    assert json.loads(cli("jobs", "show", "--json", "-q", q.name, two).stdout)["flow"] == (
        "waiting for 2 jobs"
    )
