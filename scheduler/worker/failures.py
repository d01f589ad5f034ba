"""A handler's exception described for `fail` (type, message, traceback) and whether it is
retried: never raising, whatever the exception's own methods do, so its job always gets an
outcome."""

from __future__ import annotations

import difflib
import traceback
from types import CoroutineType
from typing import Any

from scheduler.core import codec
from scheduler.core.errors import InvalidPayload
from scheduler.core.json_bounded import encode_json_bounded
from scheduler.core.limits import check_int
from scheduler.core.models import _EncodedResult
from scheduler.worker.payloads import PayloadMisfit
from scheduler.worker.retry_later import RetryLater
from scheduler.worker.task_handle import TaskSpec


def error_text(exc: BaseException) -> str:
    """str(exc) as a plain str (a subclass's slicing may raise), or a stand-in when its __str__
    raises (reporting it must not fail too)."""
    try:
        return str.__str__(str(exc))
    except KeyboardInterrupt:  # Ctrl-C of an embedded worker stops it, wherever it lands
        raise
    except BaseException as bad:
        return f"<{type_name(exc)} message could not be read: {type(bad).__name__}>"


def type_name(exc: BaseException) -> str:
    """The class's own name (a metaclass may make type(exc).__name__ a non-str, or raise)."""
    name: str = type.__dict__["__name__"].__get__(type(exc))
    return name


def failure_of(
    exc: BaseException, spec: TaskSpec | None
) -> tuple[tuple[str, str, str], bool, int | None]:
    """A handler's exception as fail's (type, message, traceback), whether it is retried, and
    after how long (None: by the job's backoff; RetryLater's delay_ms). Never raises (not even
    SystemExit): the job gets an outcome whatever its exception does."""
    if type(exc) is PayloadMisfit:  # the decode before the handler: no attempt would differ
        return ("InvalidPayload", error_text(exc), ""), False, None
    if isinstance(exc, RetryLater):  # asked for on purpose: retried, whatever non_retryable says
        delay_ms = _delay_of(exc)
        if delay_ms is not None:
            return (type_name(exc), error_text(exc), ""), True, delay_ms
    try:
        retryable = spec is None or not isinstance(exc, spec.non_retryable)
    except KeyboardInterrupt:
        raise
    except BaseException:  # a metaclass __instancecheck__ that raises: retried, as any error
        retryable = True
    try:
        tb = "".join(traceback.format_exception(exc))
    except KeyboardInterrupt:
        raise
    except BaseException:
        tb = ""
    return (type_name(exc), error_text(exc), tb), retryable, None


def _delay_of(exc: RetryLater) -> int | None:
    """Its delay_ms, or None when a subclass or the app set one that is no int in range after
    it was built: fail would refuse it, and the reporter send it again for ever (every outcome
    of the worker behind it); the attempt then fails as any error does, by the backoff."""
    try:
        return check_int(exc.delay_ms, "delay_ms")
    except KeyboardInterrupt:
        raise
    except BaseException:
        return None


def result_text(result: Any) -> str:
    """A handler's return value as the JSON text `complete` stores; InvalidPayload when it
    cannot be. A coroutine means an async def behind a sync wrapper (run in a thread) or a
    missing `await`: said so, and closed, so no "never awaited" warning follows."""
    if type(result) is CoroutineType:  # inspect.iscoroutine's test (no subclass can exist)
        result.close()
        raise InvalidPayload(
            "the handler returned a coroutine, never awaited: register the async function"
            " itself (a sync wrapper hides the async def), or await it in the handler"
        )
    # Never encoded whole far over the limit: a str longer than it, or a list of 2,000,000
    # rows, held the event loop (100 MB: seconds) only to fail the size check.
    return encode_json_bounded(result, "result", codec.MAX_PAYLOAD_BYTES)


class BadResult:
    """A result `complete` cannot store: why, for its job's InvalidResult fail."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def unawaited_in_layers(result: CoroutineType[Any, Any, Any], is_async: bool) -> BadResult:
    """A coroutine out of a task's outermost middleware (worker/middleware.py): the handler or
    any middleware may have returned it (an async one's `return call_next(...)` without await
    returns the next layer's coroutine, the handler never run), so both are named. Closed, so
    no "never awaited" warning follows."""
    name = getattr(result, "__qualname__", "?")
    result.close()
    if is_async:
        fix = (
            "an async middleware must return `await call_next(payload, ctx)` (a missing await"
            " on call_next returns the next layer's coroutine unrun), a handler await what it"
            " returns"
        )
    else:
        fix = (
            "register the async function itself (a sync wrapper hides the async def); a plain"
            " function middleware wraps only the sync handlers"
        )
    return BadResult(
        f"the handler or a middleware returned a coroutine ({name}), never awaited: {fix}"
    )


def encoded_result(result: Any) -> _EncodedResult | BadResult:
    """result_text's, ready for `complete` (encoded once: what is checked is what is sent), or
    why not. Never raises (but Ctrl-C). A sync handler's is made in its thread (Dispatch._run),
    off the event loop; none is encoded whole when far over the limit (encode_json_bounded)."""
    if type(result) is _EncodedResult or type(result) is BadResult:  # made in the thread
        return result
    try:
        return _EncodedResult(result_text(result))
    except KeyboardInterrupt:  # Ctrl-C of an embedded worker: not the result's fault
        raise
    except BaseException as bad:  # InvalidPayload; a result's own method may raise
        why = error_text(bad)
        if not isinstance(bad, InvalidPayload):
            why = f"result could not be encoded: {type_name(bad)}: {why}"
        return BadResult(why)


# A job claimed again while its previous run here still goes on past that run's timeout (a sync
# handler's thread that never returned): after one lease held back, a failed attempt.
STILL_RUNNING = "StillRunning"
STILL_RUNNING_TEXT = (
    "its previous run is still going on in this worker process, past its timeout or with none "
    "(a handler that does not return): counted as a failed attempt, retried by its backoff"
)


def unknown_task_text(task: str, known: list[str]) -> str:
    """The UnknownTask message: the nearest registered names, else the first few."""
    near = difflib.get_close_matches(task, known, n=3)
    listed = f"did you mean {', '.join(near)}?" if near else f"it knows {', '.join(known[:5])}"
    listed = listed if known else "it knows no task"
    more = f" (+{len(known) - 5} more)" if not near and len(known) > 5 else ""
    return (
        f"no handler registered for task {task!r} in this worker ({listed}{more}); "
        "retried by the job's backoff (a worker with the handler may take it), parked after "
        "its last attempt"
    )
