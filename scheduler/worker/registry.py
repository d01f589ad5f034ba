"""Task registration: handlers registered by name on a Registry, with per-task defaults.

    registry = Registry()

    @registry.task(name="email.send", max_attempts=3, timeout_s=30, non_retryable=(ValueError,))
    async def send(payload, ctx):
        ...

A handler is a plain function (run in a thread) or a coroutine function (run on the worker's
event loop). It receives the decoded JSON payload and a JobContext.

`registry.task` returns a TaskHandle: still callable as the function, and
`send.enqueue(q, payload, delay_ms=...)` enqueues with the task's defaults (max_attempts,
backoff, timeout) unless overridden. With `payload_type=` (a dataclass, a TypedDict, or a pydantic
model) the payload is checked at enqueue and decoded into that type for the handler; the wire
stays JSON. A producer without the handlers can still `q.enqueue("email.send", {...})`, but then
the task's defaults do not apply (they live here, not in Redis)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import check_backoff
from scheduler.core.errors import BadArgument, UnknownTask
from scheduler.core.flow import check_flow
from scheduler.core.keys import check_queue_name
from scheduler.core.models import JobSpec

# Re-exported: the registry's public names stay importable from here.
from scheduler.worker.context import JobContext
from scheduler.worker.middleware import (
    Middleware,
    check_middleware,
    is_async_callable,
    is_generator_function,
    wrap,
)
from scheduler.worker.outcomes import JobOutcome, OutcomeHook
from scheduler.worker.payloads import (
    Handler,
    check_payload_type,
    decode_payload,
    decoding,
    encode_payload,
)
from scheduler.worker.task_handle import (
    F,
    TaskHandle,
    TaskSpec,
    check_task_name,
    check_timeout_s,
)

H = TypeVar("H", bound=OutcomeHook)
M = TypeVar("M", bound=Middleware)

__all__ = [
    "Handler",
    "JobContext",
    "JobOutcome",
    "Registry",
    "TaskHandle",
    "TaskSpec",
    "decode_payload",
    "encode_payload",
]


def _check_handler(fn: Any) -> None:
    """A handler is called as fn(payload, ctx): one that cannot take that would fail every
    attempt, so it is refused here."""
    if not callable(fn):
        raise BadArgument(f"a task handler must be callable, got {fn!r}")
    if any(map(is_generator_function, (fn, getattr(fn, "__call__", None)))):  # noqa: B004
        raise BadArgument(
            f"task handler {getattr(fn, '__qualname__', fn)} is a generator function: its "
            "generator is no result (every job of the task would be parked as InvalidResult)"
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without one: left to the call
        return
    try:
        sig.bind(None, None)
    except TypeError:
        raise BadArgument(
            f"task handler {getattr(fn, '__qualname__', fn)}{sig} must accept "
            "(payload, ctx): it is called with the job's payload and its JobContext"
        ) from None


def _check_hook(fn: Any) -> None:
    """Refused here as handlers are: a generator function's body never runs (nothing logged),
    and a hook that cannot take one JobOutcome (the middleware's (outcome, ctx) by mistake)
    would log a TypeError on every outcome instead of doing its work."""
    what = getattr(fn, "__qualname__", fn)
    if any(map(is_generator_function, (fn, getattr(fn, "__call__", None)))):  # noqa: B004
        raise BadArgument(
            f"outcome hook {what} is a generator function: calling it runs none of its body"
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without one: left to the call
        return
    try:
        sig.bind(None)
    except TypeError:
        raise BadArgument(
            f"outcome hook {what}{sig} must accept one argument: it is called with the "
            "JobOutcome (its ctx is outcome.ctx)"
        ) from None


class Registry:
    """Handlers by task name."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}
        self.outcome_hooks: list[OutcomeHook] = []  # worker/outcomes.py
        self._middleware: list[tuple[Middleware, bool]] = []  # (fn, is_async), outermost first

    def middleware(self, fn: M) -> M:
        """Decorator: run `fn(call_next, payload, ctx)` around every run of every task of its
        kind, registered before or after it: a plain function around the sync handlers (in
        their thread), a coroutine function around the async ones (worker/middleware.py). It
        must call `call_next(payload, ctx)` (awaited, when async) and return what the run
        returns; what it raises is the run's failure. The first registered is the outermost.
        Raises BadArgument for what cannot be called as fn(call_next, payload, ctx)."""
        self._middleware.append((fn, check_middleware(fn)))
        for name, spec in self._tasks.items():
            handler = spec.fn if spec.unwrapped is None else spec.unwrapped
            self._tasks[name] = dataclasses.replace(
                spec, fn=wrap(handler, spec.is_async, self._middleware), unwrapped=handler
            )
        return fn

    def on_outcome(self, fn: H) -> H:
        """Decorator: call `fn(outcome: JobOutcome)` on each job outcome a worker running this
        registry counts (`done`, `retry`, `dead`, `expired`, `cancelled`, `timeout`, `stale`
        (also a job gone), `released`; the metrics' and logs' words), after the server answered. It
        runs on the worker's event loop: keep it quick. What it raises is logged and changes
        nothing. Raises BadArgument for a coroutine or generator function, a non-callable, or
        one that cannot be called with one argument."""
        if not callable(fn) or is_async_callable(fn):
            raise BadArgument(
                f"an outcome hook must be a plain function taking one JobOutcome, got {fn!r}: "
                "it runs on the worker's event loop (start a task there for async work)"
            )
        _check_hook(fn)
        self.outcome_hooks.append(fn)
        return fn

    def task(
        self,
        name: str | None = None,
        *,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout_s: float | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
        result_ttl_ms: int | None = None,
        payload_type: type | None = None,
        queue: str | None = None,
        keep_payload: bool = False,
        priority: int = 0,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        start_within_ms: int | None = None,
    ) -> Callable[[F], TaskHandle[F]]:
        """Decorator: register the function as the handler of task `name`.

        The handler is called as `fn(payload, ctx)` (sync, run in a thread, or async).

        Args:
            name: the task name (1-200 characters of `[A-Za-z0-9_.:/-]`); default
                `module.qualname` of the function.
            max_attempts: default attempt budget of its jobs, >= 1.
            backoff: default retry delays (`Backoff()` when None).
            timeout_s: default time limit of one attempt, > 0 s; None = no limit.
            non_retryable: a tuple of exception classes that park the job at once instead of
                retrying (a bare class is refused).
            result_ttl_ms: how long a completed job's record and result are kept, in
                [1 ms, 366 days] (default: the worker's `--result-ttl-ms`).
            payload_type: a dataclass, TypedDict or pydantic model: checked at enqueue,
                decoded for the handler (still JSON on the wire).
            queue: the one queue its jobs may be enqueued on: `enqueue` on another queue is
                refused (the queue is still passed to `enqueue`; workers are not routed).
            keep_payload: its jobs keep their payload once done (default: a finished job
                keeps only what status and result need); a job's own `keep_payload` wins.
            priority: default priority of its jobs, 0..9 (docs/flow-control.md).
            concurrency_limit: at most this many of its jobs leased at once (the task name
                is the concurrency key); a job's own key and limit win.
            rate_limit: at most N starts of this task per window, e.g. '10/1s'.
            start_within_ms: its jobs start within this many ms of their run time or not at
                all (parked: 'start deadline passed'); a job's own `start_within_ms` wins.

        Returns:
            A decorator that returns a `TaskHandle` (callable as the function; `enqueue`,
            `aenqueue` and `job_spec` apply the defaults above).

        Raises:
            BadArgument: an argument is refused, the name is invalid or already registered,
                or the function cannot be called as `fn(payload, ctx)`."""
        if name is not None and not isinstance(name, str):
            # A bare `@registry.task` passes the function as the name: the function would be
            # replaced by the decorator and nothing registered (UnknownTask at every attempt).
            raise BadArgument(
                f"@registry.task takes the task's name, got {name!r}: write"
                " @registry.task('name'), or @registry.task() for module.qualname"
            )
        # Each within the range its first enqueue checks (codec.LIMITS), so a registration the
        # enqueue would refuse is refused here.
        codec.check_int(max_attempts, "max_attempts")
        if timeout_s is not None:
            check_timeout_s(timeout_s)
        if backoff is not None:
            check_backoff(backoff)
        if result_ttl_ms is not None:
            codec.check_int(result_ttl_ms, "result_ttl_ms")
        if start_within_ms is not None:
            codec.check_int(start_within_ms, "start_within_ms")
        if isinstance(non_retryable, type | str) or not isinstance(non_retryable, Iterable):
            raise BadArgument(
                f"non_retryable must be a tuple of exception classes, got {non_retryable!r}"
            )
        non_retryable = tuple(non_retryable)  # read once: a generator is empty the second time
        for exc in non_retryable:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise BadArgument(f"non_retryable must hold exception classes, got {exc!r}")
        if payload_type is not None:
            check_payload_type(payload_type)
        if not isinstance(keep_payload, bool):
            raise BadArgument(f"keep_payload must be a bool, got {keep_payload!r}")
        if queue is not None:
            check_queue_name(queue)

        def register(handle_of: F) -> TaskHandle[F]:
            # A handle registered again (stacked @registry.task: a rename while old jobs
            # drain, a second registry) is its function: the handle's own __call__ is sync,
            # and an async task taken for sync would have every job parked (a coroutine).
            fn: Any = handle_of
            while isinstance(fn, TaskHandle):
                fn = fn.fn
            task_name = f"{fn.__module__}.{fn.__qualname__}" if name is None else name
            check_task_name(task_name, given=name is not None)
            _check_handler(fn)
            flow: dict[str, Any] = {"priority": priority, "rate_limit": rate_limit}
            if concurrency_limit is not None:
                flow |= {"concurrency_key": task_name, "concurrency_limit": concurrency_limit}
            check_flow(task_name, **flow)  # refused at registration, not at the first enqueue
            if task_name in self._tasks:
                raise BadArgument(f"task {task_name!r} is already registered")
            is_async = is_async_callable(fn)
            run = fn if payload_type is None else decoding(fn, payload_type, is_async)
            spec = TaskSpec(
                task_name,
                wrap(run, is_async, self._middleware),
                is_async,
                max_attempts,
                backoff,
                timeout_s,
                tuple(non_retryable),
                result_ttl_ms,
                payload_type,
                queue,
                keep_payload=keep_payload,
                start_within_ms=start_within_ms,
                flow=tuple((k, v) for k, v in flow.items() if v is not None),
                unwrapped=run if self._middleware else None,
            )
            self._tasks[task_name] = spec
            handle: TaskHandle[F] = TaskHandle(fn, spec)
            return handle

        return register

    def get(self, name: str) -> TaskSpec:
        """The registration of task `name`. Raises UnknownTask when none is registered."""
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(f"no handler registered for task {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def names(self) -> list[str]:
        """Every registered task name, sorted."""
        return sorted(self._tasks)

    def job_spec(self, name: str, payload: Any = None, **overrides: Any) -> JobSpec:
        """`TaskHandle.job_spec` of task `name`: its defaults (max_attempts, backoff, timeout,
        retention, flow options) and its payload_type's check and encoding."""
        spec = self.get(name)
        return TaskHandle(spec.fn, spec).job_spec(payload, **overrides)
