"""Where a partitioned queue's job is, for ids that need not route to it: a job written to a
partition's own queue (an ordinary queue: `scheduler enqueue -q <name>.p1.4`, or
`pq.parts[1]`) has an id of its own, which Layout.partition_of_id sends to another partition
about 3 times in 4. requeue_dead / purge_dead (sync and asyncio) act where each id routes, then,
when some were not acted on, look for those dead in the other partitions (one driver call per
node) and act there; the CLI's --id selection and requeue_order find each the same way. The
one-job calls (status, get_job, cancel, reschedule, complete, result; the CLI's `jobs show` /
`reschedule`) ask the other partitions when the job's own answers JobNotFound (one driver call
per node, then the call again where the job is); `jobs cancel ID...` finds its ids at once
(held_where). A partition that does not answer is never taken for one without the job: in none
of the others, the call raises PartitionsNotReached naming it (the CLI: exit 3). Also the reads
of the names a new partitioned queue reserves (reserved_records: Layout.check_reserved)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from scheduler.client.partitioned_merge import PartitionsNotReached, not_answering
from scheduler.client.partitioned_partial import answering_async, answering_sync
from scheduler.client.queue import Queue
from scheduler.core.errors import JobNotFound, slot_move_text
from scheduler.core.partitions import OTHER_TYPE
from scheduler.operations.dead_letters import check_id_list, dead_selected
from scheduler.operations.ops import Op

if TYPE_CHECKING:
    from scheduler.client.aio import AsyncQueue
    from scheduler.client.partitioned import PartitionedQueue
    from scheduler.client.partitioned_aio import AsyncPartitionedQueue
    from scheduler.core.partitions import Layout

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
    that has the job (found by one get_jobs each, one driver call per node), else that
    JobNotFound raised, or PartitionsNotReached when one of the others did not answer (the
    job may be there)."""
    first = q.part_of(job_id)
    try:
        return call(first)
    except JobNotFound:
        others = [p for p in q.parts if p is not first]
        got = looked_up(q, lambda p: p.ops.get_jobs([job_id]), others)
        for p, jobs in zip(others, got, strict=True):
            if isinstance(jobs, list) and jobs:
                return call(p)
        if (err := not_reached(job_id, q.parts, others, got)) is not None:
            raise err from None
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
        try:
            got = await answering_async(q, lambda p: p.ops.get_jobs([job_id]), others)
        except Exception as exc:  # none answered: as looked_up
            if not not_answering(exc):
                raise
            got = [exc] * len(others)
        for p, jobs in zip(others, got, strict=True):
            if isinstance(jobs, list) and jobs:
                return await call(p)
        if (err := not_reached(job_id, q.parts, others, got)) is not None:
            raise err from None
        raise


def looked_up(
    q: PartitionedQueue, make: Callable[[Queue], Op[Any]], asked: Sequence[Queue]
) -> list[Any]:
    """run_answering over `asked`: one result each, or the error of one that did not answer
    (each one's when none did: run_answering raises the first then)."""
    try:
        return answering_sync(q, make, asked)
    except Exception as exc:
        if not not_answering(exc):
            raise
        return [exc] * len(asked)


def not_reached(
    job_id: str, parts: Sequence[Any], asked: Sequence[Any], got: Sequence[Any]
) -> PartitionsNotReached | None:
    """The job is in none of the partitions of `asked` that answered; some did not (an error in
    `got`): PartitionsNotReached naming them, as it may be there (not JobNotFound). Else None."""
    failed = {
        p.name: slot_move_text(r) or str(r)
        for p, r in zip(asked, got, strict=True)
        if isinstance(r, BaseException)
    }
    if not failed:
        return None
    done = [p.name for p in parts if p.name not in failed]
    what = f"job {job_id}, in none of the partitions that answered: the lookup"
    return PartitionsNotReached(what, done, list(failed), list(dict.fromkeys(failed.values())))


def held_where(q: PartitionedQueue, ids: Sequence[str]) -> tuple[dict[str, int], dict[str, str]]:
    """For a change of several jobs by id (`jobs cancel ID...`): id -> the partition to act in,
    the one it routes to when that has the job or does not answer (the change there says so),
    else another that has it, else (none has it) the one it routes to (the change there says
    it is missing). Second: id -> why not acted on, for an id in none of the partitions that
    answered while one it may be in did not (not_reached's words). One get_jobs per partition
    asked, one driver call per node, then one more for the ids not where they route."""
    first = routed(q.layout, ids)
    asked = [q.parts[k] for k in first]
    got = looked_up(q, lambda p: p.ops.get_jobs(first[q.parts.index(p)]), asked)
    where: dict[str, int] = {}
    for k, r in zip(first, got, strict=True):
        there = set(first[k]) if isinstance(r, BaseException) else {j.id for j in r}
        where.update((i, k) for i in first[k] if i in there)
    rest = [i for g in first.values() for i in g if i not in where]
    more = elsewhere(q.layout, rest)
    asked = [q.parts[k] for k in more]
    got = looked_up(q, lambda p: p.ops.get_jobs(more[q.parts.index(p)]), asked) if more else []
    for k, r in zip(more, got, strict=True):
        if not isinstance(r, BaseException):
            for j in r:
                where.setdefault(j.id, k)
    why: dict[str, str] = {}
    for i in rest:
        if i not in where:
            own = [(p, r) for p, r in zip(asked, got, strict=True) if i in more[q.parts.index(p)]]
            err = not_reached(i, q.parts, [p for p, _ in own], [r for _, r in own])
            if err is None:
                where[i] = q.layout.partition_of_id(i)
            else:
                why[i] = str(err)
    return {i: where[i] for i in dict.fromkeys(ids) if i in where}, why


def _record(value: Any) -> Any:
    """One reserved key's read: OTHER_TYPE for a key of another type (WRONGTYPE), None for a
    node that does not answer (taken as missing); another error is raised."""
    if not isinstance(value, BaseException):
        return value
    if isinstance(value, ResponseError) and "WRONGTYPE" in str(value):
        return OTHER_TYPE
    if not_answering(value):
        return None
    raise value


def reserved_records(client: Any, wanted: Layout) -> list[Any]:
    """The values at wanted.reserved_keys() (None: no such key; OTHER_TYPE: a key of another
    type), for PartitionedQueue.create: one pipeline; when a node does not answer, each key
    apart, one not read taken as missing (a create is not refused for a node down, as before
    the check)."""
    keys = wanted.reserved_keys()
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    try:
        return [_record(r) for r in pipe.execute(raise_on_error=False)]
    except Exception as exc:  # not_answering decides; another is raised
        if not not_answering(exc):
            raise
    out = []
    for key in keys:
        try:
            value = client.get(key)
        except Exception as exc:
            value = exc
        out.append(_record(value))
    return out


async def reserved_records_async(client: Any, wanted: Layout) -> list[Any]:
    """reserved_records for a redis.asyncio client."""
    keys = wanted.reserved_keys()
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    try:
        return [_record(r) for r in await pipe.execute(raise_on_error=False)]
    except Exception as exc:  # as reserved_records
        if not not_answering(exc):
            raise
    out = []
    for key in keys:
        try:
            value = await client.get(key)
        except Exception as exc:
            value = exc
        out.append(_record(value))
    return out
