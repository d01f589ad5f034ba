"""The driver's I/O on a Redis Cluster (scheduler.core.scripts.Scripts.drive is unchanged).

redis-py's ClusterPipeline refuses scripts and sends WAIT to a default node, so each batch is
split by the slot of each command's route key (Batch.routes: its request's first script KEY)
into one plain pipeline per primary, sent on that node's own connection, in order. A WAIT thus
follows its writes on the node that took them. SCRIPT LOAD (the driver's NOSCRIPT reload) goes
to every node of the batch.

MOVED / ASK (a failover or a resharding moved the slot): the command did not run, so it is sent
again, MOVED after a topology refresh, ASK to the node named with ASKING first; a WAIT after a
redirected write is sent again after it. A dropped connection propagates (as on one server: the
caller decides whether to retry) and marks the topology stale, so the next batch re-reads it
first instead of going to a dead primary again.

A batch over several nodes that loses one node raises, and the replies of the nodes that
answered are dropped with it, as a dropped connection loses a pipeline's replies on one server:
the driver's contract is that connection errors propagate and the caller re-sends the call
(the worker does, with the claim's nonce replaying a claim whose answer was lost). Handing them
back per request would make every caller handle a partial batch for a rare event. The asyncio
path waits for every node before raising, so no re-send overlaps the batch's own pipelines
still in flight."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator, Sequence
from typing import Any

from redis.asyncio.cluster import PipelineCommand
from redis.exceptions import AskError, MovedError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Redirections followed for one batch before the last one is handed back as the reply.
_REDIRECTS = 5
# Cluster clients whose topology must be re-read before their next batch (by id: the asyncio
# RedisCluster has __slots__, no attribute of ours fits on it).
_STALE: set[int] = set()
_DROPPED = (RedisConnectionError, RedisTimeoutError, OSError)

Wire = tuple[Any, ...]
Drive = Generator[Any, list[Any], list[Any]]
# One unit of sending: (node, [(index in the batch, asking first, command)]).
Plan = list[tuple[Any, list[tuple[int, bool, Wire]]]]


def _plan(rc: Any, routes: Sequence[str], cmds: Sequence[Wire], idx: Sequence[int]) -> Plan:
    by_node: dict[str, tuple[Any, list[tuple[int, bool, Wire]]]] = {}
    for i in idx:
        node = rc.get_node_from_key(routes[i]) if routes[i] else rc.get_default_node()
        by_node.setdefault(node.name, (node, []))[1].append((i, False, cmds[i]))
    return list(by_node.values())


def _redirects(
    rc: Any, routes: Sequence[str], cmds: Sequence[Wire], replies: list[Any], sent: Sequence[int]
) -> tuple[list[int], Plan | None]:
    """The indices to send again, and for ASK a ready plan (None: plan after a refresh)."""
    moved = [i for i in sent if isinstance(replies[i], AskError)]
    if not moved:
        return [], None
    first: dict[str, int] = {}
    for i in moved:
        first.setdefault(routes[i], i)
    again = sorted(
        set(moved)
        | {i for i in sent if cmds[i][0] == "WAIT" and i > first.get(routes[i], len(cmds))}
    )
    if any(isinstance(replies[i], MovedError) for i in moved):
        return again, None
    plan: dict[str, tuple[Any, list[tuple[int, bool, Wire]]]] = {}
    for i in again:
        err = replies[i] if isinstance(replies[i], AskError) else replies[first[routes[i]]]
        node = rc.get_node(host=err.host, port=err.port)
        if node is None:  # a node we do not know yet: refresh, then route by slot
            return again, None
        plan.setdefault(node.name, (node, []))[1].append((i, True, cmds[i]))
    return again, list(plan.values())


def run_sync(rc: Any, drive: Drive) -> list[Any]:
    """Drive on a blocking RedisCluster."""
    try:
        batch = next(drive)
        while True:
            batch = drive.send(_batch_sync(rc, batch))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _batch_sync(rc: Any, batch: Any) -> list[Any]:
    if _STALE:
        _refresh_sync(rc)
    replies: list[Any] = [None] * len(batch.cmds)
    todo, plan = list(range(len(batch.cmds))), None
    loaded: set[str] = set()
    for attempt in range(_REDIRECTS + 1):
        plan = plan or _plan(rc, batch.routes, batch.cmds, todo)
        try:
            for node, items in plan:
                conn = rc.get_redis_connection(node)
                if batch.loads and node.name not in loaded:
                    for text in batch.loads:
                        conn.script_load(text)
                    loaded.add(node.name)
                with conn.pipeline(transaction=False) as pipe:
                    for _, asking, cmd in items:
                        if asking:
                            pipe.execute_command("ASKING")
                        pipe.execute_command(*cmd)
                    got = pipe.execute(raise_on_error=False)
                got = _drop_asking(items, got)
                for (i, _, _), r in zip(items, got, strict=True):
                    replies[i] = r
        except _DROPPED:
            _STALE.add(id(rc))
            raise
        todo, plan = _redirects(rc, batch.routes, batch.cmds, replies, todo)
        if not todo or attempt == _REDIRECTS:
            break
        if plan is None:
            _refresh_sync(rc, force=True)
    return replies


async def run_async(rc: Any, drive: Drive) -> list[Any]:
    """Drive on a redis.asyncio RedisCluster: the nodes of one batch are sent to concurrently."""
    try:
        batch = next(drive)
        while True:
            batch = drive.send(await _batch_async(rc, batch))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _node_async(
    node: Any, items: list[tuple[int, bool, Wire]], loads: list[str]
) -> list[Any]:
    for text in loads:
        await node.execute_command("SCRIPT", "LOAD", text)
    cmds: list[PipelineCommand] = []
    for pos, (_, asking, cmd) in enumerate(items):
        if asking:
            cmds.append(PipelineCommand(-pos - 1, "ASKING"))
        cmds.append(PipelineCommand(pos, *cmd))
    await node.execute_pipeline(cmds)
    # redis-py stores a reply lost on the way back (a read error) as the command's result:
    # raised, as the blocking pipeline raises it, so the batch marks the topology stale.
    lost = [c.result for c in cmds if isinstance(c.result, _DROPPED)]
    if lost:
        raise lost[0]
    return [c.result for c in cmds if c.position >= 0]


async def _batch_async(rc: Any, batch: Any) -> list[Any]:
    await rc.initialize()  # a no-op once done: an asyncio RedisCluster connects lazily
    if _STALE:
        await _refresh_async(rc)
    replies: list[Any] = [None] * len(batch.cmds)
    todo, plan = list(range(len(batch.cmds))), None
    for attempt in range(_REDIRECTS + 1):
        plan = plan or _plan(rc, batch.routes, batch.cmds, todo)
        loads = batch.loads if attempt == 0 else []
        # Every node's pipeline ends before an error is raised: the caller's retry never runs
        # while the batch's other nodes still have it in flight.
        results: list[Any] = await asyncio.gather(
            *(_node_async(n, it, loads) for n, it in plan), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            if any(isinstance(r, _DROPPED) for r in failed):
                _STALE.add(id(rc))
            raise failed[0]
        for (_, items), got in zip(plan, results, strict=True):
            for (i, _, _), r in zip(items, got, strict=True):
                replies[i] = r
        todo, plan = _redirects(rc, batch.routes, batch.cmds, replies, todo)
        if not todo or attempt == _REDIRECTS:
            break
        if plan is None:
            await _refresh_async(rc, force=True)
    return replies


def _drop_asking(items: list[tuple[int, bool, Wire]], got: list[Any]) -> list[Any]:
    if not any(asking for _, asking, _ in items):
        return got
    out, pos = [], 0
    for _, asking, _ in items:
        pos += 1 if asking else 0
        out.append(got[pos])
        pos += 1
    return out


def _refresh_sync(rc: Any, *, force: bool = False) -> None:
    if force or id(rc) in _STALE:
        _STALE.discard(id(rc))
        with contextlib.suppress(RedisError, OSError):  # still down: the send will say so
            rc.nodes_manager.initialize()


async def _refresh_async(rc: Any, *, force: bool = False) -> None:
    if force or id(rc) in _STALE:
        _STALE.discard(id(rc))
        with contextlib.suppress(RedisError, OSError):
            await rc.nodes_manager.initialize()
