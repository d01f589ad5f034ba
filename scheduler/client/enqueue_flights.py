"""What the asyncio enqueue batchers (client/enqueue_batcher.py) share beyond one queue.

`Flights`: the script calls the batchers of one connection pool have in flight, at most `most`
per node. An AsyncQueue has its own; an AsyncPartitionedQueue's partitions share one, so N
partitions use the two pooled connections one AsyncQueue uses (two per node on a cluster), not
2N (redis.asyncio's pool refuses calls past 100). A batcher that finds none free waits its
turn; a call that comes back hands its place to the batchers waiting, in the order they came.

`alone_across`: a call that joins no batch (`EnqueueBatcher.alone`) over several queues'
batchers at once, as an AsyncPartitionedQueue's enqueue_many is.

`own_error`: each caller of a shared call that failed gets its own copy of the error, so what
one caller writes on it (AsyncPartitionedQueue's `unknown_ids`, a note) reaches no other.

`queue_batcher`: an AsyncQueue's batcher, on its sends (one call; several in one pipeline).
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from scheduler.core.errors import not_utf8
from scheduler.core.models import JobSpec
from scheduler.core.scripts import run_async

if TYPE_CHECKING:
    from scheduler.client.aio import AsyncQueue
    from scheduler.client.enqueue_batcher import EnqueueBatcher

T = TypeVar("T")
Send = Callable[[list[str]], Awaitable[Any]]
# Several calls' arguments in one pipeline: each call's raw reply, or the error refusing it.
SendEach = Callable[[list[list[str]]], Awaitable[list[Any]]]


class Batcher(Protocol):
    """What Flights calls of a batcher waiting its turn (EnqueueBatcher)."""

    def _start(self) -> None:
        """Send what waits, taking its calls from the batcher's Flights."""


class Flights:
    """The calls in flight of the batchers sharing a pool, by node ("" on one server)."""

    def __init__(self, most: int = 2) -> None:
        self.most = most
        self._loop: asyncio.AbstractEventLoop | None = None
        self._count: dict[str, int] = {}
        self._turns: dict[str, deque[Batcher]] = {}  # batchers waiting for a call, in order
        self._turn: Batcher | None = None  # the one handed a call that came back

    def enter(self, loop: asyncio.AbstractEventLoop) -> None:
        """A batcher used from `loop`: a new loop starts from nothing (a closed loop's calls
        in flight never come back)."""
        if loop is not self._loop:
            self._loop, self._count, self._turns, self._turn = loop, {}, {}, None

    def take(self, node: str, batcher: Batcher) -> bool:
        """A call in flight on `node` for `batcher`, if one is free and no other batcher
        waits for one ahead of it; else it waits its turn (its `_start` runs once one is)."""
        n = self._count.get(node, 0)
        turns = self._turns.get(node)
        if n < self.most and (not turns or self._turn is batcher):
            self._count[node] = n + 1
            return True
        if turns is None:
            turns = self._turns[node] = deque()
        if batcher not in turns:
            turns.append(batcher)
        return False

    def give_back(self, node: str, loop: asyncio.AbstractEventLoop | None) -> None:
        """A call of `node` taken on `loop` came back: the batchers waiting send, in turn."""
        if loop is not self._loop:
            return  # taken on a loop since left behind
        self._count[node] -= 1
        turns = self._turns.get(node)
        while turns and self._count[node] < self.most:
            self._turn = turns.popleft()
            try:
                self._turn._start()
            finally:
                self._turn = None
        if turns is not None and not turns:
            del self._turns[node]


def queue_batcher(queue: AsyncQueue) -> EnqueueBatcher:
    """The batcher of `queue`, on its two sends: one enqueue.lua call of ready arguments,
    through the queue's own driving (`_run`), and several in one pipeline (a batch refused for
    every write sent again a call per job), each call's raw reply or the error refusing it."""
    from scheduler.client.enqueue_batcher import EnqueueBatcher  # it imports this module

    async def each(calls: list[list[str]]) -> list[Any]:
        queue._guard()  # its loop and process, as every call of the queue
        items = [(queue._script_keys, next(queue.ops.enqueue_call(a))) for a in calls]
        try:
            return await run_async(queue.client, queue._scripts.drive(items))
        except UnicodeDecodeError as exc:  # as AsyncQueue._execute
            raise not_utf8(queue.keys.queue, exc) from None

    return EnqueueBatcher(lambda args: queue._run(queue.ops.enqueue_call(args)), each)


def own_error(exc: Exception) -> Exception:
    """A copy of `exc` for one of the callers it reaches (its notes its own, its cause the
    shared one); `exc` itself when its class cannot be made again from its args."""
    try:
        mine = copy.copy(exc)
    except Exception:  # an __init__ its args do not fit: the shared one, as before
        return exc
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        mine.__notes__ = list(notes)
    mine.__cause__ = exc
    return mine


async def alone_across(
    groups: Sequence[tuple[EnqueueBatcher, Any]], call: Callable[[], Awaitable[T]]
) -> T:
    """EnqueueBatcher.alone over several queues' batchers (an AsyncPartitionedQueue's
    enqueue_many: each partition's, with its specs): sent once no batcher has a parent of its
    specs waiting or in flight, each batcher's ids then counted in flight until it is answered.
    None counts its ids while another is waited for: two such calls, each naming a job of the
    other, would wait for ever."""
    named = [(b, *_named(specs)) for b, specs in groups]
    loops = [b._enter() for b, _, _ in named]
    while busy := next((b for b, _, parents in named if parents and b._pending(parents)), None):
        await busy._until_settled()
    for b, ids, _ in named:
        b._fly([[i] for i in ids], 1)
    try:
        return await call()
    finally:
        for (b, ids, _), loop in zip(named, loops, strict=True):
            if loop is b._loop:
                b._fly([[i] for i in ids], -1)
                b._start()
                b._wake()


def _named(specs: Any) -> tuple[set[str], set[str]]:
    """The ids chosen by the callers of `specs` (a list; else none: the call refuses it), and
    the jobs they name in `after`."""
    ids: set[str] = set()
    parents: set[str] = set()
    for spec in specs if isinstance(specs, list) else ():
        if isinstance(spec, JobSpec):
            if isinstance(spec.job_id, str):
                ids.add(spec.job_id)
            if isinstance(spec.after, list | tuple):
                parents.update(p for p in spec.after if isinstance(p, str))
    return ids, parents
