"""`scheduler queue priority-aging`: `priority_aging_ms` shown and set from the CLI through
set_priority_aging (a partitioned queue's name: every partition, what its claims read), bad input
refused before anything is written; and the doctor names a field left by hand on a partitioned
queue's own name, which no claim reads (before: operators were told to `redis-cli HSET` it)."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import Queue
from scheduler.admin.doctor import check_queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.exits import EXIT_OK, EXIT_USAGE
from scheduler.core.keys import QueueKeys
from tests.conftest import delete_queue

FIELD = "priority_aging_ms"


def _cli(redis_url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    return runner.invoke(main, ["queue", "priority-aging", *args, "--url", redis_url])


def _json(redis_url: str, *args: str) -> dict[str, Any]:
    res = _cli(redis_url, *args, "--json")
    assert res.exit_code == EXIT_OK, res.output
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def _text(raw: Any) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def _ago(seconds: int) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(client, queue_name + "-p", partitions=2)
    p.enqueue("t", job_id=f"p1.{uuid.uuid4().hex}")  # the queue exists for the CLI
    yield p
    for part in p.parts:
        delete_queue(client, part)
    logical = QueueKeys(p.name)
    client.delete(logical.prefix + "partitions", logical.config)


def _aged_first(pq: PartitionedQueue) -> bool:
    """Whether partition 0's claim serves a job due for 30 s (or one left by an earlier call)
    ahead of a new priority-9 one, as an aging time under 30 s makes it (the 60 s default:
    the priority-9 job first)."""
    pq.enqueue("t", job_id=f"p0.{uuid.uuid4().hex}", run_at=_ago(30))
    high = pq.enqueue("t", job_id=f"p0.{uuid.uuid4().hex}", priority=9)
    (job,) = pq.parts[0].claim("w", limit=1).jobs
    return job.id != high


def test_set_show_and_clear_on_a_plain_queue(redis_url: str, client: redis.Redis, q: Queue) -> None:
    q.enqueue("t")
    shown = _json(redis_url, "-q", q.name)
    assert (shown[FIELD], shown["stored"], shown["changed"]) == (60_000, None, False)
    assert not client.exists(q.keys.config)  # showing writes nothing
    for given, stored in (("30000", "30000"), ("2m", "120000"), ("0", "0")):
        data = _json(redis_url, "-q", q.name, given)
        assert (data[FIELD], data["changed"]) == (int(stored), True)
        assert _text(client.hget(q.keys.config, FIELD)) == stored
    human = _cli(redis_url, "-q", q.name)
    assert human.exit_code == EXIT_OK and "run_at order, priorities ignored" in human.stdout
    assert _json(redis_url, "-q", q.name, "--default")[FIELD] == 60_000
    assert not client.hexists(q.keys.config, FIELD)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-5"], "must be 0 or more"),
        (["1.5"], "whole number of ms"),
        (["1e4"], "whole number of ms"),
        (["315360000001"], "315360000000"),  # one over 3650 days, what claim reads
        (["30000", "--default"], "not both"),
        (["--defualt"], "No such option"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    redis_url: str, client: redis.Redis, q: Queue, args: list[str], said: str
) -> None:
    q.enqueue("t")
    res = _cli(redis_url, "-q", q.name, *args)
    assert res.exit_code == EXIT_USAGE, res.output
    assert said in res.output
    assert not client.exists(q.keys.config)


def test_a_partitioned_queues_name_sets_every_partition(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    data = _json(redis_url, "-q", pq.name, "5000")
    assert [(p["queue"], p[FIELD]) for p in data["partitions"]] == [
        (part.name, 5000) for part in pq.parts
    ]
    assert [_text(client.hget(part.keys.config, FIELD)) for part in pq.parts] == ["5000"] * 2
    assert not client.exists(QueueKeys(pq.name).config)  # nothing where no claim reads
    assert _aged_first(pq)  # the claims read it


def test_a_field_on_the_logical_name_is_read_by_no_claim_and_the_doctor_names_it(
    redis_url: str, client: redis.Redis, pq: PartitionedQueue
) -> None:
    cfg = QueueKeys(pq.name).config
    client.hset(cfg, FIELD, "5000")  # by hand, as the docs once said
    assert not _aged_first(pq)  # the 60 s default applied: claims never read that hash
    found = [i for i in check_queue(client, pq.parts[0].name) if i.code == "config-unread"]
    assert len(found) == 1  # before: no finding
    assert found[0].severity == "warning" and found[0].queue == pq.name
    assert cfg in found[0].message and "'5000'" in found[0].message
    assert f"scheduler queue priority-aging -q {pq.name} <ms>" in found[0].fix
    assert f"HDEL '{cfg}' {FIELD}" in found[0].fix
    # Once per queue: with its first partition only.
    assert "config-unread" not in [i.code for i in check_queue(client, pq.parts[1].name)]
    # The fix it names: the command sets every partition and notes the field left there.
    res = _cli(redis_url, "-q", pq.name, "5000")
    assert res.exit_code == EXIT_OK and f"HDEL '{cfg}' {FIELD}" in res.stderr
    client.hdel(cfg, FIELD)
    assert "config-unread" not in [i.code for i in check_queue(client, pq.parts[0].name)]
    assert _aged_first(pq)


def test_an_unreadable_value_names_the_command(client: redis.Redis, q: Queue) -> None:
    client.hset(q.keys.config, FIELD, "30s")
    (found,) = [i for i in check_queue(client, q.name) if i.code == "config-unreadable"]
    assert found.fix.startswith(f"scheduler queue priority-aging -q {q.name} <ms>")
