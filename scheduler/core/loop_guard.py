"""An asyncio client's connections belong to the event loop and the process that first used
them: `check` refuses, before any I/O, a call that would use them from elsewhere.

- A process forked after the client's first use (gunicorn --preload, multiprocessing's `fork`,
  `os.fork`): redis.asyncio's pool, unlike the blocking one, does not notice the fork, so the
  child wrote on the parent's sockets and the parent read the child's replies as its own (a job
  id answered to another call). A client first used in the child is its own and works.
- Another event loop while the first is still open (another thread's loop): the call waited on
  the first loop's connections, for ever when that loop was busy. Once the first loop is
  closed (`asyncio.run()` called again), the client is the new loop's: the closed loop's
  pooled connections are dropped first (`_drop_connections`), else the first call of every
  run after the first failed with "Event loop is closed".

A queue's `Guard` remembers the loop and fork count it last passed with: a call costs the
running loop's lookup and two comparisons. A fork is counted by an `os.register_at_fork` hook,
not a `getpid` per call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Coroutine
from typing import Any

from scheduler.core.errors import BadArgument

_forks = 0  # forks this process is a child of, counted in the child


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)

# id(client) -> (a weak reference to it, the loop of its first use, _forks then).
_BOUND: dict[int, tuple[Any, asyncio.AbstractEventLoop, int]] = {}


def check(client: Any, who: str) -> None:
    """Refuse (BadArgument) a call on `client` from another process or a second open loop."""
    loop = asyncio.get_running_loop()
    key = id(client)
    bound = _BOUND.get(key)
    if bound is not None and bound[0]() is client:
        if bound[1] is loop and bound[2] == _forks:
            return
        if bound[2] != _forks:
            raise BadArgument(
                f"this {who} was first used in the parent of this forked process, so its "
                "connections are the parent's (the two processes would read each other's "
                f"replies): open a new {who} in the child, after the fork (gunicorn: in a "
                "post_fork hook or the app's lifespan), or leave it unused until then"
            )
        if not bound[1].is_closed():
            raise BadArgument(
                f"this {who} belongs to the event loop that first used it, which is still open "
                f"(another thread's, or one never closed): open one {who} per event loop, or "
                "close that loop first"
            )
    try:
        ref = weakref.ref(client, lambda _r: _BOUND.pop(key, None))
    except TypeError:  # no weak references (no client this package builds): not guarded
        return
    entry = (ref, loop, _forks)
    if bound is not None:
        if bound[0]() is client:  # its loop is closed (same process): its connections with it
            _drop_connections(client)
        _BOUND[key] = entry
    elif _BOUND.setdefault(key, entry) is not entry:  # another thread's loop bound it first
        check(client, who)


def _connections(client: Any) -> list[Any]:
    """The redis.asyncio connections `client` holds: its pool's (a Sentinel pool is one), its
    single connection, or a cluster's per-node ones."""
    found: list[Any] = []
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        found += getattr(pool, "_available_connections", [])
        found += getattr(pool, "_in_use_connections", ())
    if getattr(client, "connection", None) is not None:
        found.append(client.connection)
    manager = getattr(client, "nodes_manager", None)
    for nodes in (getattr(manager, "nodes_cache", {}), getattr(manager, "startup_nodes", {})):
        for node in nodes.values():
            found += getattr(node, "_connections", [])
    return found


def _drop_connections(client: Any) -> None:
    """Close the connections of a closed loop without that loop: a transport's close and abort
    end in a callback on its loop, which raises once the loop is closed, so that callback is
    run here (it closes the socket: the server drops the session now, and no transport is left
    to warn at GC). The connection reconnects on its next use."""
    for conn in _connections(client):
        writer = getattr(conn, "_writer", None)
        if writer is None:
            continue
        conn._reader = conn._writer = None
        # A TLS transport wraps the socket's: that one holds the socket.
        transport = writer.transport
        inner = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
        for t in (transport, inner):
            if t is not None:
                with contextlib.suppress(Exception):  # RuntimeError: its loop is closed
                    t.abort()
        with contextlib.suppress(Exception):  # the protocol's futures are the old loop's
            (inner or transport)._call_connection_lost(None)


def inherited(client: Any) -> bool:
    """`client` was first used in a parent of this forked process: closing it here would close
    the parent's connections through the parent's event loop, whose epoll instance this process
    shares (the parent's next call waited until its timeout). Its sockets' copies here close
    with this process."""
    bound = _BOUND.get(id(client))
    return bound is not None and bound[0]() is client and bound[2] != _forks


class Guard:
    """One queue's `check`: a call from the loop and process it last passed in is not looked up
    again (the client's binding changes only once that loop is closed)."""

    __slots__ = ("client", "forks", "loop", "who")

    def __init__(self, client: Any, who: str) -> None:
        self.client, self.who = client, who
        self.loop: asyncio.AbstractEventLoop | None = None
        self.forks = -1

    def __call__(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self.loop or self.forks != _forks:
            check(self.client, self.who)
            self.loop, self.forks = loop, _forks

    def before(self, call: Coroutine[Any, Any, Any]) -> None:
        """As a call, ahead of awaiting `call`: refused, `call` is closed (never started)."""
        try:
            self()
        except BadArgument:
            call.close()
            raise
