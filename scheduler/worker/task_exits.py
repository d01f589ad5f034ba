"""SystemExit and KeyboardInterrupt raised in a task an async handler started (asyncio.gather,
create_task, TaskGroup) made an ordinary error, so the handler awaiting it fails its job as if
it had raised them itself (Dispatch._run_async). asyncio re-raises them out of the event loop:
`sys.exit(0)` in a gathered part ended `scheduler worker` with code 0 (a clean stop, to a
supervisor) and gave its job back with the attempt, so every worker that claimed it exited.

A task factory on the worker's loop (run() installs it while the loop has none, and takes it off
at its exit) wraps the coroutine of a task created where a handler runs: a context variable the
handler slot sets, which the handler's tasks inherit. The worker's own tasks, and an embedded
worker's app's, are created as before. Not contained: a callback a handler schedules
(`loop.call_soon`, `call_later`, a future's done callback) that raises them (asyncio has no hook
on callbacks: they still end the loop), and any task while the loop has a factory of the app's."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any

# True in a handler slot's task (Dispatch._run_async), so in every task its handlers start.
IN_HANDLER: contextvars.ContextVar[bool] = contextvars.ContextVar("in_handler", default=False)

# Per loop (by id, while a worker's run() is on it): the workers that installed the factory, so
# two workers on one loop leave it in place until the last one's exit.
_users: dict[int, int] = {}


class TaskExit(Exception):
    """What a handler's task raises in place of a SystemExit / KeyboardInterrupt (its cause)."""


class _Contained(Coroutine[Any, Any, Any]):
    """The task's coroutine, its steps passed through; an object, not an `async def` around it:
    a task cancelled before its first step throws into the handler's coroutine itself, which
    ends it (a wrapper not yet started would leave it "never awaited", a RuntimeWarning)."""

    __slots__ = ("_coro",)

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro

    def send(self, value: Any) -> Any:
        try:
            return self._coro.send(value)
        except (SystemExit, KeyboardInterrupt) as exc:
            raise _exit(exc) from exc

    def throw(self, *args: Any) -> Any:
        try:
            return self._coro.throw(*args)
        except (SystemExit, KeyboardInterrupt) as exc:
            raise _exit(exc) from exc

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    def __getattr__(self, name: str) -> Any:  # the task's repr and stack: the handler's coroutine
        return getattr(self._coro, name)


def _exit(exc: BaseException) -> TaskExit:
    return TaskExit(f"{type(exc).__name__} raised in a task the handler started")


def _factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
    # One ContextVar read per task created; only a handler's tasks pay a call per step.
    return asyncio.Task(_Contained(coro) if IN_HANDLER.get() else coro, loop=loop, **kw)


def cause(exc: BaseException) -> BaseException:
    """The SystemExit / KeyboardInterrupt a TaskExit carries (the job fails with it), else exc."""
    inner = exc.__cause__
    return inner if type(exc) is TaskExit and inner is not None else exc


def install(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Contain the handlers' tasks on loop; returns the undo for run()'s exit."""
    if loop.get_task_factory() not in (None, _factory):  # the app's own stays in charge
        return lambda: None
    loop.set_task_factory(_factory)
    key = id(loop)
    _users[key] = _users.get(key, 0) + 1

    def undo() -> None:
        left = _users.pop(key, 1) - 1
        if left:
            _users[key] = left
        elif loop.get_task_factory() is _factory:  # an app's set since stays
            loop.set_task_factory(None)

    return undo
