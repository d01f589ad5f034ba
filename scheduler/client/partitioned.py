"""One logical queue over N partitions (scheduler/core/partitions.py), with the methods of
`Queue` that a producer and an operator use. Each partition is an ordinary `Queue`; a request
for several partitions is one driver call, so on a cluster it is one pipeline per node
(core/cluster_io.py).

    q = PartitionedQueue.create(client, "emails", partitions=12)   # or open(): as stored
    q.enqueue("send", {...})                                     # the Queue signature
    scheduler worker tasks:registry --queue emails                # claims every partition
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import redis

from scheduler.client.partition_names import refuse_taken
from scheduler.client.partitioned_change import change_sync
from scheduler.client.partitioned_ids import dead_change_sync, dead_where, holding_sync
from scheduler.client.partitioned_lease import PartitionedLeasing
from scheduler.client.partitioned_merge import (
    PartitionsNotReached,
    by_partition,
    expand_queues,
    expand_queues_async,
    group_ids,
    ids_in_call_order,
    jobs_in_order,
    merge_counts,
    merge_dead,
    not_answering,
    place,
    read_layout,
    unread,
)
from scheduler.client.partitioned_partial import (
    answering_sync,
    chosen_page,
    counts_of,
    dead_lists,
    dead_page,
    not_read,
    per_node_sync,
    read_every,
    schedules_of,
)
from scheduler.client.queue import Queue
from scheduler.core import codec, queue_index
from scheduler.core.client_kind import SyncClient, Unpicklable
from scheduler.core.connection import connect
from scheduler.core.models import Job, JobSpec, JobState, QueueCounts
from scheduler.core.partitions import Layout, PartitionMismatch, check_count, meta_key
from scheduler.core.scripts import Scripts, run_sync
from scheduler.operations.browsing import listed_scored
from scheduler.operations.dead_filter import parents_first
from scheduler.operations.dead_letters import check_id_list, dead_window
from scheduler.operations.inspecting import check_page
from scheduler.operations.ops import Op, Request
from scheduler.schedules.recurring import Schedule

# Re-exported: the worker, the dashboard and the asyncio client import them from here.
__all__ = [
    "PartitionedQueue",
    "PartitionsNotReached",
    "expand_queues",
    "expand_queues_async",
    "list_answering",
    "merge_counts",
    "merge_dead",
    "not_answering",
    "open_queue",
    "read_layout",
    "requeue_order",
    "unread",
]


class PartitionedQueue(PartitionedLeasing, Unpicklable):
    """A logical queue over the partitions of `layout` (use create() or open()); the manual
    lease API (claim, heartbeat, ...) is client/partitioned_lease.py's."""

    def __init__(self, client: SyncClient, layout: Layout, **queue_kwargs: Any) -> None:
        self.client, self.layout = cast(redis.Redis, client), layout
        self.parts = [Queue(client, name, **queue_kwargs) for name in layout.names]
        self._scripts = Scripts(clock=queue_kwargs.get("_clock", "server"))
        self._spread = itertools.count()

    @classmethod
    def create(
        cls, client: SyncClient, name: str, *, partitions: int, **queue_kwargs: Any
    ) -> PartitionedQueue:
        """Create `name` with `partitions` partitions, or open it when it exists with that
        count. PartitionMismatch: it exists with another count, or as a plain queue, or one
        of its partitions' names is a plain queue (`<name>.p0` holding jobs), or a name is
        reserved (`name` is a partition of a partitioned queue, or one of its partitions'
        names is a partitioned queue); nothing written then."""
        check_count(partitions)
        wanted, client = Layout.create(name, partitions), cast(redis.Redis, client)
        existing = read_layout(client, name, "PartitionedQueue.create")  # the client's kind too
        cls(client, wanted, **queue_kwargs)  # its options refused before the record is written
        if existing is None:
            refuse_taken(client, wanted)  # a plain queue's name (its own, a partition's), reserved
            client.set(meta_key(name), wanted.record(), nx=True)  # the first creator wins
            existing = read_layout(client, name)
        assert existing is not None
        if existing.n != partitions:
            raise existing.mismatch(partitions)
        return cls(client, existing, **queue_kwargs)

    @classmethod
    def open(cls, client: SyncClient, name: str, **queue_kwargs: Any) -> PartitionedQueue:
        """Open `name` as stored. PartitionMismatch when it is not partitioned."""
        client = cast(redis.Redis, client)
        layout = read_layout(client, name, "PartitionedQueue.open")
        if layout is None:
            raise PartitionMismatch(f"queue {name!r} is not partitioned")
        return cls(client, layout, **queue_kwargs)

    @property
    def name(self) -> str:
        """The logical queue's name (its partitions are `<name>.p<k>`)."""
        return self.layout.queue

    def close(self) -> None:
        """Close the connection, as `Queue.close` (`with open_queue(url, name) as q:` too)."""
        self.client.close()

    def __enter__(self) -> PartitionedQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def part_of(self, job_id: str) -> Queue:
        """The partition holding `job_id` (the id tells it)."""
        return self.parts[self.layout.partition_of_id(job_id)]

    # -- several partitions in one driver call -----------------------------------------------
    def _run_many(self, ops: Sequence[tuple[Queue, Op[Any]]], *, errors: bool = False) -> list[Any]:
        """Drive one operation per partition together: each round sends every operation's
        next request in one call (one pipeline per node). The first error is raised after all
        ran; with `errors`, each operation's error is returned in its place instead."""
        results: list[Any] = [None] * len(ops)
        pending: dict[int, Request] = {i: next(op) for i, (_, op) in enumerate(ops)}
        while pending:
            order = list(pending)
            items = [(ops[i][0].keys.script_keys(), pending[i]) for i in order]
            replies = run_sync(self.client, self._scripts.drive(items))
            pending = {}
            for i, reply in zip(order, replies, strict=True):
                op = ops[i][1]
                try:
                    pending[i] = (
                        op.throw(reply) if isinstance(reply, BaseException) else op.send(reply)
                    )
                except StopIteration as done:
                    results[i] = done.value
                except Exception as exc:
                    results[i] = exc
        for r in results:
            if isinstance(r, BaseException) and not errors:
                raise r
        return results

    def run_answering(self, make: Callable[[Queue], Op[Any]]) -> list[Any]:
        """make(p) on each partition, for callers that show what answers (the CLI, the
        dashboard, the partial reads) or finish it later (pause): each one's result, or in its
        place the error of one whose node does not answer or refuses for now (not_answering),
        while another answers. On a cluster each node's partitions are one driver call, so a
        node down fails its own only. A partition whose slot moved to another node is asked
        once more there (make(p) again: a read, or a change that is idempotent), and so are
        the other partitions of its old node's call when the new node did not answer (that
        call raised whole: their first attempt may have run, its reply lost; pause and resume
        count such a partition's 'already' / 'active' as their change, changed_if_lost). None
        answering: the first error is raised; any other error too."""
        return answering_sync(self, make, self.parts)

    def _answering(self, make: Callable[[Queue], Op[Any]], asked: Sequence[Queue]) -> list[Any]:
        """run_answering over `asked` only (of self.parts): one result each, in their order."""
        return answering_sync(self, make, asked)

    # -- producers ---------------------------------------------------------------------------
    def enqueue(self, task: str, payload: Any = None, **kwargs: Any) -> str:
        """`Queue.enqueue` on the job's partition (by key, else by id, else its parents')."""
        return self.enqueue_many([JobSpec(task, payload, **kwargs)])[0]

    def enqueue_many(self, specs: Iterable[JobSpec], *, batch_size: int = 1000) -> list[str]:
        """`Queue.enqueue_many`: the jobs grouped by partition, one driver call per node.
        Every spec is checked before anything is sent. Each partition's jobs are batches of
        their own: a batch the server refuses (a parent missing) writes nothing, the other
        partitions' are written, as across the batches of one plain call; the error's
        `written_ids` lists them (call order). A node that does not answer (a connection lost
        midway) fails its partitions only: the error (its own) has `written_ids` and
        `unknown_ids`, the jobs sent there, written or not (re-send them with those ids).
        NotDurable carries every id of the call."""
        codec.check_int(batch_size, "batch_size")  # as Queue's, with no specs too
        placed = place(self.layout, specs, self._spread)
        groups = by_partition(placed)
        ops = [
            (self.parts[k], self.parts[k].ops.enqueue_many(g, batch_size))
            for k, g in groups.items()
        ]

        def call() -> list[str]:  # its names go into the queue index once it wrote
            got = per_node_sync(self, ops)[0]
            return ids_in_call_order(placed, dict(zip(groups, got, strict=True)))

        return queue_index.written(self.client, self.layout.names, call)

    # -- one job: straight to its partition --------------------------------------------------
    # A job written to a partition's own queue has an id that may route elsewhere: where it
    # routes does not have it, the others are asked (partitioned_ids.holding_sync); one of
    # them not answering: PartitionsNotReached, not JobNotFound.
    def status(self, job_id: str) -> JobState:
        """`Queue.status` on the job's partition (the id tells it; else the one holding it)."""
        return holding_sync(self, job_id, lambda p: p.status(job_id))

    def get_job(self, job_id: str) -> Job:
        """`Queue.get_job` on the job's partition."""
        return holding_sync(self, job_id, lambda p: p.get_job(job_id))

    def cancel(self, job_id: str) -> str:
        """`Queue.cancel` on the job's partition."""
        return holding_sync(self, job_id, lambda p: p.cancel(job_id))

    def reschedule(self, job_id: str, **when: Any) -> str:
        """`Queue.reschedule` on the job's partition (`delay_ms=` or `run_at=`)."""
        return holding_sync(self, job_id, lambda p: p.reschedule(job_id, **when))

    def complete(self, job_id: str, token: str, result: Any = None) -> None:
        """`Queue.complete` on the job's partition (the manual API)."""
        holding_sync(self, job_id, lambda p: p.complete(job_id, token, result))

    def result(self, job_id: str, *, timeout_s: float) -> Any:
        """`Queue.result` on the job's partition."""
        return holding_sync(self, job_id, lambda p: p.result(job_id, timeout_s=timeout_s))

    # -- merged views ------------------------------------------------------------------------
    # A read of every partition with some partitions' nodes down (or refusing for now: a slot
    # being moved) while others answer raises PartitionsNotReached: its `partial` is what the
    # call returns, of the partitions that answered (`done`); `missing` names the others.
    def counts(self) -> QueueCounts:
        """Every partition's counts (one driver call per node), summed. PartitionsNotReached
        when some partitions do not answer: `partial` is the sum of the others'."""
        each = self.run_answering(lambda p: p.ops.counts())
        return read_every("counts", self.parts, each, counts_of)

    def list_jobs(self, state: str, *, offset: int = 0, limit: int = 50) -> list[Job]:
        """`Queue.list_jobs` merged: each partition's first offset + limit (score, id) pairs
        (one driver call per node), merged in one queue's index order, then the page's records
        only (a second call). BadArgument for a page a plain queue refuses.
        PartitionsNotReached when some partitions do not answer: `partial` is the page of the
        others merged as one queue's (list_answering)."""
        left_out: dict[str, str] = {}
        jobs = list_answering(self, state, offset, limit, left_out)
        not_read("list_jobs", self.parts, left_out, jobs)
        return jobs

    def _jobs(self, ids: Sequence[str]) -> list[Job]:
        """These jobs in `ids`' order (missing ones left out), every partition's in one call."""
        chosen = [(self.layout.partition_of_id(i), i) for i in ids]
        reads = [
            (self.parts[k], self.parts[k].ops.get_jobs(g)) for k, g in group_ids(chosen).items()
        ]
        return jobs_in_order(chosen, self._run_many(reads))

    def dead_ids(self, **filters: Any) -> list[str]:
        """`Queue.dead_ids` over every partition, merged newest first by the time they died:
        one driver call per node, their scans carrying the dead_ms they merge by. `offset` /
        `limit` page the merged list: each partition reads its first offset + limit.
        PartitionsNotReached when some partitions do not answer: `partial` is the others'."""
        offset, end = dead_window(filters.pop("offset", 0), filters.pop("limit", None))
        each = self.run_answering(lambda p: p.ops.dead_scored(limit=end, **filters))
        return read_every("dead_ids", self.parts, each, dead_page(offset, end))

    def dead_scored(self, **filters: Any) -> list[list[tuple[float, str]]]:
        """Each partition's `Ops.dead_scored(**filters)` (with `limit`: each partition's first
        `limit`), one driver call per node and page round. PartitionsNotReached when some
        partitions do not answer: `partial` has [] in their place."""
        each = self.run_answering(lambda p: p.ops.dead_scored(**filters))
        return read_every("dead_scored", self.parts, each, dead_lists)

    def requeue_dead(self, ids: Sequence[str]) -> int:
        """`Queue.requeue_dead`, the ids grouped by partition, one driver call for all; an id
        not dead where it routes (written to a partition's own queue) is found dead in another
        and requeued there (two more calls: partitioned_ids.dead_change_sync)."""
        return dead_change_sync(self, lambda q, g: q.ops.requeue_dead(g), ids)

    def purge_dead(self, ids: Sequence[str]) -> int:
        """`Queue.purge_dead`, the ids grouped by partition, one driver call for all; an id
        not dead where it routes is found and purged as requeue_dead finds it."""
        return dead_change_sync(self, lambda q, g: q.ops.purge_dead(g), ids)

    # -- schedules: each in one partition ----------------------------------------------------
    def _sched(self, name: str) -> Queue:
        return self.parts[self.layout.partition_of_schedule(name)]

    def schedule(self, name: str, task: str, payload: Any = None, **kwargs: Any) -> str:
        """`Queue.schedule` (its arguments) in the schedule's partition, by its name."""
        return self._sched(name).schedule(name, task, payload, **kwargs)

    def get_schedule(self, name: str) -> Schedule:
        """`Queue.get_schedule` in the schedule's partition."""
        return self._sched(name).get_schedule(name)

    def pause_schedule(self, name: str) -> str:
        """`Queue.pause_schedule` in the schedule's partition."""
        return self._sched(name).pause_schedule(name)

    def resume_schedule(self, name: str) -> str:
        """`Queue.resume_schedule` in the schedule's partition."""
        return self._sched(name).resume_schedule(name)

    def remove_schedule(self, name: str) -> str:
        """`Queue.remove_schedule` in the schedule's partition."""
        return self._sched(name).remove_schedule(name)

    def list_schedules(self) -> list[Schedule]:
        """Every partition's schedules (`Queue.list_schedules`), sorted by name.
        PartitionsNotReached when some partitions do not answer: `partial` is the others'."""
        each = self.run_answering(lambda p: p.ops.list_schedules())
        return read_every("list_schedules", self.parts, each, schedules_of)

    def run_schedule_now(self, name: str, *, job_id: str | None = None) -> str:
        """`Queue.run_schedule_now` in the schedule's partition, the new id tagged with it."""
        k, job_id = self.layout.schedule_run(name, job_id)
        return self.parts[k].run_schedule_now(name, job_id=job_id)

    # -- the whole queue: every partition ----------------------------------------------------
    def pause(self) -> str:
        """Queue.pause on every partition: 'paused' when any was not yet, else 'already'.
        Every partition is checked first: one refusing (its config of another type, a newer
        version's storage) refuses the pause, nothing written, its error naming it.
        PartitionsNotReached when some partitions' nodes do not answer (or refuse for now)
        while others do: those are paused, the error names the rest; call it again."""
        return change_sync(self, "pause")

    def resume(self) -> str:
        """Queue.resume on every partition: 'resumed' when any was paused, else 'active'.
        Checked first and PartitionsNotReached as pause: the partitions that answered are
        resumed."""
        return change_sync(self, "resume")


