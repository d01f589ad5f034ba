"""A partitioned queue's settings (set_dead_retention, set_priority_aging, sync and asyncio)
go through pause's "check every partition, then write" (partitioned_change.checked_change_sync):
a partition whose check does not answer is left out of the write and named by
PartitionsNotReached, the others took it. Before, the setters ignored their checks' answers and
wrote every partition, so a partition whose check did not answer was written unchecked and the
call returned as if every partition had been checked. The partition not answering is injected:
its check reads once, then raises a ConnectionError (a node lost midway). On the run's server,
a single one or a cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from scheduler import AsyncPartitionedQueue, PartitionsNotReached, connect_async
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.errors import CorruptKey
from scheduler.core.keys import QueueKeys
from scheduler.operations.queue_config import AGING_FIELD, ConfigOps
from scheduler.operations.requests import Commands, Op

Check = Callable[..., Op[None]]


@pytest.fixture
def pq(client: redis.Redis, queue_name: str) -> Iterator[PartitionedQueue]:
    p = PartitionedQueue.create(client, queue_name, partitions=3)
    yield p
    for part in p.parts:
        client.delete(QueueKeys(part.name).config)


def _not_answering(
    monkeypatch: pytest.MonkeyPatch, name: str, down: str, refusing: str = ""
) -> None:
    """ConfigOps.`name` (a check) of partition `down` reads once, then its node does not
    answer; that of `refusing` refuses (its config of another type); the others' as they are."""
    own: Check = getattr(ConfigOps, name)

    def check(self: ConfigOps, *args: Any) -> Op[None]:
        if self.keys.queue not in (down, refusing):
            return (yield from own(self, *args))
        yield Commands([("EXISTS", self.keys.config)])
        if self.keys.queue == refusing:
            raise CorruptKey(f"{self.keys.config} is not a hash: nothing written")
        raise redis.ConnectionError("injected: its node did not answer")

    monkeypatch.setattr(ConfigOps, name, check)


def _stored(client: redis.Redis, pq: PartitionedQueue, field: str) -> dict[str, Any]:
    return {p.name: client.hget(QueueKeys(p.name).config, field) for p in pq.parts}


def _names(pq: PartitionedQueue) -> tuple[str, list[str]]:
    """The partition left out, and the others."""
    return pq.parts[1].name, [pq.parts[0].name, pq.parts[2].name]


def _left_out(err: PartitionsNotReached, down: str, rest: list[str], what: str) -> None:
    assert err.missing == [down] and sorted(err.done) == sorted(rest)
    assert f"{what} reached 2 of 3 partitions; not {down}" in str(err)


@pytest.mark.parametrize("asyncio_client", [False, True], ids=["sync", "asyncio"])
def test_dead_retention_leaves_out_a_partition_whose_check_did_not_answer(
    client: redis.Redis,
    redis_url: str,
    pq: PartitionedQueue,
    monkeypatch: pytest.MonkeyPatch,
    asyncio_client: bool,
) -> None:
    down, rest = _names(pq)
    _not_answering(monkeypatch, "check_dead_retention", down)
    with pytest.raises(PartitionsNotReached) as err:
        _call(redis_url, pq, asyncio_client, lambda q: q.set_dead_retention(max_count=7))
    _left_out(err.value, down, rest, "set_dead_retention")
    assert _stored(client, pq, "dead_max_count") == {down: None, **dict.fromkeys(rest, "7")}


@pytest.mark.parametrize("asyncio_client", [False, True], ids=["sync", "asyncio"])
def test_priority_aging_leaves_out_a_partition_whose_check_did_not_answer(
    client: redis.Redis,
    redis_url: str,
    pq: PartitionedQueue,
    monkeypatch: pytest.MonkeyPatch,
    asyncio_client: bool,
) -> None:
    down, rest = _names(pq)
    _not_answering(monkeypatch, "check_priority_aging", down)
    with pytest.raises(PartitionsNotReached) as err:
        _call(redis_url, pq, asyncio_client, lambda q: q.set_priority_aging(5))
    _left_out(err.value, down, rest, "set_priority_aging")
    assert _stored(client, pq, AGING_FIELD) == {down: None, **dict.fromkeys(rest, "5")}


def test_a_refusal_refuses_the_whole_change_even_with_a_partition_not_answering(
    client: redis.Redis, pq: PartitionedQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal, not PartitionsNotReached: nothing written to any partition."""
    down, rest = _names(pq)
    _not_answering(monkeypatch, "check_priority_aging", down, refusing=rest[0])
    with pytest.raises(CorruptKey, match="nothing written"):
        pq.set_priority_aging(5)
    assert set(_stored(client, pq, AGING_FIELD).values()) == {None}


def _call(url: str, pq: PartitionedQueue, asyncio_client: bool, act: Callable[[Any], Any]) -> None:
    """act(the queue) with the blocking client, or with an AsyncPartitionedQueue of the same."""
    if not asyncio_client:
        act(pq)
        return

    async def main() -> None:
        ac = connect_async(url)
        try:
            await act(AsyncPartitionedQueue(ac, pq.layout))
        finally:
            await ac.aclose()

    asyncio.run(main())
