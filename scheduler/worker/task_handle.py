"""TaskSpec (one task's registration and defaults) and TaskHandle (what `@registry.task`
returns: callable as the function, `enqueue` / `aenqueue` / `job_spec` with the defaults); the
registration's checks of a task's name and timeout."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from scheduler.core.job_spec import spec_options
from scheduler.core.limits import TASK_RE
from scheduler.core.models import JobSpec
from scheduler.worker.payloads import Handler, encode_payload

if TYPE_CHECKING:
    from typing_extensions import Unpack  # mypy's own dependency: only read by type checkers

    from scheduler.client.aio import AsyncQueue
    from scheduler.client.partitioned import PartitionedQueue
    from scheduler.client.partitioned_aio import AsyncPartitionedQueue
    from scheduler.client.queue import Queue

F = TypeVar("F", bound=Callable[..., Any])


class JobOptions(TypedDict, total=False):
    """The keyword arguments of `TaskHandle.job_spec`, so `enqueue(q, p, delay=5)` (a typo)
    fails the caller's type check, not only its run."""

    delay_ms: int | None
    run_at: datetime | None
    max_attempts: int | None
    backoff: Backoff | None
    key: str | None
    jitter_ms: int
    timeout_ms: int | None
    job_id: str | None
    result_ttl_ms: int | None
    keep_payload: bool | None
    priority: int | None
    concurrency_key: str | None
    concurrency_limit: int | None
    rate_limit: Any
    rate_key: str | None
    after: Sequence[str] | None
    start_within_ms: int | None
    key_ttl_ms: int | None
    debounce: bool


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
    keep_payload: bool = False  # its jobs keep their payload once done (the job may say no)
    start_within_ms: int | None = None  # its jobs' start window (the job's own wins)
    # Flow-control defaults of its jobs (docs/flow-control.md), as JobSpec field -> value.
    flow: tuple[tuple[str, Any], ...] = ()
    # `fn` before the registry's middleware wrapped it (worker/middleware.py): rewrapped when
    # a middleware is registered after the task. None: `fn` is not wrapped.
    unwrapped: Handler | None = None

    def timeout_for(self, job_timeout_ms: int) -> float | None:
        """The job's own timeout wins; else the task default; None = no limit."""
        if job_timeout_ms > 0:
            return job_timeout_ms / 1000
        return self.timeout_s


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

    if TYPE_CHECKING:  # a call is checked against the function's own signature

        @property
        def __call__(self) -> F: ...

    else:

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
        result_ttl_ms: int | None = None,
        keep_payload: bool | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        rate_key: str | None = None,
        after: Sequence[str] | None = None,
        start_within_ms: int | None = None,
        key_ttl_ms: int | None = None,
        debounce: bool = False,
    ) -> JobSpec:
        """A JobSpec with the task's defaults; an argument given here wins over its default.
        With a payload_type, `payload` must be of it (BadArgument otherwise).
        Retention once done: this job's `result_ttl_ms` wins over the task's, which wins over
        the completing worker's `--result-ttl-ms`, else 1 h; `keep_payload` (None: the task's
        default) keeps the payload with the outcome. Flow arguments left None take the task's
        (`priority`, `concurrency_limit` on the task's name as its key, `rate_limit`)."""
        spec = self.spec
        given = {
            "priority": priority,
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
            "rate_limit": rate_limit,
            "rate_key": rate_key,
        }
        flow = {**dict(spec.flow), **{k: v for k, v in given.items() if v is not None}}
        if debounce is True:  # a debounced job takes no flow option: say that these are the task's
            inherited = [k for k, v in spec.flow if given[k] is None and (k, v) != ("priority", 0)]
            if inherited:
                raise BadArgument(
                    f"task {spec.name!r} gives its jobs {', '.join(inherited)} (its registration),"
                    " and a debounced job takes no flow options: debounce it by name,"
                    f" q.enqueue({spec.name!r}, payload, key=..., debounce=True)"
                )
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
            result_ttl_ms=result_ttl_ms,
            keep_payload=spec.keep_payload if keep_payload is None else keep_payload,
            after=after,
            start_within_ms=spec.start_within_ms if start_within_ms is None else start_within_ms,
            key_ttl_ms=key_ttl_ms,
            debounce=debounce,
            **flow,
        )

    def _check_queue(self, q: Any, call: str) -> None:
        name = getattr(q, "name", None)
        if not isinstance(name, str) or not callable(getattr(q, "enqueue_many", None)):
            # The payload given first (the function's own call reads so), or a redis client:
            # an AttributeError on `.name` otherwise.
            raise BadArgument(
                f"{call} takes the queue first: handle.{call}(q, payload), got {q!r:.80}"
            )
        if self.spec.queue is not None and name != self.spec.queue:
            raise BadArgument(
                f"task {self.spec.name!r} runs on queue {self.spec.queue!r}, not {name!r}"
            )

    def enqueue(
        self, q: Queue | PartitionedQueue, payload: Any = None, **overrides: Unpack[JobOptions]
    ) -> str:
        """Enqueue on `q` (a Queue or PartitionedQueue) with the task's defaults; `overrides`
        are job_spec's keyword arguments. Returns the job id. BadArgument for an asyncio
        queue (use `aenqueue`), nothing sent."""
        self._check_queue(q, "enqueue")
        if inspect.iscoroutinefunction(q.enqueue_many):  # else a TypeError, a coroutine unsent
            raise BadArgument(f"{type(q).__name__} is async: await handle.aenqueue(aq, payload)")
        return q.enqueue_many([self.job_spec(payload, **overrides)])[0]

    async def aenqueue(
        self,
        aq: AsyncQueue | AsyncPartitionedQueue,
        payload: Any = None,
        **overrides: Unpack[JobOptions],
    ) -> str:
        """`enqueue` for an AsyncQueue or AsyncPartitionedQueue. BadArgument for a blocking
        queue (use `enqueue`), nothing sent."""
        self._check_queue(aq, "aenqueue")
        if not inspect.iscoroutinefunction(aq.enqueue_many):  # it would write, then TypeError
            raise BadArgument(f"{type(aq).__name__} is not async: call handle.enqueue(q, payload)")
        # Its enqueue, not enqueue_many: concurrent callers share script calls there.
        spec = self.job_spec(payload, **overrides)
        return await aq.enqueue(spec.task, spec.payload, **spec_options(spec))


def check_task_name(task_name: Any, *, given: bool) -> None:
    """Refused at registration, not at the first enqueue (or never, for a name only ever
    enqueued by handle)."""
    if isinstance(task_name, str) and TASK_RE.fullmatch(task_name):
        return
    hint = "" if given else " (the default name of this function: give name=)"
    raise BadArgument(
        f"invalid task name {task_name!r}{hint}: 1-200 characters of A-Z a-z 0-9 _ . : / -"
    )


def check_timeout_s(timeout_s: object) -> None:
    """A finite number of seconds whose milliseconds are a job's timeout_ms (at least 1 ms:
    a smaller one would round to 0, which means none of the job's own)."""
    hi = codec.LIMITS["timeout_ms"][1]
    ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    try:
        # The seconds themselves in range (0.0009 rounds to 1 ms), then their milliseconds.
        ok = ok and 0.001 <= timeout_s <= hi / 1000  # type: ignore[operator]
        ok = ok and 1 <= round(timeout_s * 1000) <= hi  # type: ignore[operator]
    except (OverflowError, ValueError):  # inf, nan
        ok = False
    if not ok:
        raise BadArgument(
            f"timeout_s must be a number of seconds in [0.001, {hi // 1000}], got {timeout_s!r}"
        )
