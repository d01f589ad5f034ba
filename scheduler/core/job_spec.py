"""JobSpec: one job to enqueue, as the caller describes it (checked by core/codec.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.core.backoff import Backoff


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue (see Queue.enqueue for the meaning of each field)."""

    task: str
    payload: Any = None
    delay_ms: int | None = None
    run_at: datetime | None = None
    max_attempts: int = 5
    backoff: Backoff | None = None
    key: str | None = None
    jitter_ms: int = 0
    timeout_ms: int = 0
    job_id: str | None = None
    result_ttl_ms: int | None = None
    keep_payload: bool = False
    # Flow control (docs/flow-control.md, checked by scheduler/core/flow.py).
    priority: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: Any = None
    rate_key: str | None = None
    after: Sequence[str] | None = None
    start_within_ms: int | None = None
    key_ttl_ms: int | None = None
    debounce: bool = False

    # Written out, not generated: a frozen dataclass's __init__ sets each of the 21 fields
    # through object.__setattr__: 1.9 us a spec, 0.7 written out (bench/client_overhead.py).
    # tests/test_models_fast_init.py checks the parameters match the fields and defaults.
    def __init__(
        self,
        task: str,
        payload: Any = None,
        delay_ms: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        key: str | None = None,
        jitter_ms: int = 0,
        timeout_ms: int = 0,
        job_id: str | None = None,
        result_ttl_ms: int | None = None,
        keep_payload: bool = False,
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        rate_key: str | None = None,
        after: Sequence[str] | None = None,
        start_within_ms: int | None = None,
        key_ttl_ms: int | None = None,
        debounce: bool = False,
    ) -> None:
        self.__dict__.update(
            task=task,
            payload=payload,
            delay_ms=delay_ms,
            run_at=run_at,
            max_attempts=max_attempts,
            backoff=backoff,
            key=key,
            jitter_ms=jitter_ms,
            timeout_ms=timeout_ms,
            job_id=job_id,
            result_ttl_ms=result_ttl_ms,
            keep_payload=keep_payload,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_key=rate_key,
            after=after,
            start_within_ms=start_within_ms,
            key_ttl_ms=key_ttl_ms,
            debounce=debounce,
        )


def spec_options(spec: JobSpec) -> dict[str, Any]:
    """The keyword arguments of `enqueue` that make `spec` again (every field but task and
    payload): a spec sent on through an enqueue method."""
    return {k: v for k, v in spec.__dict__.items() if k not in ("task", "payload")}
