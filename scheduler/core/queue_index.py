"""The queue index `sched:queues`: a SET of the queue names that were ever written to, so that
the CLI and the dashboard list queues without a SCAN of the whole keyspace (2.4 s of server
time per listing at 2 million unrelated keys, measured: docs/guide/operating.md).

Producers (enqueue, schedule) add their queue's name once per process and client, after their
first call that wrote (`after_call`: a call refused before anything was written adds nothing, so
a typo'd name in a refused call does not stay in the index, which is never pruned); workers at
their first beat. The index is an advisory listing, never the truth about jobs: a failed
addition is ignored (the call it precedes goes on), and a reader checks each name still has
keys. Writers older than the index did not add names, so a reader scans the keyspace once and
adds what it found, with the member `*` (no queue name) meaning "scanned"; deleting the key
makes the next reader scan again."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from scheduler.core.errors import (
    REFUSED_UNTIL_FIXED,
    BadArgument,
    NotDurable,
    refused_for_now,
)
from scheduler.core.keys import QUEUE_INDEX, QueueKeys, check_queue_name

T = TypeVar("T")
SCANNED = "*"  # the member saying a reader scanned the keyspace into the index

# Names added through each client (weakly keyed: a client dropped takes its entry along).
_added: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


# An index that could not be reached through a client: not tried again through it before then
# (monotonic s). Tried by every call, a cluster node down (the index's) held each enqueue to a
# queue of a healthy node for the failed SADD's seconds of retries.
_down_until: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
RETRY_AFTER_S = 60.0


def _new(client: Any, names: Sequence[str]) -> tuple[list[str] | None, set[str]]:
    """The names to add (None: the index is unreachable for now), and the set to note them in."""
    try:
        seen = _added.setdefault(client, set())
        if _down_until.get(client, 0.0) > time.monotonic():
            return None, seen
    except TypeError:  # a client that cannot be weakly referenced: remembered by nothing
        seen = set()
    return [n for n in names if n not in seen], seen


def _failed(client: Any, exc: Exception) -> bool:
    """After a failed SADD: True (refused for good: noted as added) for a refusal such as an
    ACL's; False, tried again RETRY_AFTER_S later, for a server or cluster node that cannot
    answer or refuses only for now (CLUSTERDOWN, TRYAGAIN, READONLY in a failover, OOM)."""
    if isinstance(exc, ResponseError) and not refused_for_now(exc):
        return True
    with contextlib.suppress(TypeError):
        _down_until[client] = time.monotonic() + RETRY_AFTER_S
    return False


def add(client: Any, names: Sequence[str]) -> bool:
    """SADD the names this client has not added yet; True once they are in (or refused). A
    refusal (an ACL without SADD) is ignored and not tried again by this process; an
    unreachable server or one refusing for now (False) is tried again later (_failed). The
    index is advisory: the caller's own call tells the real story."""
    new, seen = _new(client, names)
    if new is None:
        return False
    if new:
        try:
            client.sadd(QUEUE_INDEX, *new)
        except (RedisError, RedisClusterException) as exc:
            if not _failed(client, exc):
                return False
        seen.update(new)
    return True


async def add_async(client: Any, names: Sequence[str]) -> bool:
    """`add` on an asyncio client."""
    new, seen = _new(client, names)
    if new is None:
        return False
    if new:
        try:
            await client.sadd(QUEUE_INDEX, *new)
        except (RedisError, RedisClusterException) as exc:
            if not _failed(client, exc):
                return False
        seen.update(new)
    return True


def written(client: Any, names: Sequence[str], call: Callable[[], T]) -> T:
    """call(), a producer's write on `names`; then their `add`, or `after_call` when it raised."""
    try:
        got = call()
    except Exception as exc:
        after_call(client, names, exc)
        raise
    add(client, names)
    return got


