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
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_type_hints, is_typeddict

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, JobCancelled, LeaseExpired, UnknownTask
from scheduler.core.models import JobSpec

if TYPE_CHECKING:
    from scheduler.client.aio import AsyncQueue
    from scheduler.client.queue import Queue

Handler = Callable[[Any, "JobContext"], Any]
F = TypeVar("F", bound=Callable[..., Any])


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
    payload_type: type | None = None  # checked at enqueue, decoded for the handler
    queue: str | None = None  # the queue this task's handle enqueues on (checked), None: any

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
        """True once the lease lapsed: another worker may run the job now, so stop."""
        return self.stop_reason == "expired"

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled (seen at a heartbeat): its result will be refused."""
        return self.stop_reason == "cancelled"

    def should_stop(self) -> bool:
        """True once the run must stop (lease lapsed, cancelled, timed out or shutting down)."""
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
        payload_type: type | None = None,
        queue: str | None = None,
    ) -> Callable[[F], TaskHandle[F]]:
        """Decorator: register the function as the handler of task `name`.

        The handler is called as `fn(payload, ctx)` (sync, run in a thread, or async).

        Args:
            name: the task name (1-200 characters of `[A-Za-z0-9_.:/-]`); default
                `module.qualname` of the function.
            max_attempts: default attempt budget of its jobs, >= 1.
            backoff: default retry delays (`Backoff()` when None).
            timeout_s: default time limit of one attempt, > 0 s; None = no limit.
            non_retryable: exception classes that park the job at once instead of retrying.
            result_ttl_ms: how long a completed job's record and result are kept, in
                [1 ms, 366 days] (default: the worker's `--result-ttl-ms`).
            payload_type: a dataclass, TypedDict or pydantic model: checked at enqueue,
                decoded for the handler (still JSON on the wire).
            queue: the queue the task handle enqueues on by default.

        Returns:
            A decorator that returns a `TaskHandle` (callable as the function; `enqueue`,
            `aenqueue` and `job_spec` apply the defaults above).

        Raises:
            BadArgument: an argument is refused, or the name is already registered."""
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
        if payload_type is not None and _payload_kind(payload_type) is None:
            raise BadArgument(
                "payload_type must be a dataclass, TypedDict or pydantic model,"
                f" got {payload_type!r}"
            )
        if queue is not None and not (isinstance(queue, str) and queue):
            raise BadArgument(f"queue must be a non-empty str, got {queue!r}")

        def register(fn: F) -> TaskHandle[F]:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            if task_name in self._tasks:
                raise BadArgument(f"task {task_name!r} is already registered")
            is_async = inspect.iscoroutinefunction(fn)
            run = fn if payload_type is None else _decoding(fn, payload_type, is_async)
            spec = TaskSpec(
                task_name,
                run,
                is_async,
                max_attempts,
                backoff,
                timeout_s,
                tuple(non_retryable),
                result_ttl_ms,
                payload_type,
                queue,
            )
            self._tasks[task_name] = spec
            return TaskHandle(fn, spec)

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
        """A JobSpec carrying the task's defaults (max_attempts, backoff, timeout)."""
        spec = self.get(name)
        fields: dict[str, Any] = {"max_attempts": spec.max_attempts, "backoff": spec.backoff}
        if spec.timeout_s is not None:
            fields["timeout_ms"] = round(spec.timeout_s * 1000)
        fields.update(overrides)
        return JobSpec(name, payload, **fields)


def _payload_kind(tp: type) -> str | None:
    if dataclasses.is_dataclass(tp):
        return "dataclass"
    if is_typeddict(tp):
        return "typeddict"
    if callable(getattr(tp, "model_validate", None)) and callable(getattr(tp, "model_dump", None)):
        return "pydantic"
    return None


def _check_typeddict(tp: type, payload: Any) -> None:
    if not isinstance(payload, dict):
        raise BadArgument(f"payload must be a {tp.__name__} (a dict), got {type(payload).__name__}")
    required: frozenset[str] = getattr(tp, "__required_keys__", frozenset())
    optional: frozenset[str] = getattr(tp, "__optional_keys__", frozenset())
    missing = sorted(required - payload.keys())
    unknown = sorted(payload.keys() - required - optional)
    if missing or unknown:
        raise BadArgument(f"payload for {tp.__name__}: missing {missing}, unknown {unknown}")
    # Shallow: plain classes are checked with isinstance; generics (list[int], ...) are not.
    for key, hint in get_type_hints(tp).items():
        if key in payload and isinstance(hint, type) and not isinstance(payload[key], hint):
            raise BadArgument(
                f"payload[{key!r}] must be {hint.__name__}, got {type(payload[key]).__name__}"
            )


def encode_payload(tp: type, payload: Any) -> Any:
    """Check `payload` against `tp`; returns its JSON-able form (BadArgument if it does not fit)."""
    kind = _payload_kind(tp)
    if kind == "typeddict":
        _check_typeddict(tp, payload)
        return payload
    if kind == "dataclass":
        if not isinstance(payload, tp):
            raise BadArgument(f"payload must be a {tp.__name__}, got {type(payload).__name__}")
        return dataclasses.asdict(payload)  # type: ignore[call-overload]
    if kind == "pydantic":
        if not isinstance(payload, tp):
            raise BadArgument(f"payload must be a {tp.__name__}, got {type(payload).__name__}")
        return payload.model_dump(mode="json")  # type: ignore[attr-defined]
    raise BadArgument(f"unsupported payload_type {tp!r}")


def decode_payload(tp: type, payload: Any) -> Any:
    """The handler's view of a JSON payload. A payload that does not fit raises BadArgument,
    which fails the attempt (the job retries or parks like any handler error)."""
    kind = _payload_kind(tp)
    if kind == "typeddict":
        _check_typeddict(tp, payload)
        return payload
    if not isinstance(payload, dict):
        raise BadArgument(f"payload for {tp.__name__} must be a JSON object")
    if kind == "dataclass":
        try:
            return tp(**payload)
        except TypeError as exc:
            raise BadArgument(f"payload does not fit {tp.__name__}: {exc}") from None
    try:
        return tp.model_validate(payload)  # type: ignore[attr-defined]
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise BadArgument(f"payload does not fit {tp.__name__}: {exc}") from None


def _decoding(fn: Callable[..., Any], tp: type, is_async: bool) -> Handler:
    if is_async:

        async def run_async(payload: Any, ctx: JobContext) -> Any:
            return await fn(decode_payload(tp, payload), ctx)

        return run_async

    def run(payload: Any, ctx: JobContext) -> Any:
        return fn(decode_payload(tp, payload), ctx)

    return run


class TaskHandle(Generic[F]):
    """What `@registry.task` returns: call it as the function, or enqueue it with its defaults."""

    def __init__(self, fn: F, spec: TaskSpec) -> None:
        self.fn = fn
        self.spec = spec
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", spec.name)
        self.__doc__ = fn.__doc__

    @property
    def name(self) -> str:
        """The registered task name (what `enqueue` sends and the worker looks up)."""
        return self.spec.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TaskHandle({self.spec.name!r})"

    def job_spec(
        self,
        payload: Any = None,
        *,
        delay_ms: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        key: str | None = None,
        jitter_ms: int = 0,
        timeout_ms: int | None = None,
        job_id: str | None = None,
    ) -> JobSpec:
        """A JobSpec with the task's defaults; an argument given here wins over its default.
        With a payload_type, `payload` must be of it (BadArgument otherwise)."""
        spec = self.spec
        if spec.payload_type is not None:
            payload = encode_payload(spec.payload_type, payload)
        if timeout_ms is None:
            timeout_ms = 0 if spec.timeout_s is None else round(spec.timeout_s * 1000)
        return JobSpec(
            spec.name,
            payload,
            delay_ms=delay_ms,
            run_at=run_at,
            max_attempts=spec.max_attempts if max_attempts is None else max_attempts,
            backoff=spec.backoff if backoff is None else backoff,
            key=key,
            jitter_ms=jitter_ms,
            timeout_ms=timeout_ms,
            job_id=job_id,
        )

    def _check_queue(self, name: str) -> None:
        if self.spec.queue is not None and name != self.spec.queue:
            raise BadArgument(
                f"task {self.spec.name!r} runs on queue {self.spec.queue!r}, not {name!r}"
            )

    def enqueue(self, q: Queue, payload: Any = None, **overrides: Any) -> str:
        """Enqueue on `q` (a Queue) with the task's defaults; `overrides` are job_spec's
        keyword arguments. Returns the job id."""
        self._check_queue(q.name)
        return q.enqueue_many([self.job_spec(payload, **overrides)])[0]

    async def aenqueue(self, aq: AsyncQueue, payload: Any = None, **overrides: Any) -> str:
        """`enqueue` for an AsyncQueue."""
        self._check_queue(aq.name)
        ids = await aq.enqueue_many([self.job_spec(payload, **overrides)])
        return ids[0]
