"""A one-job call of a PartitionedQueue on a Redis Cluster with a node down (its primary and
replica killed, `cluster-require-full-coverage no`), for an id not in the partition it routes
to (a job written to a partition's own queue has an untagged id): the other partitions are
asked (partitioned_ids.holding_sync / _async) in one driver call, so the dead node's failure
raised for all of them: a job on a live partition was not found (a bare ConnectionError), and
`jobs show` named the partition the id routes to as the one holding it. Now a job on a live
partition is found; one on none of the answering partitions raises PartitionsNotReached naming
the others (it may be there), never JobNotFound; `jobs show` / `reschedule` / `cancel ID` say
so (exit 3). Own cluster for the module (a node is killed), ~8 s."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncPartitionedQueue, PartitionsNotReached
from scheduler._spawn_cluster import LocalCluster
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect, connect_async
from scheduler.core.partitions import meta_key
from tests.redis_server import require_server

pytestmark = pytest.mark.slow


@dataclass
class Down:
    url: str
    name: str
    live: list[str]  # partition names on live nodes, in partition order
    dead: list[str]  # on the killed node
    stray: str  # a job on a live partition, its id routing to another live one
    ghost: str  # an id of no job, routing to a live partition


@pytest.fixture(scope="module")
def down() -> Iterator[Down]:
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        for node in cluster.nodes:
            with cluster.node_client(node) as c:
                c.config_set("cluster-require-full-coverage", "no")
        keep = cluster.nodes[0].port  # the queue's record stays readable
        name = next(
            f"ud{i}" for i in range(200) if cluster.primary_for(meta_key(f"ud{i}")).port == keep
        )
        pq = PartitionedQueue.create(connect(cluster.url), name, partitions=6)
        port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
        gone = next(n for n in cluster.nodes[1 : cluster.primaries] if n.port in port.values())
        live = [k for k, p in enumerate(pq.parts) if port[p.name] != gone.port]
        assert len(live) >= 2 and len(live) < len(pq.parts)
        at, to = live[0], live[1]
        stray = next(f"s-{n}" for n in range(500) if pq.layout.partition_of_id(f"s-{n}") == to)
        pq.parts[at].enqueue("t", None, job_id=stray, delay_ms=3_600_000)
        ghost = next(f"g-{n}" for n in range(500) if pq.layout.partition_of_id(f"g-{n}") == to)
        names = [p.name for p in pq.parts]
        pq.close()
        cluster.nodes[cluster.nodes.index(gone) + cluster.primaries].kill()  # no failover
        gone.kill()
        yield Down(
            cluster.url,
            name,
            [names[k] for k in live],
            [n for n in names if port[n] == gone.port],
            stray,
            ghost,
        )


def _sync(down: Down, job_id: str) -> str:
    pq = PartitionedQueue.open(connect(down.url), down.name)
    try:
        return str(pq.status(job_id)) + pq.get_job(job_id).id
    finally:
        pq.close()


def _asyncio(down: Down, job_id: str) -> str:
    async def run() -> str:
        aq = await AsyncPartitionedQueue.open(connect_async(down.url), down.name)
        try:
            return str(await aq.status(job_id)) + (await aq.get_job(job_id)).id
        finally:
            await aq.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize("read", [_sync, _asyncio], ids=["sync", "asyncio"])
def test_a_job_on_a_live_partition_is_found(down: Down, read: object) -> None:
    assert read(down, down.stray) == f"scheduled{down.stray}"  # type: ignore[operator]


@pytest.mark.parametrize("read", [_sync, _asyncio], ids=["sync", "asyncio"])
def test_a_job_on_no_answering_partition_is_not_reached(down: Down, read: object) -> None:
    with pytest.raises(PartitionsNotReached) as err:
        read(down, down.ghost)  # type: ignore[operator]
    assert isinstance(err.value, redis.ConnectionError)  # what retries a dead node retries this
    assert err.value.missing == down.dead
    assert sorted(err.value.done) == sorted(down.live)
    assert down.ghost in str(err.value)


@pytest.mark.parametrize(
    "args",
    [["jobs", "show"], ["jobs", "reschedule", "--now"], ["jobs", "cancel"]],
    ids=["show", "reschedule", "cancel"],
)
def test_cli_names_the_partitions_not_reached(down: Down, args: list[str]) -> None:
    res = CliRunner().invoke(main, [*args, "-q", down.name, "--url", down.url, down.ghost])
    assert res.exit_code == 3, res.output
    assert f"job {down.ghost}, in none of the partitions that answered" in res.stderr
    assert all(n in res.stderr for n in down.dead), res.stderr
    assert "no job" not in res.output and "missing" not in res.output


def test_cli_acts_on_a_job_on_a_live_partition(down: Down) -> None:
    base = ["-q", down.name, "--url", down.url]
    res = CliRunner().invoke(main, ["jobs", "show", "--json", *base, down.stray])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["partition"] == down.live[0]
    res = CliRunner().invoke(main, ["jobs", "cancel", *base, down.stray])
    assert res.exit_code == 0, res.output
    assert f"{down.stray}: cancelled (was scheduled)" in res.stdout