def open_queue(
    target: SyncClient | str, name: str = "default", **queue_kwargs: Any
) -> Queue | PartitionedQueue:
    """The queue `name` as stored: a `PartitionedQueue` when `sched:{name}:partitions`
    exists, else a plain `Queue`. `target` is a client or a URL (connection.py's forms; a new
    connection the caller closes: `close()` or `with`, either kind). One GET here, once: N is
    fixed at creation, so the answer holds for the queue's life and no later call pays for it
    (`Queue.from_url` never reads it: a plain queue's calls stay one round trip)."""
    if isinstance(target, str):
        target = connect(target, default_retry=True)
    client = cast(redis.Redis, target)
    layout = read_layout(client, name, "open_queue")
    if layout is None:
        return Queue(client, name, **queue_kwargs)
    return PartitionedQueue(client, layout, **queue_kwargs)


def list_answering(
    q: PartitionedQueue, state: str, offset: int, limit: int, left_out: dict[str, str]
) -> list[Job]:
    """PartitionedQueue.list_jobs over the partitions that answer (run_answering), for the
    CLI: the [offset, offset + limit) page of those merged as one queue's, so consecutive
    pages neither skip nor repeat a job while the same ones answer. `left_out` (partition name
    -> its error), in and out: a partition named there is not asked (an empty page in its
    place: a task filter's next page costs no retries of a dead node again), one that does not
    answer now is added. None answering raises, as a node lost between the two reads."""
    check_page(state, offset, limit)
    asked = [p for p in q.parts if p.name not in left_out]
    each = q._answering(lambda p: listed_scored(p.ops, state, 0, offset + limit), asked)
    chosen = chosen_page(q, asked, each, (state, offset, limit), left_out)
    reads = [(q.parts[k], q.parts[k].ops.get_jobs(g)) for k, g in group_ids(chosen).items()]
    return jobs_in_order(chosen, q._run_many(reads))


def requeue_order(q: Queue | PartitionedQueue, ids: Sequence[str]) -> list[str]:
    """`ids` in the order to requeue them over several calls (the CLI's chunks): each parent
    before its parked children (operations/dead_filter.py parents_first), a partitioned queue's
    within each partition (a flow is one partition's), the one whose dead list holds the id
    (partitioned_ids.dead_where; one no longer dead: where it routes)."""
    if isinstance(q, Queue):
        return q._run(parents_first(q.keys, ids))
    where = dead_where(q, ids)
    groups: dict[int, list[str]] = {}
    for i in dict.fromkeys(check_id_list(ids)):
        groups.setdefault(where.get(i, q.layout.partition_of_id(i)), []).append(i)
    per = q._run_many([(q.parts[k], parents_first(q.parts[k].keys, g)) for k, g in groups.items()])
    return [i for g in per for i in g]
