"""A `Queue.result()` waiter's announcement: `result_wait:<id>` is a SET of waiter ids (lib/
result.lua pushes a wake-up only while it exists). Each waiter adds itself before its last state
check and takes itself out when its wait ends however it ends, so the key goes with the last
waiter instead of living the whole timeout_s after it (a cancelled asyncio waiter's for up to a
day, and the job's outcome then wrote a wake-up list for nobody). SREM never creates a key, and
PX (the longest waiter's wait, plus a margin) still bounds what a waiter that died leaves."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from scheduler.operations.requests import Commands, Op

# Beyond the wait itself: the announcement outlives a waiter that died without leaving.
WAIT_KEY_MARGIN_MS = 5_000
# How long a cancelled AsyncQueue.result spends taking itself out (one command).
LEAVE_BOUND_S = 1.0
T = TypeVar("T")


class ResultWait:
    """One waiter of one job; `announced` once it added itself."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.me = secrets.token_hex(8)
        self.announced = False

    def announce(self, remaining_ms: int) -> Op[None]:
        px_ms = remaining_ms + WAIT_KEY_MARGIN_MS
        # The expiry only grows (NX: the first waiter's; GT: a longer one's; Redis 7.0, the
        # minimum): a shorter waiter never cuts a longer one's announcement short.
        cmds = [
            ("SADD", self.key, self.me),
            ("PEXPIRE", self.key, px_ms, "NX"),
            ("PEXPIRE", self.key, px_ms, "GT"),
        ]
        try:
            yield Commands(cmds)
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            # An older version's waiter (a plain string): that one only loses its wake-up
            # (it re-reads the state every slice of its wait).
            yield Commands([("DEL", self.key), *cmds])
        self.announced = True

    def leave(self) -> Op[None]:
        """Out of the set (best effort: what PX bounds anyway); a no-op unless announced."""
        if not self.announced:
            return
        self.announced = False
        # An outage, or an older version's string in its place: PX ends it.
        with contextlib.suppress(Exception):
            yield Commands([("SREM", self.key, self.me)])

    async def cancellable(self, run: Callable[[Op[Any]], Awaitable[T]], op: Op[T]) -> T:
        """`run(op)` (AsyncQueue's driver): a cancel of the task takes this waiter out before
        it goes on (the op itself does on every other end), bounded: a server that does not
        answer leaves it to PX."""
        try:
            return await run(op)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run(self.leave()), LEAVE_BOUND_S)
            raise
