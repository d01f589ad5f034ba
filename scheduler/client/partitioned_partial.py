"""A partitioned queue's calls over the partitions that answer, shared by client/partitioned.py
and partitioned_aio.py: run_answering (each node's partitions in one driver call, a partition
asked once more when its slot moved), and the library's partial reads, which raise
PartitionsNotReached carrying what the answering partitions hold (docs/cluster.md); never_sent."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import AskError, RedisError

from scheduler.client.partitioned_merge import (
    PartitionsNotReached,
    answered,
    held_whole,
    merge_counts,
    merge_dead,
    merge_scored,
    not_migrating,
)
from scheduler.core.connection import UNREACHABLE, is_cluster
from scheduler.core.errors import slot_move_text
from scheduler.core.models import QueueCounts
from scheduler.operations.ops import Op
from scheduler.schedules.recurring import Schedule

T = TypeVar("T")
Make = Callable[[Any], Op[Any]]
Lost = Callable[[Any], Any] | None


def nodes_of(client: Any, parts: Sequence[Any]) -> list[str]:
    """The name of the cluster node holding each of `parts` as the client's slot map says
    ("" each on one server; a slot served by no node: a name of its own, its call says why)."""
    if not is_cluster(client):
        return [""] * len(parts)
    out = []
    for i, p in enumerate(parts):
        try:
            out.append(client.get_node_from_key(p.keys.prefix).name)
        except UNREACHABLE:
            out.append(f"?{i}")
    return out


def by_node(nodes: Sequence[str]) -> list[list[int]]:
    """The indices of `nodes` grouped by node, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        groups.setdefault(n, []).append(i)
    return list(groups.values())


def ask_again(
    before: Sequence[str], after: Sequence[str], out: Sequence[Any], whole: set[int]
) -> list[int]:
    """Which partitions to ask once more after a slot moved: one whose own reply is a MOVED or
    ASK (the driver's redirections used up), and every partition of a node's call that failed
    whole (`whole`) where one of them is now held by another node: the driver followed that
    one's MOVED to its new node, and it was that node that did not answer, not theirs."""
    again = {i for i, r in enumerate(out) if isinstance(r, AskError)}  # MovedError is one
    left = {before[i] for i in whole if after[i] != before[i]}
    return sorted(again | {i for i in whole if before[i] in left})


def its_retry(r: Any, reply_lost: bool, lost: Lost) -> Any:
    """A partition's result asked again: lost(r) when its first attempt's reply was lost (it
    may have run: a change then answers as if made before, pause's 'already'), else r."""
    return lost(r) if lost is not None and reply_lost and not isinstance(r, BaseException) else r


def _serving_sync(q: Any, asked: Sequence[Any], held: dict[str, list[int]]) -> list[int]:
    """Of `held` (held_whole), those their node still serves: it answers CLUSTER NODES and is
    not migrating their slots away (the call failed on another's ASK to a node down)."""
    keep: list[int] = []
    for name, idx in held.items():
        node = q.client.get_node(node_name=name) if is_cluster(q.client) else None
        with contextlib.suppress(RedisError, OSError):
            reply = node and q.client.get_redis_connection(node).execute_command("CLUSTER NODES")
            keep += not_migrating([q.client.keyslot(p.keys.prefix) for p in asked], idx, reply)
    return keep


async def _serving_async(q: Any, asked: Sequence[Any], held: dict[str, list[int]]) -> list[int]:
    keep: list[int] = []
    for name, idx in held.items():
        node = q.client.get_node(node_name=name) if is_cluster(q.client) else None
        with contextlib.suppress(RedisError, OSError):
            reply = node and await node.execute_command("CLUSTER NODES")
            keep += not_migrating([q.client.keyslot(p.keys.prefix) for p in asked], idx, reply)
    return keep


def _groups_sync(
    q: Any, make: Make, asked: Sequence[Any], nodes: Sequence[str]
) -> tuple[list[Any], set[int]]:
    return per_node_sync(q, [(p, make(p)) for p in asked], nodes)


