"""The names a new partitioned queue takes, checked before its layout record is written
(PartitionedQueue.create and AsyncPartitionedQueue.create): refused (PartitionMismatch,
nothing written) when its own name is a plain queue, when one of its partitions' names is a
plain queue (`emails.p0`, a natural name for a priority queue: its jobs would silently become
the partitioned queue's, run by both queues' workers), or a reserved name (Layout.check_reserved:
a partition of a partitioned queue, on either side). As for the reserved names, a partition
whose node does not answer is taken as free: a create is not refused for a node down."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from scheduler.admin.inspection import existence_keys, server_now_ms
from scheduler.client.partitioned_ids import reserved_records, reserved_records_async
from scheduler.client.partitioned_merge import not_answering
from scheduler.core.keys import QueueKeys
from scheduler.core.partitions import Layout, PartitionMismatch, meta_key


def refuse_taken(client: redis.Redis, wanted: Layout) -> None:
    """PartitionMismatch when a name `wanted` takes is a plain queue, or reserved. The clock of
    the queue's node (the stats minutes queue_exists looks at); one EXISTS a queue, pipelined
    (a node that does not answer: each apart)."""
    each = _existence(wanted, server_now_ms(client, QueueKeys(wanted.queue)))
    pipe = client.pipeline(transaction=False)
    for keys in each:
        pipe.exists(*keys)
    try:
        found = pipe.execute(raise_on_error=False)
    except Exception as exc:  # as reserved_records: not_answering decides
        if not not_answering(exc):
            raise
        found = [_apart(client.exists, keys) for keys in each]
    plain = _plain(wanted, found)
    if plain and client.get(meta_key(wanted.queue)) is None:  # else a concurrent create's
        raise _adopting(wanted, plain)
    wanted.check_reserved(reserved_records(client, wanted))


async def refuse_taken_async(client: Any, wanted: Layout, now_ms: int) -> None:
    """refuse_taken for a redis.asyncio client; `now_ms` the queue's node's clock."""
    each = _existence(wanted, now_ms)
    pipe = client.pipeline(transaction=False)
    for keys in each:
        pipe.exists(*keys)
    try:
        found = await pipe.execute(raise_on_error=False)
    except Exception as exc:  # as refuse_taken
        if not not_answering(exc):
            raise
        found = []
        for keys in each:
            try:
                found.append(await client.exists(*keys))
            except Exception as one:
                found.append(one)
    plain = _plain(wanted, found)
    if plain and await client.get(meta_key(wanted.queue)) is None:  # as refuse_taken
        raise _adopting(wanted, plain)
    wanted.check_reserved(await reserved_records_async(client, wanted))


def _existence(wanted: Layout, now_ms: int) -> list[list[str]]:
    """The keys queue_exists looks at, of the queue's own name then of each partition's."""
    return [existence_keys(QueueKeys(name), now_ms) for name in (wanted.queue, *wanted.names)]


def _apart(exists: Any, keys: list[str]) -> Any:
    try:
        return exists(*keys)
    except Exception as exc:
        return exc


def _plain(wanted: Layout, found: Sequence[Any]) -> list[str]:
    """The partitions that are plain queues, from the EXISTS answers of _existence: the queue's
    own name first (a plain queue, or not read: refused, as before), then each partition's (a
    node that does not answer: taken as free). The caller reads the layout again before
    refusing them: one stored since is a concurrent create's, whose partitions may be in use
    already (the caller then opens it)."""
    if isinstance(found[0], BaseException):
        raise found[0]
    if int(found[0]) > 0:
        raise PartitionMismatch(
            f"queue {wanted.queue!r} exists unpartitioned: drain it into a new partitioned "
            "queue (README 'Partitioned queues')"
        )
    plain = []
    for name, n in zip(wanted.names, found[1:], strict=True):
        if isinstance(n, BaseException):
            if not not_answering(n):
                raise n
        elif int(n) > 0:
            plain.append(name)
    return plain


def _adopting(wanted: Layout, plain: Sequence[str]) -> PartitionMismatch:
    return PartitionMismatch(
        f"{plain[0]!r}, which would be a partition of {wanted.queue!r}, is a plain queue (jobs, "
        "schedules, workers or settings): they would become the partitioned queue's; pick "
        f"another name, or drain {plain[0]!r} first; nothing written"
    )
