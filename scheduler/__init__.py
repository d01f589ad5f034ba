"""scheduler: a Redis-backed job scheduler with leases, fencing tokens, retries and dead letters."""

# Every public name is imported on first use (PEP 562): a web app that only enqueues
# (`from scheduler import Queue`) does not load the worker's runtime, the asyncio client or the
# dashboard. tests/test_import_cost.py checks what `import scheduler` loads.

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker and the docs see them
    from scheduler.client.aio import AsyncQueue
    from scheduler.client.partitioned import PartitionedQueue, PartitionsNotReached, open_queue
    from scheduler.client.partitioned_aio import AsyncPartitionedQueue, open_queue_async
    from scheduler.client.partitioned_lease_plan import PartitionedClaimBatch
    from scheduler.client.queue import Queue
    from scheduler.core.backoff import Backoff
    from scheduler.core.connection import connect, connect_async
    from scheduler.core.errors import (
        BadArgument,
        CorruptKey,
        InvalidPayload,
        JobCancelled,
        JobDead,
        JobNotFound,
        JobTimeout,
        LeaseExpired,
        LeaseRefused,
        NewerStorage,
        NoReplicas,
        NotDurable,
        ResultTimeout,
        RunStopped,
        ScheduleNotFound,
        SchedulerError,
        StaleToken,
        UnknownTask,
        UnreadableRecord,
    )
    from scheduler.core.models import (
        ClaimBatch,
        ClaimedJob,
        FailOutcome,
        Job,
        JobSpec,
        JobState,
        QueueCounts,
    )
    from scheduler.core.partitions import PartitionMismatch
    from scheduler.schedules.stored import Schedule
    from scheduler.worker.registry import JobContext, JobOutcome, Registry, TaskHandle
    from scheduler.worker.retry_later import RetryLater

# Public name -> the module it is imported from on first access.
_HOMES: dict[str, str] = {
    "AsyncPartitionedQueue": "scheduler.client.partitioned_aio",
    "AsyncQueue": "scheduler.client.aio",
    "Backoff": "scheduler.core.backoff",
    "BadArgument": "scheduler.core.errors",
    "ClaimBatch": "scheduler.core.models",
    "ClaimedJob": "scheduler.core.models",
    "CorruptKey": "scheduler.core.errors",
    "FailOutcome": "scheduler.core.models",
    "InvalidPayload": "scheduler.core.errors",
    "Job": "scheduler.core.models",
    "JobCancelled": "scheduler.core.errors",
    "JobContext": "scheduler.worker.registry",
    "JobDead": "scheduler.core.errors",
    "JobNotFound": "scheduler.core.errors",
    "JobOutcome": "scheduler.worker.registry",
    "JobSpec": "scheduler.core.models",
    "JobState": "scheduler.core.models",
    "JobTimeout": "scheduler.core.errors",
    "LeaseExpired": "scheduler.core.errors",
    "LeaseRefused": "scheduler.core.errors",
    "NewerStorage": "scheduler.core.errors",
    "NoReplicas": "scheduler.core.errors",
    "NotDurable": "scheduler.core.errors",
    "PartitionMismatch": "scheduler.core.partitions",
    "PartitionedClaimBatch": "scheduler.client.partitioned_lease_plan",
    "PartitionedQueue": "scheduler.client.partitioned",
    "PartitionsNotReached": "scheduler.client.partitioned",
    "Queue": "scheduler.client.queue",
    "QueueCounts": "scheduler.core.models",
    "Registry": "scheduler.worker.registry",
    "ResultTimeout": "scheduler.core.errors",
    "RetryLater": "scheduler.worker.retry_later",
    "RunStopped": "scheduler.core.errors",
    "Schedule": "scheduler.schedules.stored",
    "ScheduleNotFound": "scheduler.core.errors",
    "SchedulerError": "scheduler.core.errors",
    "StaleToken": "scheduler.core.errors",
    "TaskHandle": "scheduler.worker.registry",
    "UnknownTask": "scheduler.core.errors",
    "UnreadableRecord": "scheduler.core.errors",
    "connect": "scheduler.core.connection",
    "connect_async": "scheduler.core.connection",
    "open_queue": "scheduler.client.partitioned",
    "open_queue_async": "scheduler.client.partitioned_aio",
}
# Sub-packages that `import scheduler` used to load, still reachable as attributes
# (`scheduler.core.errors` after a bare `import scheduler`).
_SUBPACKAGES = frozenset({"admin", "client", "core", "operations", "schedules", "worker"})

__all__ = [
    "AsyncPartitionedQueue",
    "AsyncQueue",
    "Backoff",
    "BadArgument",
    "ClaimBatch",
    "ClaimedJob",
    "CorruptKey",
    "FailOutcome",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobDead",
    "JobNotFound",
    "JobOutcome",
    "JobSpec",
    "JobState",
    "JobTimeout",
    "LeaseExpired",
    "LeaseRefused",
    "NewerStorage",
    "NoReplicas",
    "NotDurable",
    "PartitionMismatch",
    "PartitionedClaimBatch",
    "PartitionedQueue",
    "PartitionsNotReached",
    "Queue",
    "QueueCounts",
    "Registry",
    "ResultTimeout",
    "RetryLater",
    "RunStopped",
    "Schedule",
    "ScheduleNotFound",
    "SchedulerError",
    "StaleToken",
    "TaskHandle",
    "UnknownTask",
    "UnreadableRecord",
    "connect",
    "connect_async",
    "open_queue",
    "open_queue_async",
]


if not TYPE_CHECKING:  # hidden from mypy: a misspelt `scheduler.X` stays a type error

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is not None:
            get = lambda: getattr(importlib.import_module(home), name)  # noqa: E731
        elif name in _SUBPACKAGES:  # each loads its own modules on first access
            get = lambda: importlib.import_module(f"{__name__}.{name}")  # noqa: E731
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        # Imported here: `import scheduler` alone loads no submodule.
        return importlib.import_module("scheduler._lazy").load(globals(), name, get)


def __dir__() -> list[str]:  # the public names, loaded or not; not this module's helpers
    return sorted({n for n in globals() if n.startswith("__")} | set(__all__) | _SUBPACKAGES)
