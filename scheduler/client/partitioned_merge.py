"""What the sync and asyncio partitioned clients share (client/partitioned.py,
partitioned_aio.py), sans-I/O but for the layout reads: reading the stored layout, expanding a
worker's queue list, and merging the partitions' counts, dead lists and job pages into one
queue's."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

import redis

from scheduler.core.models import Job, QueueCounts
from scheduler.core.partitions import Layout, meta_key


def read_layout(client: redis.Redis, queue: str) -> Layout | None:
    """The stored layout of `queue`, or None for a queue that is not partitioned."""
    raw = client.get(meta_key(queue))
    return None if raw is None else Layout.parse(queue, str(raw))


async def read_layout_async(client: Any, queue: str) -> Layout | None:
    """read_layout for a redis.asyncio client."""
    raw = await client.get(meta_key(queue))
    return None if raw is None else Layout.parse(queue, str(raw))


def expand_queues(client: redis.Redis, queues: Sequence[str]) -> list[str]:
    """The worker's queue list with each partitioned queue replaced by its partitions."""
    out: list[str] = []
    for name in queues:
        layout = read_layout(client, name)
        out.extend(layout.names if layout else [name])
    return list(dict.fromkeys(out))


async def expand_queues_async(client: Any, queues: Sequence[str]) -> tuple[str, ...]:
    """expand_queues for a redis.asyncio client."""
    return (await expand_labelled_async(client, queues))[0]


async def expand_labelled_async(
    client: Any, queues: Sequence[str]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The worker's start: its queue list expanded (expand_queues), and each partition's
    logical queue name (its metrics label)."""
    out: list[str] = []
    logical: dict[str, str] = {}
    for name in queues:
        layout = await read_layout_async(client, name)
        out.extend(layout.names if layout else [name])
        logical.update(dict.fromkeys(layout.names if layout else [], name))
    return tuple(dict.fromkeys(out)), logical


def merge_counts(each: Sequence[QueueCounts]) -> QueueCounts:
    """The partitions' counts as one queue's: sums, the latest clock, the oldest due time."""
    oldest = [c.oldest_due_ms for c in each if c.oldest_due_ms is not None]
    return QueueCounts(
        now_ms=max(c.now_ms for c in each),
        due=sum(c.due for c in each),
        scheduled=sum(c.scheduled for c in each),
        leased=sum(c.leased for c in each),
        dead=sum(c.dead for c in each),
        oldest_due_ms=min(oldest) if oldest else None,
        lapsed=sum(c.lapsed for c in each),
        held_key_limit=sum(c.held_key_limit for c in each),
        held_rate_window=sum(c.held_rate_window for c in each),
        held_waiting=sum(c.held_waiting for c in each),
    )


def merge_dead(per: Sequence[Sequence[tuple[float, str]]]) -> list[str]:
    """Each partition's (dead_ms, id) pairs (newest first, `Ops.dead_scored`) -> one list of
    ids, newest first by the time each job died (ties: the larger id first, as one ZSET)."""
    return [i for _, i in heapq.merge(*per, reverse=True)]


def _order(state: str) -> tuple[Callable[[Job], int], bool]:
    """How one queue's index orders `state` (operations/inspecting.py): key, newest first."""
    if state == "dead":
        return (lambda j: int(j.fields.get("dead_ms") or 0)), True
    if state == "leased":
        return (lambda j: j.lease_until_ms or 0), False
    return (lambda j: j.run_at_ms or 0), False


def merge_jobs(state: str, pages: Sequence[Sequence[Job]], offset: int, limit: int) -> list[Job]:
    """The [offset, offset + limit) slice of the partitions' first offset + limit jobs,
    merged in the order one queue's index has (dead: newest first; else oldest first)."""
    key, newest_first = _order(state)
    merged = sorted((j for page in pages for j in page), key=key, reverse=newest_first)
    return merged[offset : offset + limit]
