"""Where a job of a partitioned queue is, for the commands that act on a job by id (`jobs show`,
`jobs reschedule`, `jobs cancel ID`): a job written to a partition's own queue has an untagged
id that may route to another partition, so each looks where the job is
(client/partitioned_ids.py), and a partition whose node does not answer is named (exit 3)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import redis

from scheduler.cli.common import Unreachable
from scheduler.client.partitioned import PartitionedQueue, PartitionsNotReached
from scheduler.client.partitioned_ids import held_where, holding_sync
from scheduler.client.queue import Queue
from scheduler.core.connection import UNREACHABLE
from scheduler.core.safety import safe

T = TypeVar("T")


def silent_partition(q: Queue, queue: str, job_id: str, exc: Exception) -> str | None:
    """'partition <p> of queue <q>, which holds job <id>, does not answer: <error>' when `exc`
    is the node of `q`, the partition of `queue` holding `job_id`, not answering; None for a
    plain queue's error, a login refused (exit 4) or any other error: left as they are."""
    if not isinstance(exc, UNREACHABLE) or isinstance(exc, redis.AuthenticationError):
        return None
    if q.name == queue:
        return None
    why = f"partition {q.name} of queue {queue!r}, which holds job {job_id}, does not answer"
    return safe(f"{why}: {exc}")


@contextmanager
def holding_partition(q: Queue, queue: str, job_id: str) -> Iterator[None]:
    """A call on `q`, the partition of `queue` holding `job_id`: its node not answering is
    named as silent_partition says (exit 3). Any other error is left as it is."""
    try:
        yield
    except UNREACHABLE as exc:
        words = silent_partition(q, queue, job_id, exc)
        if words is None:
            raise
        raise Unreachable(words) from None


def held_call(
    opened: Queue | PartitionedQueue, queue: str, job_id: str, call: Callable[[Queue], T]
) -> T:
    """call(the partition of `opened` that holds `job_id`; a plain queue: itself): where the id
    routes, else where the job is (partitioned_ids.holding_sync). The node of the partition
    called not answering: named (holding_partition, exit 3); the job in none of the partitions
    that answered while another did not: those named (exit 3), not 'no job' (exit 1)."""
    if isinstance(opened, Queue):
        return call(opened)

    def named(p: Queue) -> T:
        with holding_partition(p, queue, job_id):
            return call(p)

    try:
        return holding_sync(opened, job_id, named)
    except PartitionsNotReached as exc:
        raise Unreachable(safe(exc)) from None


def by_holding(
    q: Queue | PartitionedQueue, ids: Sequence[str]
) -> tuple[list[tuple[Queue, list[str]]], dict[str, str]]:
    """`ids` (each once) grouped by the partition holding each (partitioned_ids.held_where: one
    missing everywhere goes where it routes; a plain queue: itself), and id -> why it is left
    out: in none of the partitions that answered while one it may be in did not."""
    if isinstance(q, Queue):
        return [(q, list(dict.fromkeys(ids)))], {}
    where, why = held_where(q, ids)
    groups: dict[int, list[str]] = {}
    for i, k in where.items():
        groups.setdefault(k, []).append(i)
    return [(q.parts[k], g) for k, g in groups.items()], why