def after_call(client: Any, names: Sequence[str], exc: BaseException) -> bool:
    """After a producer's call on `names` raised `exc`: `add` when it wrote (NotDurable: written,
    not acknowledged; a partitioned call's error with `written_ids`), or when the server refused
    it and the queue has keys (a later batch of a call refused, the earlier ones written); nothing
    for a refusal before anything was sent (bad input) nor for a call that failed otherwise (the
    server unreachable: the next call that writes adds it, and the queue's workers do). True as
    `add`'s; only a refused call pays a round trip (EXISTS), errors ignored."""
    if isinstance(exc, NotDurable) or getattr(exc, "written_ids", None):
        return add(client, names)
    if not _server_refused(exc):
        return False
    try:
        pipe = client.pipeline(transaction=False)
        for name in names:
            _exists(pipe, name)
        stored = [n for n, got in zip(names, pipe.execute(), strict=True) if got]
    except (RedisError, RedisClusterException):
        return False
    return bool(stored) and add(client, stored) and len(stored) == len(names)


async def after_call_async(client: Any, names: Sequence[str], exc: BaseException) -> bool:
    """`after_call` on an asyncio client."""
    if isinstance(exc, NotDurable) or getattr(exc, "written_ids", None):
        return await add_async(client, names)
    if not _server_refused(exc):
        return False
    try:
        pipe = client.pipeline(transaction=False)
        for name in names:
            _exists(pipe, name)
        stored = [n for n, got in zip(names, await pipe.execute(), strict=True) if got]
    except (RedisError, RedisClusterException):
        return False
    return bool(stored) and await add_async(client, stored) and len(stored) == len(names)


def _server_refused(exc: BaseException) -> bool:
    # script_errors.translate: a script's BAD_ARGUMENT, CORRUPT, NEWER_STORAGE.
    return isinstance(exc, REFUSED_UNTIL_FIXED) or (
        isinstance(exc, BadArgument) and str(exc).startswith("refused by the server")
    )


def _exists(pipe: Any, name: str) -> None:
    k = QueueKeys(name)
    # The config hash too: a paused queue emptied of jobs has only that, and its operator
    # must still find it to resume it (admin/inspection.py queue_exists agrees).
    pipe.exists(k.due, k.leased, k.dead, k.wake, k.workers, k.finished, k.schedules,
                k.flow_held, k.flow_waiting, k.dead_migrating, k.config)  # fmt: skip


class SharedAdd:
    """An async producer's `add_async` of its names, shared by a burst of first calls: each
    made its own SADD, one pooled connection per call in flight (past 100: MaxConnectionsError).
    Once added it costs nothing; a failed or cancelled try is made again by the next call."""

    def __init__(self, client: Any, names: Sequence[str]) -> None:
        self._client, self._names = client, tuple(names)
        self._task: asyncio.Task[bool] | None = None
        self._added = False

    async def __call__(self) -> None:
        if self._added:
            return
        loop, task = asyncio.get_running_loop(), self._task
        if task is None or task.get_loop() is not loop or _ended_unadded(task):
            task = self._task = loop.create_task(add_async(self._client, self._names))
        self._added = await asyncio.shield(task)


def _ended_unadded(task: asyncio.Task[bool]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None or not task.result())


def listed(client: Any) -> list[str] | None:
    """The indexed names that still have keys (a queue emptied for good drops out of the
    listing, not the index), or None when a reader has not scanned into the index yet (or it
    is not a SET: edited by hand) or a node holding some of them does not answer. The index's
    own node unreachable raises, as a SCAN would."""
    try:
        members = {str(m) for m in client.smembers(QUEUE_INDEX)}
    except ResponseError:  # WRONGTYPE: the caller scans instead
        return None
    if SCANNED not in members:
        return None
    names = sorted(n for n in members if _valid(n))
    pipe = client.pipeline(transaction=False)
    for name in names:
        _exists(pipe, name)
    found = pipe.execute(raise_on_error=False)
    if any(isinstance(got, Exception) for got in found):  # a cluster node down: the caller's
        return None  # SCAN names it, and lists the others' queues
    return [n for n, got in zip(names, found, strict=True) if got]


def add_scanned(client: Any, names: Sequence[str]) -> None:
    """After a full SCAN: its names, and the member saying the index now lists every queue."""
    with contextlib.suppress(RedisError):  # a read-only role: the next listing scans again
        client.sadd(QUEUE_INDEX, SCANNED, *names)


def _valid(name: str) -> bool:
    try:
        check_queue_name(name)
    except BadArgument:
        return False
    return True
