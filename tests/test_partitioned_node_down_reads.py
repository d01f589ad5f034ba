"""The library's reads of every partition of a PartitionedQueue / AsyncPartitionedQueue with a
Redis Cluster node down (its primary and replica killed, `cluster-require-full-coverage no`):
counts, list_jobs, dead_ids, dead_scored and list_schedules raised the dead node's bare
ConnectionError, with nothing read and no partition named, while the CLI and the dashboard
show the answering partitions. They now raise PartitionsNotReached (still a ConnectionError):
`missing` names the partitions not read, `done` the others, and `partial` is what the call
returns, of those only (docs/cluster.md). Own cluster for the module (a node is killed), ~8 s."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from scheduler import AsyncPartitionedQueue, JobSpec, PartitionsNotReached, Queue
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
    parts: list[str]  # every partition's name, in partition order
    live: list[str]  # partition names on live nodes, in partition order
    dead: list[str]  # on the killed node
    due: dict[str, set[str]] = field(default_factory=dict)  # partition -> its due job ids
    dead_ids: dict[str, str] = field(default_factory=dict)  # partition -> its dead job's id
    schedules: dict[str, str] = field(default_factory=dict)  # partition -> its schedule
    ports: tuple[int, int] = (0, 0)  # a node never killed (the record's), the killed one


@pytest.fixture(scope="module")
def down() -> Iterator[Down]:
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        for node in cluster.nodes:
            with cluster.node_client(node) as c:
                c.config_set("cluster-require-full-coverage", "no")
        keep = cluster.nodes[0].port  # the queue's record stays readable
        name = next(
            f"nr{i}" for i in range(200) if cluster.primary_for(meta_key(f"nr{i}")).port == keep
        )
        pq = PartitionedQueue.create(connect(cluster.url), name, partitions=6)
        port = {p.name: cluster.primary_for(p.keys.prefix).port for p in pq.parts}
        gone = next(n for n in cluster.nodes[1 : cluster.primaries] if n.port in port.values())
        d = Down(cluster.url, name, [p.name for p in pq.parts], [], [])
        for k, p in enumerate(pq.parts):
            (d.dead if port[p.name] == gone.port else d.live).append(p.name)
            job_id = p.enqueue("t", None)
            (job,) = p.claim("w-test").jobs
            p.fail(job.id, job.token, ("Boom", "it broke", ""), retryable=False)
            d.dead_ids[p.name] = job_id
            d.due[p.name] = {p.enqueue("t", None), p.enqueue("t", None)}
            p.enqueue("t", None, delay_ms=3_600_000)
            s = next(f"s{i}" for i in range(500) if pq.layout.partition_of_schedule(f"s{i}") == k)
            pq.schedule(s, "t", None, every_ms=3_600_000)
            d.schedules[p.name] = s
        pq.close()
        assert d.live and d.dead
        cluster.nodes[cluster.nodes.index(gone) + cluster.primaries].kill()  # no failover
        gone.kill()
        d.ports = (keep, gone.port)
        yield d


Read = Callable[[Any], Any]


def _raised(down: Down, read: Read, asyncio_client: bool) -> PartitionsNotReached:
    """PartitionsNotReached raised by read(queue), with the blocking or the asyncio client."""
    if not asyncio_client:
        pq = PartitionedQueue.open(connect(down.url), down.name)
        try:
            with pytest.raises(PartitionsNotReached) as err:
                read(pq)
        finally:
            pq.close()
        return err.value

    async def run() -> PartitionsNotReached:
        aq = await AsyncPartitionedQueue.open(connect_async(down.url), down.name)
        try:
            with pytest.raises(PartitionsNotReached) as err:
                await read(aq)
        finally:
            await aq.aclose()
        return err.value

    return asyncio.run(run())


READS: dict[str, Read] = {
    "counts": lambda q: q.counts(),
    "list_jobs": lambda q: q.list_jobs("due", limit=100),
    "dead_ids": lambda q: q.dead_ids(),
    "dead_scored": lambda q: q.dead_scored(),
    "list_schedules": lambda q: q.list_schedules(),
}


@pytest.mark.parametrize("asyncio_client", [False, True], ids=["sync", "asyncio"])
@pytest.mark.parametrize("what", list(READS))
def test_a_read_names_the_partitions_not_read_and_carries_the_others(
    down: Down, what: str, asyncio_client: bool
) -> None:
    err = _raised(down, READS[what], asyncio_client)
    assert isinstance(err, redis.ConnectionError)  # what retries a dead node retries this
    assert err.missing == down.dead and err.done == down.live
    assert all(n in str(err) for n in down.dead) and what in str(err)
    got = err.partial
    if what == "counts":
        rc = connect(down.url)
        each = [Queue(rc, n).counts() for n in down.live]  # each live partition alone
        rc.close()
        n = len(down.live)
        assert (got.due, got.dead) == (2 * n, n)  # two due jobs, one dead, in each
        assert got.scheduled == sum(c.scheduled for c in each) >= n  # (its schedule's too)
    elif what == "list_jobs":
        assert {j.id for j in got} == set().union(*(down.due[p] for p in down.live))
    elif what == "dead_ids":
        assert sorted(got) == sorted(down.dead_ids[p] for p in down.live)
    elif what == "dead_scored":
        assert [[i for _, i in g] for g in got] == [
            [down.dead_ids[n]] if n in down.live else [] for n in down.parts
        ]
    else:
        assert [s.name for s in got] == sorted(down.schedules[p] for p in down.live)


@pytest.mark.parametrize("asyncio_client", [False, True], ids=["sync", "asyncio"])
def test_a_page_of_the_answering_partitions_is_cut_as_asked(
    down: Down, asyncio_client: bool
) -> None:
    """offset / limit page what the answering partitions hold, as one queue's."""
    whole = _raised(down, lambda q: q.list_jobs("due", limit=100), asyncio_client).partial
    page = _raised(down, lambda q: q.list_jobs("due", offset=1, limit=2), asyncio_client)
    assert [j.id for j in page.partial] == [j.id for j in whole][1:3]
    dead = _raised(down, lambda q: q.dead_ids(limit=1), asyncio_client).partial
    assert len(dead) == 1 and dead[0] in {down.dead_ids[p] for p in down.live}


