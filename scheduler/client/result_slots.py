"""The cap on the connections result waits hold (client/result_waiting.py drives the waits):
`wait_slots`, half the pool, and the blocking client's slots (`_Slots`), taken first come first
served by its threads.

A cap is its connection pool's (`pool_of`), not one client object's: clients made on one pool
(redis.Redis(connection_pool=pool), e.g. one per request on an app's pool) draw on the same
connections, so their waits share one cap. Each client object used to get its own half: two
such clients' waits took the whole pool, and another thread's enqueue on it then raised
MaxConnectionsError."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from typing import Any

# redis-py's pool size when a client does not say (redis.asyncio's default).
_DEFAULT_POOL = 100


def connection_kwargs(client: Any) -> dict[str, Any]:
    """The arguments of the client's connections: its pool's (one server, a Sentinel master),
    else a cluster's, every node's (asyncio: the client's; blocking: its nodes manager's)."""
    owners = (getattr(client, "connection_pool", None), client)
    for owner in (*owners, getattr(client, "nodes_manager", None)):
        kwargs = getattr(owner, "connection_kwargs", None)
        if isinstance(kwargs, dict) and kwargs:
            return kwargs
    return {}


def wait_slots(client: Any) -> int:
    """How many calls the client's waits make at once: half its pool (a cluster's: of each
    node's), at least 1."""
    size = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    size = size or connection_kwargs(client).get("max_connections")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        size = _DEFAULT_POOL
    return max(1, size // 2)


def pool_of(client: Any) -> Any:
    """What the client's waits share a cap with, the key of its slots: its connection pool;
    a cluster's nodes manager (its nodes' pools; redis.asyncio's takes no weak reference:
    then the client itself)."""
    for owner in (getattr(client, "connection_pool", None), getattr(client, "nodes_manager", None)):
        if owner is not None:
            try:
                weakref.ref(owner)
            except TypeError:  # __slots__ without __weakref__
                continue
            return owner
    return client


class _Slots:
    """One pool's wait slots for its threads, first come first served: a thread back for its
    next request queues behind those already waiting (a plain Semaphore, like a
    BlockingConnectionPool, lets the one that just gave its slot back take it again first).

    Taken through `held` (a with block), the slot goes back on any exit. A KeyboardInterrupt
    (Ctrl-C in a REPL) landing between the take and the try that gave it back kept it for good,
    and one left in the middle of the take kept its turn at the head: after a few, every later
    wait of the pool found no slot."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.turns: deque[object] = deque()
        self.cond = threading.Condition(threading.Lock())

    def held(self, until_s: float) -> _Held:
        """`with slots.held(until_s) as got:` a slot (got) or none by `until_s` (not got)."""
        return _Held(self, until_s)

    def take(self, until_s: float) -> bool:
        """A slot, waited for until `until_s` (time.monotonic); False when none came. Whatever
        interrupts it (its turn's bookkeeping, the lock's release) gives back what it took."""
        me = object()
        got = False
        try:
            with self.cond:
                try:
                    self.turns.append(me)
                    while not self.free or self.turns[0] is not me:
                        left_s = until_s - time.monotonic()
                        if left_s <= 0:
                            return False
                        self.cond.wait(left_s)
                    self.free -= 1
                    got = True  # no call between the two: no signal handler runs between them
                finally:
                    if me in self.turns:  # absent when interrupted before the append
                        self.turns.remove(me)
                    self.cond.notify_all()  # the next in turn (a slot may be free)
        except BaseException:
            if got:
                self.give()
            raise
        return got

    def give(self) -> None:
        with self.cond:
            self.free += 1
            self.cond.notify_all()


class _Held:
    """One request's slot (`_Slots.held`): back when the with block ends, however it ends (a
    with block is protected from the moment `__enter__` returns: no call, so no signal handler,
    runs between them)."""

    def __init__(self, slots: _Slots, until_s: float) -> None:
        self.slots, self.until_s, self.got = slots, until_s, False

    def __enter__(self) -> bool:
        self.got = self.slots.take(self.until_s)
        return self.got

    def __exit__(self, *exc_info: object) -> None:
        if self.got:
            self.got = False
            self.slots.give()


_SYNC_SLOTS: weakref.WeakKeyDictionary[Any, _Slots] = weakref.WeakKeyDictionary()
_SYNC_SLOTS_LOCK = [threading.Lock()]


def _fresh_after_fork() -> None:
    """A parent's thread may have held a slot or a lock at the fork: the child starts anew."""
    _SYNC_SLOTS_LOCK[0] = threading.Lock()
    _SYNC_SLOTS.clear()


os.register_at_fork(after_in_child=_fresh_after_fork)


def _sync_slots(client: Any) -> _Slots:
    """The blocking client's slots, its pool's."""
    with _SYNC_SLOTS_LOCK[0]:  # two threads' first waits must not make two caps
        got = _SYNC_SLOTS.get(pool := pool_of(client))
        if got is None:
            got = _SYNC_SLOTS[pool] = _Slots(wait_slots(client))
        return got
