"""`scheduler queue priority-aging` on a partitioned queue one partition of which has a config
of another type (edited by hand): every partition is checked before any is written
(`ConfigOps.check_priority_aging`), so the refusal names that partition and nothing is written;
a write refused midway all the same names the partitions that hold the value. Before, every
other partition took the value and the command exited 1 with that partition's 'nothing
written' as the whole story. On this module's private server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import AsyncPartitionedQueue, Queue, connect_async
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.errors import CorruptKey
from scheduler.core.exits import EXIT_FAILED
from scheduler.core.keys import QueueKeys
from scheduler.operations.queue_config import AGING_FIELD, ConfigOps
from scheduler.operations.requests import Commands, Op
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")


@pytest.fixture
def url(module_server: RedisProcess) -> str:
    return module_server.url


@pytest.fixture
def admin(url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def pq(admin: redis.Redis, queue_name: str) -> PartitionedQueue:
    p = PartitionedQueue.create(admin, queue_name, partitions=3)
    p.enqueue("t")  # the queue exists for the CLI
    bad = QueueKeys(p.parts[1].name).config
    admin.delete(bad)
    admin.set(bad, "edited")
    return p


def _cli(url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    return runner.invoke(main, ["queue", "priority-aging", *args, "--url", url])


def _stored(admin: redis.Redis, pq: PartitionedQueue) -> list[Any]:
    return [admin.hget(QueueKeys(p.name).config, AGING_FIELD) for p in pq.parts[::2]]


def test_a_partition_of_another_type_refuses_the_whole_change_by_name(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    res = _cli(url, "-q", pq.name, "5")
    assert (res.exit_code, _stored(admin, pq)) == (EXIT_FAILED, [None, None]), res.output
    assert f"nothing written to any of the 3 partitions: partition {pq.parts[1].name}:" in (
        res.output
    )
    assert "scheduler doctor" in res.output and pq.parts[0].name not in res.output


def test_a_write_refused_midway_names_the_partitions_holding_the_value(
    url: str, admin: redis.Redis, pq: PartitionedQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config changed type between the check and the write: here, no check at all."""

    def passes(self: ConfigOps, priority_aging_ms: int | None) -> Op[None]:
        yield Commands([("EXISTS", self.keys.config)])  # a read, no refusal

    monkeypatch.setattr(ConfigOps, "check_priority_aging", passes)
    res = _cli(url, "-q", pq.name, "5")
    assert (res.exit_code, _stored(admin, pq)) == (EXIT_FAILED, ["5", "5"]), res.output
    held = f"{pq.parts[0].name}, {pq.parts[2].name} (of 3); then refused:"
    assert f"partitions holding the new priority aging: {held}" in res.output


def test_the_check_alone_writes_nothing(admin: redis.Redis, pq: PartitionedQueue) -> None:
    good, bad = pq.parts[0], Queue(admin, pq.parts[1].name)
    good._run(good.ops.check_priority_aging(5))
    with pytest.raises(CorruptKey, match="nothing written"):
        bad._run(bad.ops.check_priority_aging(5))
    assert _stored(admin, pq) == [None, None]


def test_the_library_call_checks_every_partition_before_it_writes(
    admin: redis.Redis, pq: PartitionedQueue
) -> None:
    """PartitionedQueue.set_priority_aging (the CLI's path too): a partition of another type
    refuses the whole change, the others not written."""
    with pytest.raises(CorruptKey, match="nothing written"):
        pq.set_priority_aging(5)
    assert _stored(admin, pq) == [None, None]


def test_the_asyncio_call_checks_every_partition_before_it_writes(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    async def main() -> None:
        client = connect_async(url)
        try:
            apq = AsyncPartitionedQueue(client, pq.layout)
            with pytest.raises(CorruptKey, match="nothing written"):
                await apq.set_priority_aging(5)
        finally:
            await client.aclose()

    asyncio.run(main())
    assert _stored(admin, pq) == [None, None]
