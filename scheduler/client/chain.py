"""Chains on top of dependencies (docs/flow-control.md): each step is enqueued `after` the one
before it, so it runs once that one is done; a step reads its parent's result with
`Queue.result(parent_id, ...)` (the parent's id is in the step's payload as `parent`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.client.queue import Queue


def chain(queue: Queue, steps: Sequence[tuple[str, Any]], **options: Any) -> list[str]:
    """Enqueue (task, payload) steps, each after the previous; returns their ids in order.
    A step's payload is sent as {"payload": payload, "parent": <previous id or None>};
    `options` (priority, max_attempts, ...) apply to every step. If a step ends dead or
    cancelled, the steps after it are parked with the reason."""
    ids: list[str] = []
    for task, payload in steps:
        parent = ids[-1] if ids else None
        after = [parent] if parent else None
        ids.append(
            queue.enqueue(task, {"payload": payload, "parent": parent}, after=after, **options)
        )
    return ids
