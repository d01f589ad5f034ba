"""A registry for tests/test_outcome_hook_time.py: an outcome hook that never returns."""

from __future__ import annotations

import time
from typing import Any

from scheduler import JobOutcome
from scheduler.worker.registry import JobContext, Registry

registry = Registry()


@registry.task(name="echo")
def echo(payload: Any, ctx: JobContext) -> Any:
    return payload


@registry.on_outcome
def hang(outcome: JobOutcome) -> None:
    time.sleep(3600)
