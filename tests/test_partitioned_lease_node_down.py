"""The manual lease API of a PartitionedQueue on a Redis Cluster with a node down (its primary
and replica killed, `cluster-require-full-coverage no`): claim leases the other partitions'
jobs and names the dead node's partitions in `not_reached` (never an exception hiding leased
jobs, never a job leased twice); the calls by id act on the answering partitions and raise
PartitionsNotReached whose `partial` has None for the jobs of the others; set_dead_retention
likewise. Before, none of these methods existed (AttributeError). Own cluster for the module
(a node is killed), ~10 s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from scheduler import AsyncPartitionedQueue, JobSpec, PartitionsNotReached
from scheduler._spawn_cluster import LocalCluster
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect, connect_async
from scheduler.core.partitions import meta_key
from tests.redis_server import require_server

pytestmark = pytest.mark.slow


@dataclass
class Down:
    url: str
    name: str
    live: dict[str, list[str]]  # partition name on a live node -> its jobs' ids
    dead: dict[str, list[str]]  # on the killed node


@pytest.fixture(scope="module")
def downs() -> Iterator[list[Down]]:
    """Two partitioned queues (one per test: each leases its own jobs), a node killed."""
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        for node in cluster.nodes:
            with cluster.node_client(node) as c:
                c.config_set("cluster-require-full-coverage", "no")
        keep = cluster.nodes[0].port  # the queues' records stay readable
        names = [
            f"ld{i}" for i in range(400) if cluster.primary_for(meta_key(f"ld{i}")).port == keep
        ][:2]
        gone = cluster.nodes[1]
        made = []
        for name in names:
            pq = PartitionedQueue.create(connect(cluster.url), name, partitions=6)
            port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
            jobs = {
                p.name: pq.enqueue_many([JobSpec("t", None, job_id=f"p{k}.j{i}") for i in range(3)])
                for k, p in enumerate(pq.parts)
            }
            pq.close()
            live = {n: ids for n, ids in jobs.items() if port[n] != gone.port}
            dead = {n: ids for n, ids in jobs.items() if port[n] == gone.port}
            assert len(live) >= 2 and dead  # 6 partitions over 3 primaries: 2 on each
            made.append(Down(cluster.url, name, live, dead))
        cluster.nodes[cluster.nodes.index(gone) + cluster.primaries].kill()  # no failover
        gone.kill()
        yield made


def test_claim_leases_the_answering_partitions_and_names_the_others(downs: list[Down]) -> None:
    down = downs[0]
    pq = PartitionedQueue.open(connect(down.url), down.name)
    try:
        first = pq.claim("w", limit=len(down.live))  # a share of one each, at most
        assert set(first.not_reached) == set(down.dead)
        assert 1 <= len(first.jobs) <= len(down.live)
        rest = pq.claim("w", limit=100)
        assert set(rest.not_reached) == set(down.dead)
        got = [j.id for j in first.jobs + rest.jobs]
        assert sorted(got) == sorted(i for ids in down.live.values() for i in ids)  # once each
        assert pq.claim("w", limit=100).jobs == []
        tok = {j.id: j.token for j in first.jobs + rest.jobs}
        dead_part, dead_ids = next(iter(down.dead.items()))
        live_part, live_ids = next(iter(down.live.items()))
        # A job of each kind, in the caller's order: the live one acted on, the dead one None.
        with pytest.raises(PartitionsNotReached) as err:
            pq.heartbeat([(dead_ids[0], "1-x"), (live_ids[0], tok[live_ids[0]])])
        assert err.value.missing == [dead_part] and err.value.partial[1] == {live_ids[0]: "held"}
        items = [(live_ids[1], tok[live_ids[1]], 1), (dead_ids[0], "1-x", 2)]
        with pytest.raises(PartitionsNotReached) as err:
            pq.complete_many(items)
        assert err.value.partial == ["done", None] and err.value.missing == [dead_part]
        assert pq.status(live_ids[1]) == "done"
        with pytest.raises(PartitionsNotReached) as err:
            pq.release([(dead_ids[1], "1-x"), (live_ids[2], tok[live_ids[2]])])
        assert err.value.partial == [None, "released"]
        with pytest.raises(PartitionsNotReached) as err:
            pq.set_dead_retention(max_count=10)
        assert sorted(err.value.missing) == sorted(down.dead) and live_part in err.value.done
        # Every live job but the released one is still held by this worker: nothing leased twice.
        again = pq.claim("w2", limit=100)
        assert [j.id for j in again.jobs] == [live_ids[2]]
    finally:
        pq.close()


def test_the_asyncio_claim_leases_the_answering_partitions(downs: list[Down]) -> None:
    down = downs[1]

    async def main() -> tuple[list[str], set[str], list[str]]:
        ac = connect_async(down.url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, down.name)
            batch = await apq.claim("w", limit=100)
            missing = set(batch.not_reached)
            items = [(j.id, j.token, None) for j in batch.jobs] + [(dead[0], "1-x", None)]
            with pytest.raises(PartitionsNotReached) as err:
                await apq.complete_many(items)
            return [j.id for j in batch.jobs], missing, err.value.partial
        finally:
            await ac.aclose()

    dead = next(iter(down.dead.values()))
    ids, missing, partial = asyncio.run(main())
    assert missing == set(down.dead)
    assert sorted(ids) == sorted(i for g in down.live.values() for i in g)
    assert partial == ["done"] * len(ids) + [None]
