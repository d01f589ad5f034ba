"""The drivers of `Queue.result` and `AsyncQueue.result` (the op: operations/result_wait.py).

Both sleep its `Pause` (the back-off while Redis does not answer) and shorten its BLMOVE slice to
half the connection's read timeout when that is under 2 s: a URL's `?socket_timeout=0.3` ended
every wait at once with redis' TimeoutError (`block_slice_s`, the worker's wake-up pop's too).
The sync driver throws every exception into the op, Ctrl-C's KeyboardInterrupt and SystemExit
too, so the waiter takes itself out of `result_wait` however its wait ends.

On asyncio, every wait on one connection pool (all its clients' AsyncQueues, an
AsyncPartitionedQueue's partitions: client/result_slots.py `pool_of`) shares: the waiters of one
job send one BLMOVE at a time, which wakes them all; and every call a wait makes takes one of
`max_connections // 2` slots (at least 1) for its duration, so waits never hold the connections an
enqueue or any other call needs (each used to hold one for its whole wait: 100 waiters took
redis.asyncio's whole pool, and the 101st call failed with MaxConnectionsError). A waiter beyond
them waits for a slot, re-reading at its slice's end.

The blocking client has the same cap, per pool too, its threads' turns first come first served
(result_slots.py `_Slots`): every thread waiting used to hold a connection, so two waiting threads
on `?max_connections=2` made a third thread's enqueue fail at once, and with a
BlockingConnectionPool each waiter took its connection back before the blocked enqueue woke, which
then waited out their whole wait."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from scheduler.client.enqueue_flights import own_error

# Named here too: worker/waking.py's connection_kwargs, the tests' slots.
from scheduler.client.result_slots import _Slots as _Slots
from scheduler.client.result_slots import _sync_slots as _sync_slots
from scheduler.client.result_slots import connection_kwargs as connection_kwargs
from scheduler.client.result_slots import pool_of, wait_slots
from scheduler.core.errors import ResultTimeout
from scheduler.operations.requests import Commands, Op, Request
from scheduler.operations.result_wait import (
    LEAVE_BOUND_S,
    RESULT_BLOCK_SLICE_S,
    Block,
    Pause,
    ResultWait,
    WaitOp,
)

if TYPE_CHECKING:
    from scheduler.client.aio import AsyncQueue
    from scheduler.client.queue import Queue

T = TypeVar("T")
# A shared BLMOVE's reply comes a little after its server-side timeout: how long a waiter
# awaits it beyond its own slice before it re-reads instead.
_REPLY_LATE_S = 0.25


def block_slice_s(client: Any, longest_s: float) -> float:
    """A blocking call's block: `longest_s`, or half the connection's read timeout when that
    is shorter; 1 ms at least (BLPOP / BLMOVE block for good on 0)."""
    timeout = connection_kwargs(client).get("socket_timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        return longest_s
    return max(min(longest_s, round(timeout / 2, 3)), 0.001)


def wait_sync(queue: Queue, job_id: str, timeout_s: float) -> Any:
    """Queue.result's wait (the running-loop refusal is Queue's): each request in one of the
    client's wait slots."""
    wait = ResultWait(queue.keys.result_wait(job_id))
    block_s = block_slice_s(queue.client, RESULT_BLOCK_SLICE_S)
    op = queue.ops.result(job_id, timeout_s, wait, block_s)
    try:
        req = next(op)  # timeout_s checked: a number from here on
        turn = _SyncTurn(queue, job_id, timeout_s, block_s)
        while True:
            try:
                if isinstance(req, Pause):
                    time.sleep(req.seconds)
                    reply = None
                else:
                    reply = turn.send(req)
            except BaseException as exc:  # Ctrl-C too: the op leaves result_wait, re-raises
                req = op.throw(exc)
            else:
                req = op.send(reply)
    except StopIteration as done:
        return done.value


class _SyncTurn:
    """One Queue.result's requests, each in a slot. Its slice's BLMOVE waits for one at most
    the slice (then it is as if it timed out: the op re-reads); a read waits at most a slice
    past the deadline (as late as an asyncio waiter may be: the slots' holders each give theirs
    back within a slice), else the wait ends with ResultTimeout unread."""

    def __init__(self, queue: Queue, job_id: str, timeout_s: float, block_s: float) -> None:
        self.queue, self.job_id, self.timeout_s = queue, job_id, timeout_s
        self.slots: _Slots = _sync_slots(queue.client)  # its pool's
        self.late_s = time.monotonic() + timeout_s + block_s

    def send(self, req: Request) -> Any:
        if isinstance(req, Block):
            return self._block(req)
        until_s = self.late_s
        if isinstance(req, Commands) and req.cmds[0][0] == "SREM":  # the leave: PX bounds it
            until_s = min(until_s, time.monotonic() + LEAVE_BOUND_S)
        with self.slots.held(until_s) as got:
            if not got:
                raise ResultTimeout(
                    f"job {self.job_id!r} did not finish within {self.timeout_s} s (not read"
                    " again: the client's other result waits held every wait slot)"
                )
            return self.queue._execute(req)

    def _block(self, req: Block) -> Any:
        wait_s = float(req.cmds[0][-1])
        asked_s = time.monotonic()
        with self.slots.held(asked_s + wait_s) as got:
            left_s = round(wait_s - (time.monotonic() - asked_s), 3)
            if not got or left_s < 0.001:  # a BLMOVE that timed out; 0 would block for good
                return [None]
            return self.queue._execute(Block([(*req.cmds[0][:-1], left_s)]))


