"""`AsyncPartitionedQueue`: client/partitioned.py's logical queue for asyncio producers (the
same layout, routing and merges; each partition an `AsyncQueue`; several partitions in one
driver call, so one pipeline per node on a cluster)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from scheduler.client import partitioned_partial as partial
from scheduler.client.aio import AsyncQueue
from scheduler.client.enqueue_flights import Flights, alone_across
from scheduler.client.partition_names import refuse_taken_async
from scheduler.client.partitioned_change import change_async
from scheduler.client.partitioned_ids import dead_change_async, holding_async
from scheduler.client.partitioned_lease_aio import AsyncPartitionedLeasing
from scheduler.client.partitioned_merge import (
    by_partition,
    group_ids,
    ids_in_call_order,
    jobs_in_order,
    place,
    read_layout_async,
)
from scheduler.core import codec, loop_guard, queue_index
from scheduler.core.connection import connect_async, is_cluster
from scheduler.core.job_spec import spec_options
from scheduler.core.models import Job, JobSpec, JobState, QueueCounts
from scheduler.core.partitions import Layout, PartitionMismatch, check_count, meta_key
from scheduler.core.scripts import Scripts, run_async
from scheduler.operations.browsing import listed_scored
from scheduler.operations.dead_letters import dead_window
from scheduler.operations.inspecting import check_page
from scheduler.operations.ops import Op, Request
from scheduler.schedules.recurring import Schedule


class AsyncPartitionedQueue(AsyncPartitionedLeasing):
    """A logical queue over the partitions of `layout` (use create() or open()); the manual
    lease API (claim, heartbeat, ...) is client/partitioned_lease_aio.py's."""

    def __init__(self, client: Any, layout: Layout, **queue_kwargs: Any) -> None:
        self.client, self.layout = client, layout
        self.parts = [AsyncQueue(client, name, **queue_kwargs) for name in layout.names]
        # The partitions' enqueue calls in flight: one AsyncQueue's (two a node), not two each.
        flights, cluster = Flights(), is_cluster(client)
        for p in self.parts:
            node = (lambda p=p: partial.nodes_of(client, [p])[0]) if cluster else None
            p._batcher.share(flights, node)
        self._scripts = Scripts(clock=queue_kwargs.get("_clock", "server"))
        self._spread = itertools.count()
        self._index = queue_index.SharedAdd(client, layout.names)

    @classmethod
    async def create(
        cls, client: Any, name: str, *, partitions: int, **queue_kwargs: Any
    ) -> AsyncPartitionedQueue:
        """As PartitionedQueue.create: PartitionMismatch when `name` exists with another count,
        or as a plain queue holding anything (never claimed again: workers go by the layout),
        or a partition's name does (its jobs would become this queue's), or a reserved name
        (a partition of a partitioned queue, on either side)."""
        check_count(partitions)
        wanted = Layout.create(name, partitions)
        loop_guard.check(client, "redis.asyncio client")  # the GET, as every queue call
        stored = await read_layout_async(client, name, "AsyncPartitionedQueue.create")
        cls(client, wanted, **queue_kwargs)  # its options refused before the record is written
        if stored is None:
            # The clock of the queue's own script (its node's, on a cluster): the stats minutes.
            now_ms = (await AsyncQueue(client, name).counts()).now_ms
            await refuse_taken_async(client, wanted, now_ms)  # as PartitionedQueue.create
            await client.set(meta_key(name), wanted.record(), nx=True)  # the first creator wins
            stored = await read_layout_async(client, name)
        assert stored is not None
        if stored.n != partitions:
            raise stored.mismatch(partitions)
        return cls(client, stored, **queue_kwargs)

    @classmethod
    async def open(cls, client: Any, name: str, **queue_kwargs: Any) -> AsyncPartitionedQueue:
        """As PartitionedQueue.open: PartitionMismatch when `name` is not partitioned."""
        loop_guard.check(client, "redis.asyncio client")  # as create
        layout = await read_layout_async(client, name, "AsyncPartitionedQueue.open")
        if layout is None:
            raise PartitionMismatch(f"queue {name!r} is not partitioned")
        return cls(client, layout, **queue_kwargs)

    @property
    def name(self) -> str:
        """The logical queue's name (its partitions are `<name>.p<k>`)."""
        return self.layout.queue

    async def aclose(self) -> None:
        """Close the connection, as `AsyncQueue.aclose` (`async with` the queue too)."""
        await self.parts[0].aclose()  # its client: not in a child of its first user

    async def __aenter__(self) -> AsyncPartitionedQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def part_of(self, job_id: str) -> AsyncQueue:
        """The partition holding `job_id` (the id tells it)."""
        return self.parts[self.layout.partition_of_id(job_id)]

    async def _run_many(
        self, ops: Sequence[tuple[AsyncQueue, Op[Any]]], *, errors: bool = False
    ) -> list[Any]:
        """PartitionedQueue._run_many for asyncio."""
        self.parts[0]._guard()  # the client's loop and process (core/loop_guard.py)
        results: list[Any] = [None] * len(ops)
        pending: dict[int, Request] = {i: next(op) for i, (_, op) in enumerate(ops)}
        task = asyncio.current_task()  # a cancel Python 3.11's wait_for dropped: AsyncQueue._run
        asked = task.cancelling() if task is not None else 0
        while pending:
            order = list(pending)
            items = [(ops[i][0].keys.script_keys(), pending[i]) for i in order]
            replies = await run_async(self.client, self._scripts.drive(items))
            if task is not None and task.cancelling() > asked:
                raise asyncio.CancelledError
            pending = {}
            for i, reply in zip(order, replies, strict=True):
                op = ops[i][1]
                try:
                    nxt = op.throw(reply) if isinstance(reply, BaseException) else op.send(reply)
                    pending[i] = nxt
                except StopIteration as done:
                    results[i] = done.value
                except Exception as exc:
                    results[i] = exc
        for r in results:
            if isinstance(r, BaseException) and not errors:
                raise r
        return results

    async def run_answering(self, make: Callable[[AsyncQueue], Op[Any]]) -> list[Any]:
        """PartitionedQueue.run_answering for asyncio (the nodes' calls concurrently)."""
        return await partial.answering_async(self, make, self.parts)

    async def enqueue(self, task: str, payload: Any = None, **kwargs: Any) -> str:
        """PartitionedQueue.enqueue for asyncio (`AsyncQueue.enqueue`'s arguments)."""
        # Its partition's AsyncQueue.enqueue: concurrent callers share script calls there.
        ((k, spec),) = place(self.layout, [JobSpec(task, payload, **kwargs)], self._spread)
        try:
            got = await self.parts[k].enqueue(spec.task, spec.payload, **spec_options(spec))
        except Exception as exc:  # its names are indexed once it wrote (core/queue_index.py)
            if await queue_index.after_call_async(self.client, self.layout.names, exc):
                await self._index()
            # As the sync call: the error names the id made here, written or unknown (re-send
            # with job_id= that id), else the caller of a lost answer can only write it twice.
            ids_in_call_order([(k, spec)], {k: exc})
            raise
        await self._index()
        return got

    async def enqueue_many(self, specs: Iterable[JobSpec], *, batch_size: int = 1000) -> list[str]:
        """PartitionedQueue.enqueue_many for asyncio."""
        codec.check_int(batch_size, "batch_size")  # as AsyncQueue's, with no specs too
        placed = place(self.layout, specs, self._spread)
        groups = by_partition(placed)
        ops = [
            (self.parts[k], self.parts[k].ops.enqueue_many(g, batch_size))
            for k, g in groups.items()
        ]
        self.parts[0]._guard()  # ahead of the batchers, whose state is the loop's
        # In order with each partition's batched enqueues, as AsyncQueue.enqueue_many.
        shared = [(self.parts[k]._batcher, g) for k, g in groups.items()]
        try:
            got = (await alone_across(shared, lambda: partial.per_node_async(self, ops)))[0]
            ids = ids_in_call_order(placed, dict(zip(groups, got, strict=True)))
        except Exception as exc:
            if await queue_index.after_call_async(self.client, self.layout.names, exc):
                await self._index()
            raise
        await self._index()
        return ids

    async def status(self, job_id: str) -> JobState:
        """PartitionedQueue.status for asyncio."""
        return await holding_async(self, job_id, lambda p: p.status(job_id))

    async def get_job(self, job_id: str) -> Job:
        """PartitionedQueue.get_job for asyncio."""
        return await holding_async(self, job_id, lambda p: p.get_job(job_id))

    async def cancel(self, job_id: str) -> str:
        """PartitionedQueue.cancel for asyncio."""
        return await holding_async(self, job_id, lambda p: p.cancel(job_id))

    async def reschedule(self, job_id: str, **when: Any) -> str:
        """PartitionedQueue.reschedule for asyncio."""
        return await holding_async(self, job_id, lambda p: p.reschedule(job_id, **when))

    async def complete(self, job_id: str, token: str, result: Any = None) -> None:
        """PartitionedQueue.complete for asyncio."""
        await holding_async(self, job_id, lambda p: p.complete(job_id, token, result))

    async def result(self, job_id: str, *, timeout_s: float) -> Any:
        """`AsyncQueue.result` on the job's partition (the one holding it, as status)."""
        return await holding_async(self, job_id, lambda p: p.result(job_id, timeout_s=timeout_s))

    async def counts(self) -> QueueCounts:
        """PartitionedQueue.counts for asyncio: every partition's, summed (PartitionsNotReached
        the same: `partial` the answering partitions' sum)."""
        each = await self.run_answering(lambda p: p.ops.counts())
        return partial.read_every("counts", self.parts, each, partial.counts_of)

    async def list_jobs(self, state: str, *, offset: int = 0, limit: int = 50) -> list[Job]:
        """PartitionedQueue.list_jobs for asyncio (PartitionsNotReached the same)."""
        check_page(state, offset, limit)
        each = await self.run_answering(lambda p: listed_scored(p.ops, state, 0, offset + limit))
        left_out: dict[str, str] = {}
        chosen = partial.chosen_page(self, self.parts, each, (state, offset, limit), left_out)
        reads = [
            (self.parts[k], self.parts[k].ops.get_jobs(g)) for k, g in group_ids(chosen).items()
        ]
        jobs = jobs_in_order(chosen, await self._run_many(reads))
        partial.not_read("list_jobs", self.parts, left_out, jobs)
        return jobs

    async def dead_ids(self, **filters: Any) -> list[str]:
        """PartitionedQueue.dead_ids for asyncio: merged newest first (PartitionsNotReached the
        same)."""
        offset, end = dead_window(filters.pop("offset", 0), filters.pop("limit", None))
        each = await self.run_answering(lambda p: p.ops.dead_scored(limit=end, **filters))
        return partial.read_every("dead_ids", self.parts, each, partial.dead_page(offset, end))

    async def dead_scored(self, **filters: Any) -> list[list[tuple[float, str]]]:
        """PartitionedQueue.dead_scored for asyncio (PartitionsNotReached the same)."""
        each = await self.run_answering(lambda p: p.ops.dead_scored(**filters))
        return partial.read_every("dead_scored", self.parts, each, partial.dead_lists)

    async def requeue_dead(self, ids: Sequence[str]) -> int:
        """PartitionedQueue.requeue_dead for asyncio (an id dead in another partition too)."""
        return await dead_change_async(self, lambda q, g: q.ops.requeue_dead(g), ids)

    async def purge_dead(self, ids: Sequence[str]) -> int:
        """PartitionedQueue.purge_dead for asyncio (an id dead in another partition too)."""
        return await dead_change_async(self, lambda q, g: q.ops.purge_dead(g), ids)

    # -- schedules: each in one partition (by its name), as in the sync client ---------------
    def _sched(self, name: str) -> AsyncQueue:
        return self.parts[self.layout.partition_of_schedule(name)]

    async def schedule(self, name: str, task: str, payload: Any = None, **kwargs: Any) -> str:
        """PartitionedQueue.schedule for asyncio."""
        return await self._sched(name).schedule(name, task, payload, **kwargs)

    async def get_schedule(self, name: str) -> Schedule:
        """PartitionedQueue.get_schedule for asyncio."""
        return await self._sched(name).get_schedule(name)

    async def pause_schedule(self, name: str) -> str:
        """PartitionedQueue.pause_schedule for asyncio."""
        return await self._sched(name).pause_schedule(name)

    async def resume_schedule(self, name: str) -> str:
        """PartitionedQueue.resume_schedule for asyncio."""
        return await self._sched(name).resume_schedule(name)

    async def remove_schedule(self, name: str) -> str:
        """PartitionedQueue.remove_schedule for asyncio."""
        return await self._sched(name).remove_schedule(name)

    async def list_schedules(self) -> list[Schedule]:
        """PartitionedQueue.list_schedules for asyncio (PartitionsNotReached the same)."""
        each = await self.run_answering(lambda p: p.ops.list_schedules())
        return partial.read_every("list_schedules", self.parts, each, partial.schedules_of)

    async def run_schedule_now(self, name: str, *, job_id: str | None = None) -> str:
        """PartitionedQueue.run_schedule_now for asyncio."""
        k, job_id = self.layout.schedule_run(name, job_id)
        return await self.parts[k].run_schedule_now(name, job_id=job_id)

    async def pause(self) -> str:
        """PartitionedQueue.pause for asyncio (PartitionsNotReached the same)."""
        return await change_async(self, "pause")

    async def resume(self) -> str:
        """PartitionedQueue.resume for asyncio (PartitionsNotReached the same)."""
        return await change_async(self, "resume")


async def open_queue_async(
    target: Any, name: str = "default", **queue_kwargs: Any
) -> AsyncQueue | AsyncPartitionedQueue:
    """client/partitioned.py's open_queue for asyncio: an `AsyncPartitionedQueue` when
    `sched:{name}:partitions` exists, else an `AsyncQueue`; `target` a redis.asyncio client
    or a URL (a new connection the caller closes: `aclose()` or `async with`, either kind).
    One GET, once."""
    client = connect_async(target, default_retry=True) if isinstance(target, str) else target
    loop_guard.check(client, "redis.asyncio client")  # as AsyncPartitionedQueue.create
    layout = await read_layout_async(client, name, "open_queue_async")
    if layout is None:
        return AsyncQueue(client, name, **queue_kwargs)
    return AsyncPartitionedQueue(client, layout, **queue_kwargs)
