"""What a partitioned queue's calls over every partition report when run_answering asks a
partition once more after a slot move: its first attempt's reply was lost with its node's whole
call (the driver followed one partition's MOVED to a node that did not answer), so that attempt
may have run, and a change asked again answers as if made before ('already', 'active').
Own cluster for the module (~8 s)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
import redis

from scheduler import AsyncPartitionedQueue
from scheduler._spawn_cluster import LocalCluster
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import cluster_io
from scheduler.core.connection import connect, connect_async
from scheduler.core.partitions import meta_key
from tests.redis_server import require_server
from tests.test_cluster_reshard import SlotMove

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        yield cluster


def _name(cluster: LocalCluster, prefix: str) -> str:
    """A queue name whose partition record is on node 0."""
    return next(
        f"{prefix}{i}"
        for i in range(200)
        if cluster.primary_for(meta_key(f"{prefix}{i}")).port == cluster.nodes[0].port
    )


class _OnceDown:
    """The first send of a command of the moved partition (its keys' `prefix`) to its new node
    (`port`: the driver following its MOVED) fails as a node that does not answer; the next
    ones go through: a node back by the time the call asks again."""

    def __init__(self, moved: tuple[str, int]) -> None:
        (self.prefix, self.port), self.failed = moved, 0

    def fail(self, port: int, cmds: Iterable[Sequence[Any]]) -> None:
        args = [a.decode() if isinstance(a, bytes) else str(a) for c in cmds for a in c]
        if not self.failed and port == self.port and any(self.prefix in a for a in args):
            self.failed += 1
            raise redis.ConnectionError("injected: the slot's new node not answering")


class _Conn:
    """A node's blocking client whose pipelines call `down` with their commands first."""

    def __init__(self, real: Any, port: int, down: _OnceDown) -> None:
        self.real, self.port, self.down = real, port, down

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def pipeline(self, **kwargs: Any) -> Any:
        pipe = self.real.pipeline(**kwargs)
        execute = pipe.execute

        def checked(**kw: Any) -> Any:
            self.down.fail(self.port, (args for args, _ in pipe.command_stack))
            return execute(**kw)

        pipe.execute = checked
        return pipe


def _inject(monkeypatch: pytest.MonkeyPatch, rc: Any, down: _OnceDown) -> None:
    """`down` before each node's send: the blocking client's pipelines, the asyncio path's
    per-node pipeline (cluster_io)."""
    if isinstance(rc, redis.RedisCluster):
        real = rc.get_redis_connection
        monkeypatch.setattr(
            rc, "get_redis_connection", lambda node: _Conn(real(node), int(node.port), down)
        )
    else:
        node_async = cluster_io._node_async

        async def send(node: Any, items: Any, loads: Any) -> Any:
            down.fail(int(node.port), (cmd for _, _, cmd in items))
            return await node_async(node, items, loads)

        monkeypatch.setattr(cluster_io, "_node_async", send)


def _set_up(cluster: LocalCluster, prefix: str, verb: str) -> str:
    """A 12-partition queue; every partition already `verb`ed (paused / resumed) but node 0's
    other partitions, the ones this call changes (not the first of node 0's, moved by
    _move). Its name."""
    name = _name(cluster, prefix)
    with PartitionedQueue.create(connect(cluster.url), name, partitions=12) as pq:
        port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
        mine = [p for p in pq.parts if port[p.name] == cluster.nodes[0].port]
        first, changed = mine[0], [p.name for p in mine[1:]]
        assert changed, "node 0 holds a single partition"
        for p in pq.parts:
            p.pause()
        for p in pq.parts:
            if (verb == "resume") != (p.name in changed):
                getattr(p, verb)()
        assert first.name not in changed
        return name


def _move(cluster: LocalCluster, name: str) -> tuple[str, int]:
    """The first of node 0's partitions moved to another primary behind the clients' backs:
    its keys' prefix, the port of its new node."""
    with PartitionedQueue.open(connect(cluster.url), name) as pq:
        first = next(
            p for p in pq.parts if cluster.primary_for(p.keys.prefix).port == cluster.nodes[0].port
        )
        move = SlotMove(connect(cluster.url), first.keys.prefix)
        move.split()
        move.migrate(batch=100)
        move.finish()
        return first.keys.prefix, int(move.target.port)


@pytest.mark.parametrize(("verb", "changed_word"), [("pause", "paused"), ("resume", "resumed")])
def test_a_change_asked_again_after_its_reply_was_lost_reports_the_change(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, verb: str, changed_word: str
) -> None:
    """Node 0's other partitions took the change in the first attempt (their replies lost
    with the call the moved partition's new node failed); asked again they answer 'already'
    ('active'), and every other partition was so before the call. The call reported
    'already' ('active'): that it changed nothing, although it paused (resumed) them."""
    name = _set_up(cluster, f"ro{verb[0]}", verb)
    pq = PartitionedQueue.open(connect(cluster.url), name)
    pq.run_answering(lambda p: p.ops.counts())  # its slot map read, then stale
    _inject(monkeypatch, pq.client, down := _OnceDown(_move(cluster, name)))
    try:
        assert getattr(pq, verb)() == changed_word
        assert down.failed == 1  # the first attempt did lose its reply
        state = {p.name: p.counts().paused for p in pq.parts}
        assert all(state.values()) if verb == "pause" else not any(state.values())
    finally:
        pq.close()


@pytest.mark.parametrize(("verb", "changed_word"), [("pause", "paused"), ("resume", "resumed")])
def test_asyncio_a_change_asked_again_after_its_reply_was_lost_reports_the_change(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, verb: str, changed_word: str
) -> None:
    """The same for AsyncPartitionedQueue."""
    name = _set_up(cluster, f"ra{verb[0]}", verb)

    async def run() -> tuple[str, int]:
        aq = await AsyncPartitionedQueue.open(connect_async(cluster.url), name)
        try:
            await aq.run_answering(lambda p: p.ops.counts())  # its slot map read
            down = _OnceDown(_move(cluster, name))
            _inject(monkeypatch, aq.client, down)
            return await getattr(aq, verb)(), down.failed
        finally:
            await aq.aclose()

    assert asyncio.run(run()) == (changed_word, 1)
