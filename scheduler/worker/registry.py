"""Task registration: handlers registered by name on a Registry, with per-task defaults.

    registry = Registry()

    @registry.task(name="email.send", max_attempts=3, timeout_s=30, non_retryable=(ValueError,))
    async def send(payload, ctx):
        ...

A handler is a plain function (run in a thread) or a coroutine function (run on the worker's
event loop). It receives the decoded JSON payload and a JobContext."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, JobCancelled, LeaseExpired, UnknownTask
from scheduler.core.models import JobSpec

Handler = Callable[[Any, "JobContext"], Any]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    fn: Handler
    is_async: bool
    max_attempts: int = 5
    backoff: Backoff | None = None
    timeout_s: float | None = None  # used when the job itself carries no timeout_ms
    non_retryable: tuple[type[BaseException], ...] = ()
    result_ttl_ms: int | None = None  # outcome retention; None: the worker's setting

    def timeout_for(self, job_timeout_ms: int) -> float | None:
        """The job's own timeout wins; else the task default; None = no limit."""
        if job_timeout_ms > 0:
            return job_timeout_ms / 1000
        return self.timeout_s


@dataclass
class JobContext:
    """What a handler knows about its run. `stopped` is set (and async handlers are cancelled)
    when the worker must not report a result any more: lease expired, cancelled, timed out, or
    shut down past the grace period. Key idempotent side effects on (job_id, fence)."""

    job_id: str
    task: str
    queue: str
    attempt: int
    max_attempts: int
    token: str
    fence: int
    run_at_ms: int
    claimed_ms: int
    stop_reason: str | None = None  # 'expired' | 'cancelled' | 'timeout' | 'shutdown'
    _event: threading.Event | None = field(default=None, repr=False)

    @property
    def stopped(self) -> threading.Event:
        """Set when the run must stop; wait on it from a thread (made on first use: most
        handlers never look, and a job costs microseconds)."""
        if self._event is None:
            self._event = threading.Event()
            if self.stop_reason is not None:
                self._event.set()
        return self._event

    @property
    def lease_expired(self) -> bool:
        return self.stop_reason == "expired"

    @property
    def cancelled(self) -> bool:
        return self.stop_reason == "cancelled"

    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def raise_if_stopped(self) -> None:
        """For long sync loops: raise instead of carrying on with a lease we no longer hold."""
        if self.stop_reason is None:
            return
        if self.stop_reason == "cancelled":
            raise JobCancelled(self.job_id, self.token, "job was cancelled")
        raise LeaseExpired(self.job_id, self.token, self.stop_reason or "expired")

    def _stop(self, reason: str) -> bool:
        """Mark the run stopped; the first reason wins. Returns False if already stopped."""
        if self.stop_reason is not None:
            return False
        self.stop_reason = reason  # before the event check: see `stopped`
        if self._event is not None:
            self._event.set()
        return True


class Registry:
    """Handlers by task name."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}

    def task(
        self,
        name: str | None = None,
        *,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout_s: float | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
        result_ttl_ms: int | None = None,
    ) -> Callable[[Handler], Handler]:
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise BadArgument(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if timeout_s is not None and not (isinstance(timeout_s, int | float) and timeout_s > 0):
            raise BadArgument(f"timeout_s must be a number > 0, got {timeout_s!r}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise BadArgument(f"backoff must be a Backoff, got {backoff!r}")
        if result_ttl_ms is not None:
            codec.check_int(result_ttl_ms, "result_ttl_ms")
        for exc in non_retryable:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise BadArgument(f"non_retryable must hold exception classes, got {exc!r}")

        def register(fn: Handler) -> Handler:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            if task_name in self._tasks:
                raise BadArgument(f"task {task_name!r} is already registered")
            self._tasks[task_name] = TaskSpec(
                task_name, fn, inspect.iscoroutinefunction(fn), max_attempts, backoff,
                timeout_s, tuple(non_retryable), result_ttl_ms,
            )  # fmt: skip
            return fn

        return register

    def get(self, name: str) -> TaskSpec:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(f"no handler registered for task {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def job_spec(self, name: str, payload: Any = None, **overrides: Any) -> JobSpec:
        """A JobSpec carrying the task's defaults (max_attempts, backoff, timeout)."""
        spec = self.get(name)
        fields: dict[str, Any] = {"max_attempts": spec.max_attempts, "backoff": spec.backoff}
        if spec.timeout_s is not None:
            fields["timeout_ms"] = round(spec.timeout_s * 1000)
        fields.update(overrides)
        return JobSpec(name, payload, **fields)
