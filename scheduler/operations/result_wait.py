"""A `Queue.result()` wait, sans-I/O: the loop of `InspectingOps.result` and the waiter's
announcement.

`result_wait:<id>` is a SET of waiter ids (lib/result.lua pushes a wake-up only while it exists).
Each waiter adds itself before its last state check and takes itself out when its wait ends
however it ends, so the key goes with the last waiter instead of living the whole timeout_s after
it (a cancelled asyncio waiter's for up to a day, and the job's outcome then wrote a wake-up list
for nobody). SREM never creates a key, and PX (the longest waiter's wait, plus a margin) still
bounds what a waiter that died leaves.

Between wake-ups the wait re-reads the job's state field only, and the whole job once it has an
outcome: a due job's whole read costs the counts script. A dropped
connection or a server refusing for now (a restart, a failover) is waited out until the
deadline: the wait is the call most often in flight when the server restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from queue import Empty as QueueEmpty
from typing import Any, TypeVar

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    MaxConnectionsError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.core import codec
from scheduler.core.connection import cluster_unreachable
from scheduler.core.errors import (
    JobCancelled,
    JobDead,
    JobNotFound,
    ResultTimeout,
    UnreadableRecord,
    refused_for_now,
)
from scheduler.core.keys import QueueKeys
from scheduler.core.models import Job, JobState
from scheduler.operations.requests import Commands, Op, Request

# Beyond the wait itself: the announcement outlives a waiter that died without leaving.
WAIT_KEY_MARGIN_MS = 5_000
# How long a cancelled AsyncQueue.result spends taking itself out (one command).
LEAVE_BOUND_S = 1.0
# The longest BLMOVE slice; the drivers shorten it to half the client's socket_timeout when
# that is shorter (client/result_waiting.py), so the read never times out mid-block. A lost
# wake-up costs at most one slice.
RESULT_BLOCK_SLICE_S = 1.0
# The pause before a re-read after Redis did not answer: doubles from the first to the last.
OUTAGE_PAUSE_S = (0.05, 1.0)
# The states with an outcome: the only ones for which the wait reads the whole job.
_ENDED = (JobState.DONE.value, JobState.DEAD.value, JobState.CANCELLED.value)
# A state the quick read could not tell (a key of another type): the whole read tells.
_UNREAD = "?"
T = TypeVar("T")


@dataclass(frozen=True)
class Pause:
    """Sleep this long before the next request (the drivers of client/result_waiting.py)."""

    seconds: float


@dataclass(frozen=True)
class Block(Commands):
    """The one BLMOVE of a slice: an asyncio driver lets the waiters of one job share it."""


WaitOp = Generator[Request | Pause, Any, T]


def outage(exc: BaseException) -> bool:
    """Redis did not answer, or refused only for now (loading after a restart, a failover's
    UNBLOCKED or READONLY): worth a re-read. A refused login is not, nor a full pool, either
    kind (raised at once, as by every call: a wait retried it for its whole timeout_s, then
    raised it)."""
    refused = AuthenticationError | AuthorizationError | MaxConnectionsError
    if isinstance(exc, refused) or pool_exhausted(exc):
        return False
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return True
    return (isinstance(exc, ResponseError) and refused_for_now(exc)) or cluster_unreachable(exc)


def pool_exhausted(exc: BaseException) -> bool:
    """A BlockingConnectionPool with no connection free within its `timeout`: redis-py (7.3 to
    8.2, blocking and asyncio) raises a plain ConnectionError "No connection available." for it
    (the blocking pool's raised while handling queue.Empty), not MaxConnectionsError. The
    server answered nothing because nothing was sent: a full pool, not an outage."""
    if not isinstance(exc, RedisConnectionError):
        return False
    if str(exc).strip().lower().startswith("no connection available"):
        return True
    return isinstance(exc.__context__, QueueEmpty)


class ResultWait:
    """One waiter of one job; `announced` once it may have added itself."""

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
        # Before the SADD is sent: a cancel landing while its reply is on the way must still
        # take this waiter out (an SREM of a member never added is harmless).
        self.announced = True
        try:
            yield Commands(cmds)
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            # An older version's waiter (a plain string): that one only loses its wake-up
            # (it re-reads the state every slice of its wait).
            yield Commands([("DEL", self.key), *cmds])

    def leave(self) -> Op[None]:
        """Out of the set (best effort: what PX bounds anyway); a no-op unless announced."""
        if not self.announced:
            return
        self.announced = False
        # An outage, or an older version's string in its place: PX ends it.
        with contextlib.suppress(Exception):
            yield Commands([("SREM", self.key, self.me)])

    async def cancellable(self, run: Callable[[WaitOp[Any]], Awaitable[T]], op: WaitOp[T]) -> T:
        """`run(op)` (AsyncQueue's driver): a cancel of the task takes this waiter out before
        it goes on (the op itself does on every other end), bounded: a server that does not
        answer leaves it to PX."""
        try:
            return await run(op)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run(self.leave()), LEAVE_BOUND_S)
            raise


def wait_outcome(
    keys: QueueKeys,
    get_job: Callable[[str], Op[Job]],
    job_id: str,
    timeout_s: float,
    wait: ResultWait,
    block_s: float,
) -> WaitOp[Any]:
    """Check the state, block on the wake-up list complete / fail (park) / cancel push
    (lua/lib/result.lua) for at most `block_s`, re-check. BLMOVE onto the same list leaves the
    one element there, so every waiter wakes. A stale element (a requeued dead job) is deleted
    only after a re-check, so a wake-up pushed meanwhile is seen through the state itself."""
    wake_key = keys.result_wake(job_id)
    deadline_s = time.monotonic() + timeout_s
    stale = renew = False
    pause_s = 0.0
    while True:
        try:
            finished, out = yield from _check(keys, get_job, job_id, wait)
            if finished:
                return out
            if stale:
                # Woken, yet not finished: the element is left from an earlier outcome.
                yield Commands([("DEL", wake_key)])
                stale = False
                continue
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                raise ResultTimeout(f"job {job_id!r} did not finish within {timeout_s} s")
            if renew or not wait.announced:
                # complete / fail / cancel push a wake-up only for a job with a waiter
                # (lib/result.lua); the state is read again after this, so an outcome that
                # landed just before it is not missed. Again after an outage: a server
                # restarted without persistence lost it.
                yield from wait.announce(int(remaining_s * 1000))
                renew = False
                continue
            # BLMOVE takes decimal seconds; never 0, which would block forever.
            wait_s = max(round(min(remaining_s, block_s), 3), 0.001)
            (woken,) = yield Block([("BLMOVE", wake_key, wake_key, "RIGHT", "LEFT", wait_s)])
            stale, pause_s = woken is not None, 0.0
        except Exception as exc:
            left_s = deadline_s - time.monotonic()
            if not outage(exc) or left_s <= 0:
                raise
            first_s, last_s = OUTAGE_PAUSE_S
            pause_s = min(max(2 * pause_s, first_s), last_s, left_s)
            yield Pause(pause_s)
            renew = True


def _check(
    keys: QueueKeys, get_job: Callable[[str], Op[Job]], job_id: str, wait: ResultWait
) -> Op[tuple[bool, Any]]:
    """(True, the result) when done; raises when it ended otherwise; (False, None) while not.
    The job's state alone is read while it has no outcome; once it has one, the whole job
    (get_job, no counts script for a finished job), which answers as every read of it does."""
    fields: dict[str, str] = {}
    try:
        state = yield from _read_state(keys, job_id)
        if state in _ENDED or state == _UNREAD:
            job = yield from get_job(job_id)
            state, fields = job.state, job.fields
    except JobNotFound:
        # Parked and deleted at once (a dead retention of max_count=0): the wake-up that park
        # pushed for this waiter still says how it ended.
        word = None
        if wait.announced:
            (word,) = yield Commands([("LINDEX", keys.result_wake(job_id), 0)])
        if word is not None and codec.s(word) == "dead":
            raise JobDead(job_id, "deleted by the dead-letter retention", None, None) from None
        raise
    if state == JobState.DONE:
        raw = fields.get("result")
        try:
            return True, None if raw is None else json.loads(raw)
        except (ValueError, RecursionError) as exc:  # edited by hand: the worker's is JSON
            raise UnreadableRecord(f"job {job_id!r}: result is not JSON ({exc})") from None
    if state == JobState.DEAD:
        f = fields
        raise JobDead(job_id, f.get("dead_reason"), f.get("last_error_type"), f.get("last_error"))
    if state == JobState.CANCELLED:
        raise JobCancelled(job_id, "", "job was cancelled")
    return False, None  # requeued between the two reads, say


def _read_state(keys: QueueKeys, job_id: str) -> Op[str | None]:
    """The state field of the job's hash: None for a job never claimed (its spec record alone)
    or a hash without one (edited by hand), neither finished. JobNotFound when it has neither.
    _UNREAD for a key of another type: the whole read (see _check) raises the typed error."""
    job_key = keys.job(job_id)
    try:
        state, size, spec = yield Commands(
            [("HGET", job_key, "state"), ("HLEN", job_key), ("GETRANGE", keys.spec(job_id), 0, 0)]
        )
    except ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        return _UNREAD
    if not size and not spec:
        raise JobNotFound(f"no job {job_id!r} in queue {keys.queue!r}")
    return None if state is None else codec.s(state)
