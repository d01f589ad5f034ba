"""The driver's I/O on a Redis Cluster (scheduler.core.scripts.Scripts.drive is unchanged).

redis-py's ClusterPipeline refuses scripts and sends WAIT to a default node, so each batch is
split by the slot of each command's route key (Batch.routes: its request's first script KEY)
into one plain pipeline per primary, sent on that node's own connection, in order. A WAIT thus
follows its writes on the node that took them. SCRIPT LOAD (the driver's NOSCRIPT reload) goes
to every node of the batch.

MOVED / ASK (a failover or a resharding moved the slot): the command did not run, so it is sent
again, MOVED after a topology refresh, ASK to the node named with ASKING first; a WAIT after a
redirected write is sent again after it. TRYAGAIN (the slot is being migrated: a script's
declared prefix key never exists, so every script call of the queue is refused whole until
CLUSTER SETSLOT NODE ends the move) did not run either: sent again to the same node, ASKING as
before, every _PAUSE_S for at most _TRYAGAIN_ROUNDS pauses (about 0.5 s, as redis-py's own
RedisCluster retries it; the context variable TRYAGAIN_ROUNDS sets another bound for one
task's calls), then handed back as the reply (TryAgainError). Never when a later command of the
same slot in the batch ran (the importing node took over between the two): the re-send would
run after it, out of order. A dropped connection propagates (as on one server:
the caller decides whether to retry) and marks the topology stale, so the next batch re-reads
it first instead of going to a dead primary again.

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
import time
from collections.abc import Generator, Sequence
from contextvars import ContextVar
from typing import Any

from redis.asyncio.cluster import PipelineCommand
from redis.exceptions import AskError, MovedError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.core.direct_io import transport_race

# Redirections followed for one batch before the last one is handed back as the reply.
_REDIRECTS = 5
# TRYAGAIN: pauses before a refused command is sent again, and how many before it is handed
# back (a 10,000-key slot moves in ~0.4 s at redis-cli's 10 keys per MIGRATE: docs/cluster.md).
_PAUSE_S = 0.05
_TRYAGAIN_ROUNDS = 10
# The pauses of the calls made in this context (a task): a worker claiming from several
# partitions sets 0, so a claim on the one being moved fails at once and the others' claims
# do not wait behind its re-sends (worker/claiming.py).
TRYAGAIN_ROUNDS: ContextVar[int] = ContextVar("TRYAGAIN_ROUNDS", default=_TRYAGAIN_ROUNDS)
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


def _again(
    rc: Any, routes: Sequence[str], cmds: Sequence[Wire], replies: list[Any], sent: Plan
) -> tuple[list[int], Plan | None, bool]:
    """The indices to send again; their plan (None: refresh the topology, then route by slot);
    whether to pause first (TRYAGAIN)."""
    where = {i: (node, asking) for node, items in sent for i, asking, _ in items}
    unrun = (AskError, TryAgainError)  # MovedError is an AskError
    first: dict[str, int] = {}
    for i in sorted(where):
        if isinstance(replies[i], unrun):
            first.setdefault(routes[i], i)
    # A slot where a command after the first refused one ran: its TRYAGAINs stay the replies.
    ran_after = {
        routes[i]
        for i in where
        if i > first.get(routes[i], len(cmds))
        and cmds[i][0] != "WAIT"
        and not isinstance(replies[i], unrun)
    }
    redirected = [i for i in where if isinstance(replies[i], AskError)]
    retried = [
        i for i in where if isinstance(replies[i], TryAgainError) and routes[i] not in ran_after
    ]
    if not redirected and not retried:
        return [], None, False
    heads = {routes[i]: i for i in sorted(redirected + retried, reverse=True)}
    again = sorted(
        {*redirected, *retried}
        | {i for i in where if cmds[i][0] == "WAIT" and i > heads.get(routes[i], len(cmds))}
    )
    pause = bool(retried)
    if any(isinstance(replies[i], MovedError) for i in redirected):
        return again, None, pause
    plan: dict[str, tuple[Any, list[tuple[int, bool, Wire]]]] = {}
    for i in again:
        head = i if i in redirected or i in retried else heads[routes[i]]
        err = replies[head]
        if isinstance(err, AskError):
            node, asking = rc.get_node(host=err.host, port=err.port), True
            if node is None:  # a node we do not know yet: refresh, then route by slot
                return again, None, pause
        else:  # TRYAGAIN: the same node, as sent
            node, asking = where[head]
        plan.setdefault(node.name, (node, []))[1].append((i, asking, cmds[i]))
    return again, list(plan.values()), pause


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
    redirects = pauses = 0
    while True:
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
        todo, plan, pause = _again(rc, batch.routes, batch.cmds, replies, plan)
        if not todo or (pauses if pause else redirects) == _bound(pause):
            break
        if pause:
            pauses += 1
            _wait_sync()
        else:
            redirects += 1
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
    try:
        await node.execute_pipeline(cmds)
    except (AttributeError, TypeError, RuntimeError) as exc:
        if not transport_race(exc):  # a write on a connection the peer closed (uvloop)
            raise
        # redis-py dropped the connection already: its ConnectionError, so the slot map is
        # re-read and the caller's retry (the worker's backoff) applies.
        raise RedisConnectionError(f"Connection lost while writing: {exc!r}") from exc
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
    redirects = pauses = 0
    while True:
        plan = plan or _plan(rc, batch.routes, batch.cmds, todo)
        loads = batch.loads if redirects + pauses == 0 else []
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
        todo, plan, pause = _again(rc, batch.routes, batch.cmds, replies, plan)
        if not todo or (pauses if pause else redirects) == _bound(pause):
            break
        if pause:
            pauses += 1
            await _wait_async()
        else:
            redirects += 1
        if plan is None:
            await _refresh_async(rc, force=True)
    return replies


def _bound(pause: bool) -> int:
    return TRYAGAIN_ROUNDS.get() if pause else _REDIRECTS


def _wait_sync() -> None:
    time.sleep(_PAUSE_S)


async def _wait_async() -> None:
    await asyncio.sleep(_PAUSE_S)


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