def per_node_sync(
    q: Any, ops: Sequence[tuple[Any, Op[Any]]], nodes: Sequence[str] | None = None
) -> tuple[list[Any], set[int]]:
    """q._run_many(ops, errors=True) as one driver call per node (`nodes`: each op's, else
    the slot map's): a node that does not answer puts its error in the place of each of its
    ops (their indices: the second value) and the other nodes' still run."""
    nodes = nodes_of(q.client, [p for p, _ in ops]) if nodes is None else nodes
    out: list[Any] = [None] * len(ops)
    whole: set[int] = set()
    for idx in by_node(nodes):
        try:
            got = q._run_many([ops[i] for i in idx], errors=True)
        except UNREACHABLE as exc:
            got, whole = [exc] * len(idx), whole | set(idx)
        for i, r in zip(idx, got, strict=True):
            out[i] = r
    return out, whole


def answering_sync(q: Any, make: Make, asked: Sequence[Any], lost: Lost = None) -> list[Any]:
    """PartitionedQueue.run_answering over `asked` (of q.parts): one result each, in order."""
    before = nodes_of(q.client, asked)
    out, whole = _groups_sync(q, make, asked, before)
    if any(isinstance(r, AskError) for r in out):
        with contextlib.suppress(RedisError, OSError):  # still moving: the call says so
            q.client.nodes_manager.initialize()
    again = ask_again(before, nodes_of(q.client, asked), out, whole)
    again = sorted({*again, *_serving_sync(q, asked, held_whole(before, out, whole, again))})
    if again:
        sub = [asked[i] for i in again]
        got, _ = _groups_sync(q, make, sub, nodes_of(q.client, sub))
        for i, r in zip(again, got, strict=True):
            out[i] = its_retry(r, i in whole, lost)
    return answered(out)


async def _groups_async(
    q: Any, make: Make, asked: Sequence[Any], nodes: Sequence[str]
) -> tuple[list[Any], set[int]]:
    return await per_node_async(q, [(p, make(p)) for p in asked], nodes)


async def per_node_async(
    q: Any, ops: Sequence[tuple[Any, Op[Any]]], nodes: Sequence[str] | None = None
) -> tuple[list[Any], set[int]]:
    """per_node_sync for asyncio: the nodes' calls concurrently, as the driver sends one
    batch's nodes, each finished before any error is raised."""
    if is_cluster(q.client):
        await q.client.initialize()  # a no-op once done: it connects lazily
    nodes = nodes_of(q.client, [p for p, _ in ops]) if nodes is None else nodes
    groups = by_node(nodes)
    calls = [q._run_many([ops[i] for i in idx], errors=True) for idx in groups]
    if len(calls) == 1:  # one server (or node): awaited as is, no task of its own
        try:
            results: list[Any] = [await calls[0]]
        except UNREACHABLE as exc:
            results = [exc]
    else:
        results = await asyncio.gather(*calls, return_exceptions=True)
    out: list[Any] = [None] * len(ops)
    whole: set[int] = set()
    for idx, got in zip(groups, results, strict=True):
        if isinstance(got, BaseException):
            if not isinstance(got, UNREACHABLE):
                raise got
            got, whole = [got] * len(idx), whole | set(idx)
        for i, r in zip(idx, got, strict=True):
            out[i] = r
    return out, whole


async def answering_async(q: Any, make: Make, asked: Sequence[Any], lost: Lost = None) -> list[Any]:
    """answering_sync for asyncio."""
    if is_cluster(q.client):
        await q.client.initialize()  # a no-op once done: it connects lazily
    before = nodes_of(q.client, asked)
    out, whole = await _groups_async(q, make, asked, before)
    if any(isinstance(r, AskError) for r in out):
        with contextlib.suppress(RedisError, OSError):
            await q.client.nodes_manager.initialize()
    again = ask_again(before, nodes_of(q.client, asked), out, whole)
    held = held_whole(before, out, whole, again)
    again = sorted({*again, *await _serving_async(q, asked, held)})
    if again:
        sub = [asked[i] for i in again]
        got, _ = await _groups_async(q, make, sub, nodes_of(q.client, sub))
        for i, r in zip(again, got, strict=True):
            out[i] = its_retry(r, i in whole, lost)
    return answered(out)


