"""Dead-letter retention on a partitioned queue. The fields `dead_max_age_ms` and
`dead_max_count` set by hand on the logical name's own config are read by no script (each
partition's claims and parks read their own): the doctor names each, with the per-partition
command (`config-unread`; before, only priority_aging_ms was named), which now takes an empty
partition too. set_dead_retention (sync, asyncio) checks every partition before it writes any
(`ConfigOps.check_dead_retention`): one partition whose config is of another type, or stored
by a newer version, refuses the whole change, the others unwritten (before, they took the
limits, then the call raised that one's refusal). The CLI refuses the logical name outright;
on one partition, its own refusal. On this module's private server: configs of another type
stay out of the shared one's scans."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import AsyncPartitionedQueue, connect_async
from scheduler._spawn import RedisProcess
from scheduler.admin.doctor import check_queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.errors import CorruptKey, NewerStorage
from scheduler.core.exits import EXIT_FAILED, EXIT_OK
from scheduler.core.keys import STORAGE_GENERATION, QueueKeys
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="a private single server")

RETENTION = ("dead_max_age_ms", "dead_max_count")


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
    return p


def _cli(url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    return runner.invoke(main, ["dead", "retention", *args, "--url", url])


def _unread(admin: redis.Redis, name: str) -> list[Any]:
    return [i for i in check_queue(admin, name) if i.code == "config-unread"]


def _others(admin: redis.Redis, pq: PartitionedQueue) -> list[Any]:
    """The config fields of partitions 0 and 2 (1 is the one made to refuse)."""
    return [admin.hgetall(QueueKeys(p.name).config) for p in pq.parts[::2]]


def _another_type(admin: redis.Redis, pq: PartitionedQueue) -> None:
    bad = QueueKeys(pq.parts[1].name).config
    admin.delete(bad)
    admin.set(bad, "edited")


def _newer(admin: redis.Redis, pq: PartitionedQueue) -> None:
    admin.hset(QueueKeys(pq.parts[1].name).config, "generation", STORAGE_GENERATION + 1)


# -- the doctor: each retention field on the logical name ------------------------------------


@pytest.mark.parametrize("field", RETENTION)
def test_a_retention_field_on_the_logical_name_is_named_with_its_fix(
    admin: redis.Redis, pq: PartitionedQueue, field: str
) -> None:
    cfg = QueueKeys(pq.name).config
    admin.hset(cfg, field, "5")  # by hand
    (found,) = _unread(admin, pq.parts[0].name)  # before: none
    assert found.severity == "warning" and found.queue == pq.name
    assert f"{cfg} field {field} '5' is read by no" in found.message
    first, last = pq.parts[0].name, pq.parts[-1].name
    assert found.fix.startswith(f"scheduler dead retention -q {first} ")
    assert f"{first} ... {last}" in found.fix  # every partition named, by its range
    assert f"HDEL '{cfg}' {field}" in found.fix
    assert _unread(admin, pq.parts[1].name) == []  # once per queue: its first partition
    admin.hdel(cfg, field)
    assert _unread(admin, pq.parts[0].name) == []


def test_each_field_left_on_the_logical_name_is_its_own_finding(
    admin: redis.Redis, pq: PartitionedQueue
) -> None:
    cfg = QueueKeys(pq.name).config
    admin.hset(
        cfg, mapping={"priority_aging_ms": "5000", "dead_max_age_ms": "9", "dead_max_count": "1"}
    )
    found = _unread(admin, pq.parts[0].name)
    assert [f.message.split(" field ")[1].split()[0] for f in found] == [
        "priority_aging_ms", "dead_max_age_ms", "dead_max_count",
    ]  # fmt: skip
    assert found[0].fix.startswith(f"scheduler queue priority-aging -q {pq.name} <ms>")


def test_the_fix_it_names_is_taken_by_the_partitions_and_the_logical_name_refused(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    """The CLI refuses the logical name (a --max-count there would not be the queue's); the
    command the finding names sets each partition, an empty one too (one job in 3 partitions;
    before, 'no queue named' of it)."""
    res = _cli(url, "-q", pq.name, "--max-count", "5", "--yes")
    assert res.exit_code == EXIT_FAILED and "is partitioned" in res.output
    for part in pq.parts:
        res = _cli(url, "-q", part.name, "--max-count", "5", "--yes")
        assert res.exit_code == EXIT_OK, res.output
    assert [admin.hget(p.keys.config, "dead_max_count") for p in pq.parts] == ["5"] * 3


def test_every_command_takes_an_empty_partition_its_layout_lists(
    url: str, admin: redis.Redis, pq: PartitionedQueue
) -> None:
    """cli/common.py require_queue: a partition with no keys yet is a queue its layout lists
    (`queue priority-aging -q <partition>`, `jobs list`, were 'no queue named'); a partition
    number past the layout's stays refused as a typo."""
    runner = CliRunner(env={"COLUMNS": "200", "REDIS_URL": None, "SCHEDULER_QUEUE": None})
    empty = [p.name for p in pq.parts if not admin.keys(f"sched:{{{p.name}}}:*")]
    assert empty, "one job in 3 partitions leaves an empty one"
    for args in (
        ["queue", "priority-aging", "-q", empty[0], "5000"],
        ["jobs", "list", "-q", empty[0]],
    ):
        res = runner.invoke(main, [*args, "--url", url])
        assert res.exit_code == EXIT_OK, res.output
    assert admin.hget(QueueKeys(empty[0]).config, "priority_aging_ms") == "5000"
    res = runner.invoke(main, ["jobs", "list", "-q", f"{pq.name}.p9", "--url", url])
    assert res.exit_code == EXIT_FAILED and "no queue named" in res.output


# -- set_dead_retention: every partition checked before any is written -----------------------


SPOILS = [(_another_type, CorruptKey, "not a hash"), (_newer, NewerStorage, "newer version")]


@pytest.mark.parametrize(("spoil", "error", "said"), SPOILS)
def test_the_library_call_checks_every_partition_before_it_writes(
    admin: redis.Redis, pq: PartitionedQueue, spoil: Any, error: type[Exception], said: str
) -> None:
    spoil(admin, pq)
    before = _others(admin, pq)
    with pytest.raises(error, match=said):
        pq.set_dead_retention(max_age_ms=60_000, max_count=5)
    assert _others(admin, pq) == before  # before: both took the limits
    with pytest.raises(error):
        pq.set_dead_retention()  # clearing too: nothing deleted from the others
    assert _others(admin, pq) == before


@pytest.mark.parametrize(("spoil", "error", "said"), SPOILS)
def test_the_asyncio_call_checks_every_partition_before_it_writes(
    url: str,
    admin: redis.Redis,
    pq: PartitionedQueue,
    spoil: Any,
    error: type[Exception],
    said: str,
) -> None:
    spoil(admin, pq)
    before = _others(admin, pq)

    async def main() -> None:
        client = connect_async(url)
        try:
            apq = AsyncPartitionedQueue(client, pq.layout)
            with pytest.raises(error, match=said):
                await apq.set_dead_retention(max_count=5)
        finally:
            await client.aclose()

    asyncio.run(main())
    assert _others(admin, pq) == before


def test_the_check_alone_writes_nothing_and_a_sound_queue_takes_the_limits(
    admin: redis.Redis, pq: PartitionedQueue
) -> None:
    part = pq.parts[0]
    part._run(part.ops.check_dead_retention(60_000, 5))
    assert admin.hget(part.keys.config, "dead_max_count") is None
    pq.set_dead_retention(max_age_ms=60_000, max_count=5)
    assert [admin.hmget(p.keys.config, RETENTION) for p in pq.parts] == [["60000", "5"]] * 3


@pytest.mark.parametrize(
    ("spoil", "said"), [(_another_type, "WRONGTYPE"), (_newer, "stored by a newer version")]
)
def test_the_cli_writes_no_partition_when_one_refuses(
    url: str, admin: redis.Redis, pq: PartitionedQueue, spoil: Any, said: str
) -> None:
    """The logical name refused outright (nothing written anywhere); the refusing partition on
    its own refused by name, the others untouched."""
    spoil(admin, pq)
    before = _others(admin, pq)
    res = _cli(url, "-q", pq.name, "--max-count", "5", "--yes")
    assert res.exit_code == EXIT_FAILED and "is partitioned" in res.output
    res = _cli(url, "-q", pq.parts[1].name, "--max-count", "5", "--yes")
    assert res.exit_code == EXIT_FAILED and said in res.output, res.output
    assert _others(admin, pq) == before