async def wait_async(queue: AsyncQueue, job_id: str, timeout_s: float) -> Any:
    """AsyncQueue.result's wait: a cancel takes the waiter out (ResultWait.cancellable)."""
    wait = ResultWait(queue.keys.result_wait(job_id))
    shared = _shared(queue.client)
    block_s = block_slice_s(queue.client, RESULT_BLOCK_SLICE_S)
    op = queue.ops.result(job_id, timeout_s, wait, block_s)
    return await wait.cancellable(lambda o: _drive(queue, shared, o), op)


class _Shared:
    """One client's waits on one event loop: the slots, the BLMOVE in flight per wake-up key."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slots: int) -> None:
        self.loop = loop
        self.slots = asyncio.Semaphore(slots)
        self.leaves = asyncio.Semaphore(slots)  # the pool's other half
        self.blocks: dict[str, asyncio.Task[Any]] = {}

    def ended(self, key: str, task: asyncio.Task[Any]) -> None:
        if self.blocks.get(key) is task:
            del self.blocks[key]
        if not task.cancelled():
            task.exception()  # read: its waiters may all have gone (asyncio would log it)


_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()


def _shared(client: Any) -> _Shared:
    loop = asyncio.get_running_loop()
    got = _SHARED.get(pool := pool_of(client))
    if got is None or got.loop is not loop:  # a client kept across asyncio.run() calls
        got = _SHARED[pool] = _Shared(loop, wait_slots(client))
    return got


async def _drive(queue: AsyncQueue, shared: _Shared, op: WaitOp[T]) -> T:
    """AsyncQueue._run for the result op: its Pause slept, each request in a slot."""
    try:
        req = next(op)
        while True:
            try:
                reply = await _send(queue, shared, req)
            except Exception as exc:
                req = op.throw(exc)
            else:
                req = op.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _send(queue: AsyncQueue, shared: _Shared, req: Request | Pause) -> Any:
    if isinstance(req, Pause):
        await asyncio.sleep(req.seconds)
        return None
    if isinstance(req, Block):
        return await _block(queue, shared, req)
    if isinstance(req, Commands) and req.cmds[0][0] == "SREM":
        # A cancelled waiter's leave: one quick command, not queued behind the other waiters'
        # BLMOVEs for a slot (their slices outlasted its bound: it stayed announced), and at
        # most as many at once as the wait slots (waiters cancelled together, each on a
        # connection of its own, went past the pool: MaxConnectionsError; one at a time, a
        # slow link's round trips added up past each leave's bound).
        async with shared.leaves:
            return await queue._run(_one(req))
    return await _in_slot(queue, shared, req)


async def _in_slot(queue: AsyncQueue, shared: _Shared, req: Request) -> Any:
    async with shared.slots:
        # AsyncQueue._run: its loop guard, and a cancel the transport swallowed raised.
        return await queue._run(_one(req))


def _one(req: Request) -> Op[Any]:
    return (yield req)


async def _block(queue: AsyncQueue, shared: _Shared, req: Block) -> Any:
    """The slice's BLMOVE, shared with the job's other waiters: one in flight per key, in its
    own task (a waiter cancelled does not cut the others' short). A waiter awaits it for its
    own slice at most; then, as at a slice's end, it re-reads."""
    key, wait_s = str(req.cmds[0][1]), float(req.cmds[0][-1])
    task = shared.blocks.get(key)
    if task is None:
        task = asyncio.ensure_future(_in_slot(queue, shared, req))
        shared.blocks[key] = task
        task.add_done_callback(lambda t: shared.ended(key, t))
    try:
        return await asyncio.wait_for(asyncio.shield(task), wait_s + _REPLY_LATE_S)
    except TimeoutError:
        return [None]  # the reply of a BLMOVE that timed out
    except Exception as exc:  # each waiter its own copy (tracebacks, notes)
        mine = own_error(exc)
        if mine is exc:
            raise
        raise mine from exc
