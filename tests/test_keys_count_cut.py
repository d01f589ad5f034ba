"""`scheduler keys` counts a queue's per-item keys up to a bound (--max-keys, 1,000,000 by
default): a count that stopped there says so, in the table and in --json, instead of giving
the figure as all the queue's keys."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.inspection import key_families
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.models import JobSpec
from tests.conftest import delete_queue


def _keys(redis_url: str, *args: str) -> str:
    runner = CliRunner(env={"COLUMNS": "200"})
    res = runner.invoke(main, ["keys", *args, "--url", redis_url], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_key_count_cut_at_the_bound_says_so(redis_url: str, q: Queue) -> None:
    q.enqueue_many([JobSpec("t", {"n": i}) for i in range(6)])  # 6 spec keys, plus fixed keys
    fams, cut = key_families(q.client, q.keys)
    assert not cut and fams[-1].count >= 6
    every = fams[-1].count
    fams, cut = key_families(q.client, q.keys, max_keys=every)  # exactly all: not cut
    assert not cut and fams[-1].count == every
    fams, cut = key_families(q.client, q.keys, max_keys=3)
    assert cut and fams[-1].count == 3

    data = json.loads(_keys(redis_url, "--json", "-q", q.name, "--max-keys", "3"))
    assert data["families_cut"] is True and data["max_keys"] == 3
    assert data["families"][-1]["count"] == 3
    data = json.loads(_keys(redis_url, "--json", "-q", q.name))
    assert data["families_cut"] is False and data["families"][-1]["count"] == every

    human = _keys(redis_url, "-q", q.name, "--max-keys", "3")
    assert "the count stopped at 3 keys" in human and "--max-keys" in human
    assert "counts cut short" in human
    assert "stopped" not in _keys(redis_url, "-q", q.name)


def test_partitioned_key_count_cut_says_so(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=2)
    try:
        pq.enqueue_many([JobSpec("t", {"n": i}) for i in range(20)])
        data = json.loads(_keys(redis_url, "--json", "-q", queue_name, "--max-keys", "2"))
        assert data["families_cut"] is True
        assert all(p["families_cut"] for p in data["partitions"])
        assert "the count stopped at 2 keys" in _keys(
            redis_url, "-q", queue_name, "--max-keys", "2"
        )
    finally:
        for p in pq.parts:
            delete_queue(client, p)
        client.delete(f"sched:{{{queue_name}}}:partitions")


@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_max_keys_refuses_a_bad_bound(redis_url: str, q: Queue, bad: str) -> None:
    res = CliRunner().invoke(main, ["keys", "-q", q.name, "--max-keys", bad, "--url", redis_url])
    assert res.exit_code != 0 and "--max-keys" in res.output