def not_read(what: str, parts: Sequence[Any], left_out: dict[str, str], partial: Any) -> None:
    """Raise PartitionsNotReached for a read (`what`) that left out the partitions named in
    `left_out` (name -> why), carrying `partial`, the answer of the others; none left out: no."""
    if left_out:
        done = [p.name for p in parts if p.name not in left_out]
        errors = list(dict.fromkeys(left_out.values()))
        raise PartitionsNotReached(what, done, list(left_out), errors, partial=partial)


def read_every(
    what: str, parts: Sequence[Any], each: Sequence[Any], merge: Callable[[list[Any]], T]
) -> T:
    """A read of every partition from run_answering's results: merge(each result, None in place
    of a partition that did not answer). Some did not: PartitionsNotReached carrying it."""
    value = merge([None if isinstance(r, BaseException) else r for r in each])
    failed = {
        p.name: slot_move_text(r) or str(r)
        for p, r in zip(parts, each, strict=True)
        if isinstance(r, BaseException)
    }
    not_read(what, parts, failed, value)
    return value


def counts_of(got: list[Any]) -> QueueCounts:
    """read_every's merge for counts: the answering partitions' counts as one queue's."""
    return merge_counts([c for c in got if c is not None])


def dead_lists(got: list[Any]) -> list[list[tuple[float, str]]]:
    """read_every's merge for dead_scored: [] in place of a partition not read."""
    return [[] if g is None else g for g in got]


def dead_page(offset: int, end: int | None) -> Callable[[list[Any]], list[str]]:
    """read_every's merge for dead_ids: the answering partitions' ids merged newest first,
    then [offset:end] of that."""
    return lambda got: merge_dead(dead_lists(got))[offset:end]


def schedules_of(got: list[Any]) -> list[Schedule]:
    """read_every's merge for list_schedules: the answering partitions' schedules by name."""
    return sorted((s for g in got if g is not None for s in g), key=lambda s: s.name)


def chosen_page(
    q: Any,
    asked: Sequence[Any],
    each: Sequence[Any],
    page: tuple[str, int, int],
    left_out: dict[str, str],
) -> list[tuple[int, str]]:
    """(partition, id) of a list_jobs page (`page`: state, offset, limit) from run_answering's
    (score, id) pairs of `asked` (of q.parts): one whose node did not answer is added to
    `left_out` (name -> why), and every partition named there gives an empty page."""
    got = dict(zip((p.name for p in asked), each, strict=True))
    left_out.update(
        (n, slot_move_text(r) or str(r)) for n, r in got.items() if isinstance(r, BaseException)
    )
    per = [[] if p.name in left_out else got[p.name] for p in q.parts]
    return merge_scored(page[0], per, page[1], page[2])


def never_sent(exc: BaseException, client: Any) -> bool:
    """A call that raised `exc` was never sent: redis-py's only attempt (a retry's may follow
    a sent one) failed connecting, by the socket's error under redis-py's, not its words: one
    only a connect raises, or a timeout raised in redis-py's `_connect` (docs/cluster.md)."""
    if not is_cluster(client):  # its connections' Retry, as redis-py makes it from these
        kw = client.connection_pool.connection_kwargs
        retry = kw.get("retry")
        again = kw.get("retry_on_timeout") or kw.get("retry_on_error")
        if (retry.get_retries() if retry is not None else int(bool(again))) != 0:
            return False
    at: BaseException | None = exc
    while at is not None:  # redis-py's error, the socket's under it
        if isinstance(at, ConnectionRefusedError | FileNotFoundError | socket.gaierror) or (
            isinstance(at, OSError) and at.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
        ):
            return True
        if isinstance(at, socket.timeout) and not isinstance(at, RedisError):
            return traceback.extract_tb(at.__traceback__)[-1:][0].name == "_connect"
        at = at.__cause__ or at.__context__
    return False