@pytest.mark.parametrize("asyncio_client", [False, True], ids=["sync", "asyncio"])
def test_a_bulk_enqueue_says_which_jobs_are_written_and_which_are_unknown(
    down: Down, asyncio_client: bool
) -> None:
    """enqueue_many over partitions on the dead node and the live ones: one driver call over
    every node raised the dead node's ConnectionError whole, saying nothing of how far it got
    (the nodes sent to before it were written, those after it not sent). Now each node is one
    call: the live partitions' jobs are written and listed in `written_ids`, the dead node's
    in `unknown_ids` (written or not: a connection lost midway cannot tell)."""
    rc = connect(down.url)
    keep, dead = down.ports
    name = next(
        n
        for n in (f"bw{'a' if asyncio_client else 's'}{i}" for i in range(500))
        if _port(rc, meta_key(n)) == keep
    )
    pq = PartitionedQueue.create(rc, name, partitions=6)
    on_dead = {p.name for p in pq.parts if _port(rc, p.keys.prefix) == dead}
    assert on_dead and len(on_dead) < 6
    specs = [JobSpec("t", None) for _ in range(12)]  # round robin: 2 a partition

    async def enqueue_async() -> None:
        aq = await AsyncPartitionedQueue.open(connect_async(down.url), name)
        try:
            await aq.enqueue_many(specs)
        finally:
            await aq.aclose()

    with pytest.raises(redis.ConnectionError) as err:
        asyncio.run(enqueue_async()) if asyncio_client else pq.enqueue_many(specs)
    written = getattr(err.value, "written_ids", None)
    unknown = getattr(err.value, "unknown_ids", None)
    assert written is not None and unknown is not None, err.value
    part = {i: pq.parts[pq.layout.partition_of_id(i)].name for i in written + unknown}
    assert len(written) + len(unknown) == 12
    assert {part[i] for i in unknown} == on_dead
    assert all(part[i] not in on_dead for i in written)
    assert [pq.status(i) for i in written] == ["due"] * len(written)
    pq.close()


def _port(rc: Any, key: str) -> int:
    return int(rc.get_node_from_key(key).port)
