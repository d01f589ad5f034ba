"""PartitionedQueue.run_answering (and its asyncio twin) when one partition's hash slot moved to
another Redis Cluster node behind the client's back (a reshard it has not seen yet). Each
node's partitions are one driver call: the node answers MOVED for the moved partition, the
driver follows it to the slot's new node, and if that node does not answer, the whole call
raised, so every partition of the old node counted as not answering although that node
answered them. Only the moved partition may be reported (its new node is down); the old
node's other partitions answer. Own cluster for the module (a node is killed), ~8 s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from scheduler import AsyncPartitionedQueue
from scheduler._spawn_cluster import LocalCluster
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import cluster_io
from scheduler.core.connection import connect, connect_async
from scheduler.core.partitions import meta_key
from tests.fixtures.slot_move import SlotMove
from tests.redis_server import require_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Its own: a node is killed (its replica too: no failover), the others' slots served."""
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        for node in cluster.nodes:
            with cluster.node_client(node) as c:
                c.config_set("cluster-require-full-coverage", "no")
        yield cluster


def _partitioned(cluster: LocalCluster, name: str) -> PartitionedQueue:
    """12 partitions (4 a node), a due job in each; its record on a node never killed here."""
    pq = PartitionedQueue.create(connect(cluster.url), name, partitions=12)
    for p in pq.parts:
        p.enqueue("t", None)
    return pq


def _name(cluster: LocalCluster, prefix: str) -> str:
    """A queue name whose partition record is on node 0 (never killed here)."""
    return next(
        f"{prefix}{i}"
        for i in range(200)
        if cluster.primary_for(meta_key(f"{prefix}{i}")).port == cluster.nodes[0].port
    )


async def _open_async(cluster: LocalCluster, name: str) -> AsyncPartitionedQueue:
    aq = await AsyncPartitionedQueue.open(connect_async(cluster.url), name)
    await aq.run_answering(lambda p: p.ops.counts())  # its slot map read
    return aq


def test_a_partition_whose_redirections_ran_out_is_asked_again_after_a_slot_map_refresh(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver follows a MOVED _REDIRECTS times, then hands it back as the partition's reply
    (a slot that moved again and again; 0 here, so the first MOVED is handed back). That reply
    was not one of 'does not answer' (not_answering), so run_answering raised it whole: no
    partition of any node was read. Now the slot map is read again and that partition asked
    once more: every partition answers. Runs before the kill below (file order)."""
    name = _name(cluster, "rd")
    pq = _partitioned(cluster, name)
    loop = asyncio.new_event_loop()
    try:
        aq = loop.run_until_complete(_open_async(cluster, name))  # its map read, then stale too
        move = SlotMove(connect(cluster.url), pq.parts[0].keys.prefix)
        move.split()
        move.migrate(batch=100)
        move.finish()  # the clients' maps still say its old node
        monkeypatch.setattr(cluster_io, "_REDIRECTS", 0)
        for each in (
            pq.run_answering(lambda p: p.ops.counts()),
            loop.run_until_complete(aq.run_answering(lambda p: p.ops.counts())),
        ):
            assert [r.due for r in each] == [1] * len(pq.parts), each
        loop.run_until_complete(aq.aclose())
    finally:
        loop.close()
        pq.close()


def test_a_moved_partitions_old_node_still_answers_for_its_other_partitions(
    cluster: LocalCluster,
) -> None:
    name = _name(cluster, "sm")
    pq = _partitioned(cluster, name)
    port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
    # A partition of node 0 whose slot moves to another primary: that one dies.
    first = next(p for p in pq.parts if port[p.name] == cluster.nodes[0].port)

    loop = asyncio.new_event_loop()
    try:
        aq = loop.run_until_complete(_open_async(cluster, name))
        pq.run_answering(lambda p: p.ops.counts())  # the same for the blocking client
        move = SlotMove(connect(cluster.url), first.keys.prefix)
        move.split()
        move.migrate(batch=100)
        move.finish()  # the clients' maps still say node 0
        target = next(n for n in cluster.nodes if n.port == int(move.target.port))
        cluster.nodes[cluster.nodes.index(target) + cluster.primaries].kill()
        target.kill()
        lost = {p.name for p in pq.parts if port[p.name] == target.port} | {first.name}
        for each in (
            pq.run_answering(lambda p: p.ops.counts()),
            loop.run_until_complete(aq.run_answering(lambda p: p.ops.counts())),
        ):
            got = dict(zip((p.name for p in pq.parts), each, strict=True))
            failed = {n for n, r in got.items() if isinstance(r, BaseException)}
            assert failed == lost, (sorted(failed), sorted(lost))
            assert all(got[n].due == 1 for n in got if n not in lost)
        loop.run_until_complete(aq.aclose())
    finally:
        loop.close()
        pq.close()
