"""Where a partitioned queue's dead job is, for ids that need not route to it: a job written to
a partition's own queue (an ordinary queue: `scheduler enqueue -q <name>.p1.4`, or
`pq.parts[1]`) has an id of its own, which Layout.partition_of_id sends to another partition
about 3 times in 4. requeue_dead / purge_dead (sync and asyncio) act where each id routes, then,
when some were not acted on, look for those dead in the other partitions (one driver call per
node) and act there; the CLI's --id selection finds each the same way. The one-job calls
(status, get_job, cancel, reschedule) ask the other partitions when the job's own answers
JobNotFound (one driver call, then the call again where the job is)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from scheduler.client.queue import Queue
from scheduler.core.errors import JobNotFound
from scheduler.operations.dead_letters import check_id_list, dead_selected
from scheduler.operations.ops import Op

if TYPE_CHECKING:
    from scheduler.client.aio import AsyncQueue
    from scheduler.client.partitioned import PartitionedQueue
    from scheduler.client.partitioned_aio import AsyncPartitionedQueue

T = TypeVar("T")


def routed(layout: Any, ids: Sequence[str]) -> dict[int, list[str]]:
    """`ids` (each once) by the partition each routes to."""
    groups: dict[int, list[str]] = {}
    for i in dict.fromkeys(check_id_list(ids)):  # a str would be split into one-letter ids
        groups.setdefault(layout.partition_of_id(i), []).append(i)
    return groups


def elsewhere(layout: Any, ids: Sequence[str]) -> dict[int, list[str]]:
    """For each partition, the ids of `ids` that route to another one (where else to look)."""
    out: dict[int, list[str]] = {}
    for k in range(layout.n):
        others = [i for i in ids if layout.partition_of_id(i) != k]
        if others:
            out[k] = others
    return out


def first_found(asked: Sequence[int], found: Sequence[Sequence[str]]) -> dict[str, int]:
    """id -> the first partition of `asked` that found it (a job is dead in one partition)."""
    where: dict[str, int] = {}
    for k, ids in zip(asked, found, strict=True):
        for i in ids:
            where.setdefault(i, k)
    return where


def by_found(where: dict[str, int]) -> dict[int, list[str]]:
    groups: dict[int, list[str]] = {}
    for i, k in where.items():
        groups.setdefault(k, []).append(i)
    return groups


def dead_where(q: Queue | PartitionedQueue, ids: Sequence[str], **filters: Any) -> dict[str, int]:
    """id -> the partition where it is dead and matches `filters` (dead_selected's), in the
    order of `ids`: the one its id routes to, else another (asked only for the ids not found
    there; a plain queue: 0). Not dead anywhere: left out. At most two driver calls, one per
    node each."""
    if isinstance(q, Queue):
        return dict.fromkeys(q._run(dead_selected(q.keys, list(dict.fromkeys(ids)), **filters)), 0)
    first = routed(q.layout, ids)
    reads = [(q.parts[k], dead_selected(q.parts[k].keys, g, **filters)) for k, g in first.items()]
    where = first_found(list(first), q._run_many(reads))
    rest = [i for g in first.values() for i in g if i not in where]
    if rest:
        more = elsewhere(q.layout, rest)
        reads = [
            (q.parts[k], dead_selected(q.parts[k].keys, g, **filters)) for k, g in more.items()
        ]
        where.update(first_found(list(more), q._run_many(reads)))
    return {i: where[i] for i in dict.fromkeys(ids) if i in where}


def dead_change_sync(
    q: PartitionedQueue, make: Callable[[Queue, list[str]], Op[int]], ids: Sequence[str]
) -> int:
    """make(partition, ids) where each id routes (one driver call, the common case all of
    it); when fewer were acted on than given, the ids dead in another partition than their
    own are found there (one driver call) and acted on there (one more)."""
    first = routed(q.layout, ids)
    done = int(sum(q._run_many([(q.parts[k], make(q.parts[k], g)) for k, g in first.items()])))
    if done >= sum(len(g) for g in first.values()):
        return done
    more = elsewhere(q.layout, [i for g in first.values() for i in g])
    got = q._run_many([(q.parts[k], dead_selected(q.parts[k].keys, g)) for k, g in more.items()])
    strays = by_found(first_found(list(more), got))
    again = [(q.parts[k], make(q.parts[k], g)) for k, g in strays.items()]
    return done + int(sum(q._run_many(again)))


async def dead_change_async(
    q: AsyncPartitionedQueue,
    make: Callable[[AsyncQueue, list[str]], Op[int]],
    ids: Sequence[str],
) -> int:
    """dead_change_sync for asyncio."""
    first = routed(q.layout, ids)
    ops = [(q.parts[k], make(q.parts[k], g)) for k, g in first.items()]
    done = int(sum(await q._run_many(ops)))
    if done >= sum(len(g) for g in first.values()):
        return done
    more = elsewhere(q.layout, [i for g in first.values() for i in g])
    reads = [(q.parts[k], dead_selected(q.parts[k].keys, g)) for k, g in more.items()]
    strays = by_found(first_found(list(more), await q._run_many(reads)))
    ops = [(q.parts[k], make(q.parts[k], g)) for k, g in strays.items()]
    return done + int(sum(await q._run_many(ops)))


def holding_sync(q: PartitionedQueue, job_id: str, call: Callable[[Queue], T]) -> T:
    """call(partition) on the partition `job_id` routes to; JobNotFound there: on another one
    that has the job (found by one get_jobs each, one driver call; one whose node does not
    answer counts as not having it), else that JobNotFound raised."""
    first = q.part_of(job_id)
    try:
        return call(first)
    except JobNotFound:
        others = [p for p in q.parts if p is not first]
        got = q._run_many([(p, p.ops.get_jobs([job_id])) for p in others], errors=True)
        for p, jobs in zip(others, got, strict=True):
            if isinstance(jobs, list) and jobs:
                return call(p)
        raise


async def holding_async(
    q: AsyncPartitionedQueue, job_id: str, call: Callable[[AsyncQueue], Awaitable[T]]
) -> T:
    """holding_sync for asyncio."""
    first = q.part_of(job_id)
    try:
        return await call(first)
    except JobNotFound:
        others = [p for p in q.parts if p is not first]
        got = await q._run_many([(p, p.ops.get_jobs([job_id])) for p in others], errors=True)
        for p, jobs in zip(others, got, strict=True):
            if isinstance(jobs, list) and jobs:
                return await call(p)
        raise
