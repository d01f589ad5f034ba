"""A process a handler forks never runs the worker's code. Forked by an async handler, the
child carried on with the worker's whole event loop (its claim, heartbeat and report loops on
the parent's Redis connections and epoll fd) as soon as the handler awaited or returned: a
second worker on the parent's sockets, whose reads took the parent's replies (the parent hung,
jobs it claimed later never ran). Forked by a sync handler, the child's thread went back to
the thread pool and lingered there (30 s) once the handler returned. Now such a child exits
(EXIT_CODE, one line on stderr) at the loop's next turn, or when its sync handler returns.
A child that ends itself (os._exit, exec, multiprocessing's own) is not affected."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator

from scheduler.worker.logs import console_line

EXIT_CODE = 1

# The thread of each event loop a worker runs on now, and how many run there (asyncio's own
# fork hook clears the child's running loop before ours runs: the thread says which it was).
_watched: dict[int, tuple[asyncio.AbstractEventLoop, int]] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def watching(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """While in it, a child forked on loop's thread exits at the loop's next turn."""
    thread = threading.get_ident()
    with _lock:
        _watched[thread] = (loop, _watched.get(thread, (loop, 0))[1] + 1)
    try:
        yield
    finally:
        with _lock:
            left = _watched.pop(thread, (loop, 1))[1] - 1
            if left > 0:
                _watched[thread] = (loop, left)


def child_exit(where: str) -> None:
    """End a forked child that came back to the worker (never returns)."""
    # Straight to fd 2, not through the log: a lock of its buffered stream may have been held
    # by another thread at the fork, for good in the child. A JSON line under --json-logs.
    text = f"process {os.getpid()}, forked by a handler, {where}: it exits"
    line = console_line(text + " (end a forked process with os._exit)") + "\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "backslashreplace"))
    os._exit(EXIT_CODE)


def _in_child() -> None:
    watched = _watched.get(threading.get_ident())
    if watched is not None:
        # Forked on the worker's loop thread: the child may go on with the handler's own code
        # until it yields to the loop, which is the worker's.
        _watched.clear()
        watched[0].call_soon(child_exit, "returned to the worker's event loop")


os.register_at_fork(after_in_child=_in_child)
