"""Handler middleware (`@registry.middleware`): the app's own code around every run of every
task of one kind, for what a decorator on each handler would repeat: an error tracker's scope,
a database session, a tracing span, a log context with the job id.

    @registry.middleware
    def scoped(call_next, payload, ctx):          # wraps the sync handlers, in their thread
        with sentry_sdk.isolation_scope():
            return call_next(payload, ctx)

    @registry.middleware
    async def ascoped(call_next, payload, ctx):   # wraps the async handlers, on the loop
        async with db.session():
            return await call_next(payload, ctx)

A plain function wraps the sync handlers (it runs in the handler's thread, where thread-local
state belongs), a coroutine function the async ones: an `async def` cannot wrap a call that
blocks a thread, and a plain function around a coroutine would leave its `with` before the
handler ran. What the middleware returns or raises is the run's outcome, exactly as if the
handler had (a timeout covers it too). It gets the payload as decoded from JSON, before a
task's `payload_type` decoding (the innermost layer). The first registered is the outermost;
one registered after a task still wraps it. Composed once at registration: a task without
middleware runs its handler with no extra call (issue 16's per-job budget)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import CoroutineType
from typing import Any

from scheduler.core.errors import BadArgument
from scheduler.worker.failures import unawaited_in_layers
from scheduler.worker.payloads import Handler
from scheduler.worker.task_handle import TaskHandle

Middleware = Callable[[Handler, Any, Any], Any]


def check_middleware(fn: Any) -> bool:
    """True for an async middleware. Refused (BadArgument): anything that cannot be called as
    fn(call_next, payload, ctx), or a generator function (a contextmanager's shape), either of
    which would fail every run of every task it wraps."""
    if not callable(fn) or inspect.isclass(fn):
        raise BadArgument(f"a middleware must be a function, got {fn!r}")
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        raise BadArgument(
            f"middleware {getattr(fn, '__qualname__', fn)} must accept (call_next, payload, "
            "ctx): it is called with the next layer (ending in the handler), the job's "
            "payload and its JobContext"
        ) from None
    except ValueError:  # a builtin without a signature: left to the call
        pass
    if any(map(is_generator_function, (fn, getattr(fn, "__call__", None)))):  # noqa: B004
        raise BadArgument(
            f"middleware {getattr(fn, '__qualname__', fn)} is a generator function: it must "
            "return what call_next returns (a generator is no result: every run it wraps "
            "would be parked as InvalidResult)"
        )
    return is_async_callable(fn)


def is_generator_function(fn: Any) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def is_async_callable(fn: Any) -> bool:
    """A coroutine function, or an object whose __call__ is one (a handler, hook or middleware
    object taken for a plain function would have its coroutine returned, never awaited), or
    the TaskHandle of one (its __call__ is sync, and returns the function's coroutine)."""
    while isinstance(fn, TaskHandle):
        fn = fn.fn
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def wrap(handler: Handler, is_async: bool, layers: Sequence[tuple[Middleware, bool]]) -> Handler:
    """`handler` inside the middleware of its kind; the first of `layers` the outermost."""
    mine = [mw for mw, mw_async in layers if mw_async == is_async]
    for depth, mw in reversed(list(enumerate(mine))):
        handler = _layer(mw, handler, is_async, outermost=depth == 0)
    return handler


def _layer(mw: Middleware, inner: Handler, is_async: bool, outermost: bool) -> Handler:
    # The outermost layer turns a coroutine result into the run's InvalidResult naming the
    # middleware too (failures.unawaited_in_layers): a middleware's missing await on call_next
    # would otherwise be blamed on the handler alone, which never ran.
    if is_async:

        async def run_async(payload: Any, ctx: Any) -> Any:
            return await mw(inner, payload, ctx)

        async def run_async_outermost(payload: Any, ctx: Any) -> Any:
            result = await mw(inner, payload, ctx)
            if type(result) is CoroutineType:  # inspect.iscoroutine's test
                return unawaited_in_layers(result, is_async=True)
            return result

        return run_async_outermost if outermost else run_async

    def run(payload: Any, ctx: Any) -> Any:
        return mw(inner, payload, ctx)

    def run_outermost(payload: Any, ctx: Any) -> Any:
        result = mw(inner, payload, ctx)
        if type(result) is CoroutineType:
            return unawaited_in_layers(result, is_async=False)
        return result

    return run_outermost if outermost else run
