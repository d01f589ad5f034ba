"""Chains on top of dependencies (docs/flow-control.md): each step is enqueued `after` the one
before it, so it runs once that one is done; a step reads its parent's result with
`Queue.result(parent_id, ...)` (the parent's id is in the step's payload as `parent`).

A chain is one `enqueue_many` call (one script call): every step is checked first and all are
written or none, and the ids are made here, so a chain re-sent after a lost reply is not
enqueued twice. On a partitioned queue a chain is one partition's (a job and its parents
share one): its ids are tagged with the partition, picked round robin per chain, so chains
spread over the partitions and each is still one script call."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.client.aio import AsyncQueue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.client.queue import Queue
from scheduler.core.codec import new_job_id
from scheduler.core.errors import BadArgument
from scheduler.core.limits import ENQUEUE_PER_CALL, ENQUEUE_WORK_PER_CALL
from scheduler.core.models import JobSpec
from scheduler.core.partitions import Layout

# Options that name one job cannot apply to every step.
_PER_JOB = ("key", "job_id", "after")
# Which partition of a partitioned queue the next chain goes to (round robin, per process).
_SPREAD = itertools.count()


def chain(
    queue: Queue | PartitionedQueue, steps: Sequence[tuple[str, Any]], **options: Any
) -> list[str]:
    """Enqueue (task, payload) steps, each after the previous; returns their ids in order.
    A step's payload is sent as {"payload": payload, "parent": <previous id or None>};
    `options` (priority, max_attempts, ...) apply to every step (not key, job_id, after:
    BadArgument). All steps are written or none. If a step ends dead or cancelled, the steps
    after it are parked with the reason. A PartitionedQueue's chain is one partition's."""
    if not isinstance(queue, Queue | PartitionedQueue):
        raise BadArgument(
            f"chain() takes a Queue or PartitionedQueue (achain() the asyncio ones), got {queue!r}"
        )
    specs = chain_specs(steps, options, _id_maker(queue))
    return queue.enqueue_many(specs, batch_size=max(len(specs), 1))


async def achain(
    queue: AsyncQueue | AsyncPartitionedQueue, steps: Sequence[tuple[str, Any]], **options: Any
) -> list[str]:
    """`chain` for an AsyncQueue or AsyncPartitionedQueue."""
    if not isinstance(queue, AsyncQueue | AsyncPartitionedQueue):
        raise BadArgument(
            f"achain() takes an AsyncQueue or AsyncPartitionedQueue (chain() the sync ones), "
            f"got {queue!r}"
        )
    specs = chain_specs(steps, options, _id_maker(queue))
    return await queue.enqueue_many(specs, batch_size=max(len(specs), 1))


def _id_maker(queue: object) -> Callable[[str | None], str]:
    """new id (parent -> id): a plain one, or on a partitioned queue one tagged with the
    partition of this chain (Layout.route: the first step's picked round robin, each next one
    its parent's)."""
    layout = getattr(queue, "layout", None)
    if not isinstance(layout, Layout):
        return lambda _parent: new_job_id()
    spread = next(_SPREAD)
    return lambda parent: str(
        layout.route(None, None, spread, None if parent is None else [parent])[1]
    )


def chain_specs(
    steps: Sequence[tuple[str, Any]],
    options: dict[str, Any],
    new_id: Callable[[str | None], str] = lambda _parent: new_job_id(),
) -> list[JobSpec]:
    """The steps as JobSpecs with ids made here (new_id(parent)), each `after` the one
    before."""
    given = [k for k in _PER_JOB if k in options]
    if given:
        raise BadArgument(f"chain() options apply to every step: {', '.join(given)} cannot")
    if isinstance(steps, str | bytes) or not isinstance(steps, Sequence):
        raise BadArgument(f"steps must be a list of (task, payload), got {steps!r:.100}")
    # One script call, so all are written or none: at most ENQUEUE_PER_CALL steps, each naming
    # one parent, so n steps are 2n - 1 jobs + parents, within ENQUEUE_WORK_PER_CALL (2,000).
    if len(steps) > ENQUEUE_PER_CALL or 2 * len(steps) - 1 > ENQUEUE_WORK_PER_CALL:
        raise BadArgument(f"a chain has at most {ENQUEUE_PER_CALL} steps")
    specs: list[JobSpec] = []
    parent: str | None = None
    for step in steps:
        if not (isinstance(step, tuple | list) and len(step) == 2):
            raise BadArgument(f"a step is a (task, payload) pair, got {step!r:.100}")
        task, payload = step
        job_id = new_id(parent)
        specs.append(
            JobSpec(
                task,
                {"payload": payload, "parent": parent},
                job_id=job_id,
                after=None if parent is None else [parent],
                **options,
            )
        )
        parent = job_id
    return specs
