"""Every type a user of the public API meets is importable from `scheduler` itself."""

from __future__ import annotations

import inspect

import scheduler
from scheduler.core import errors, models
from scheduler.worker import registry


def test_every_public_error_and_model_is_exported() -> None:
    wanted = {
        name
        for module in (errors, models)
        for name, obj in vars(module).items()
        if inspect.isclass(obj) and obj.__module__ == module.__name__ and not name.startswith("_")
    }
    # Schedule: what get_schedule / list_schedules return; the partitioned twins: what
    # open_queue / open_queue_async return for a partitioned name.
    wanted |= {"Registry", "JobContext", "Queue", "AsyncQueue", "Backoff", "Schedule"}
    wanted |= {"PartitionedQueue", "AsyncPartitionedQueue", "PartitionedClaimBatch"}  # + claim's
    missing = sorted(n for n in wanted if n not in scheduler.__all__)
    assert missing == [], missing


def test_every_exported_name_resolves() -> None:
    for name in scheduler.__all__:
        assert getattr(scheduler, name) is not None, name
    assert scheduler.Registry is registry.Registry
