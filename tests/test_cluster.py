"""Redis Cluster: the URL forms, and what a single-node client got wrong on a cluster
(pipelined scripts, WAIT on the wrong node, one-node SCAN, MOVED after a slot moved, NOSCRIPT
per node). Runs on the cluster run's own cluster (SCHEDULER_TEST_SERVER=cluster), else on one
started for this module (~8 s)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, BadArgument, JobSpec, Queue
from scheduler.admin.inspection import discover_queues
from scheduler.cli.main import main
from scheduler.core.connection import connect, connect_async, is_cluster, parse_url
from tests.workers.procs import spawn_worker, stop_all, wait_for


# -- the URL forms (no server) ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "seeds", "plain"),
    [
        ("redis+cluster://a:7000,b:7001/", (("a", 7000), ("b", 7001)), "redis://a:7000/0"),
        ("rediss+cluster://u:pw@a:7000/", (("a", 7000),), "rediss://u:pw@a:7000/0"),
        ("redis://a:7000/0?cluster=1", (("a", 7000),), "redis://a:7000/0"),
        ("redis://a:7000/?cluster=yes&socket_timeout=3", (("a", 7000),),
         "redis://a:7000/0?socket_timeout=3"),
        ("redis://a:7000/2", (), "redis://a:7000/2"),
        ("redis://a:7000/0?cluster=0", (), "redis://a:7000/0"),
        ("unix:///tmp/r.sock", (), "unix:///tmp/r.sock"),
    ],
)  # fmt: skip
def test_url_forms(url: str, seeds: tuple[tuple[str, int], ...], plain: str) -> None:
    target = parse_url(url)
    assert (target.seeds, target.url, target.cluster) == (seeds, plain, bool(seeds))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("unix:///tmp/r.sock?cluster=1", "needs TCP"),
        ("redis+cluster://a:7000/1", "only database 0"),
        ("redis+cluster://a:notaport/", "bad node"),
        ("redis+cluster:///", "no host"),
        ("redis://a:7000/?cluster=maybe", "expected 1 or 0"),
        ("memcached://a:1", "unknown scheme"),
        ("a:7000", "scheme"),
    ],
)
def test_bad_urls_are_refused_with_the_password_hidden(url: str, why: str) -> None:
    with pytest.raises(BadArgument, match=why):
        parse_url(url)
    with pytest.raises(BadArgument) as info:
        parse_url(url.replace("://", "://user:s3cret@", 1))
    assert "s3cret" not in str(info.value)


def test_cli_refuses_a_bad_cluster_url_as_usage() -> None:
    res = CliRunner().invoke(main, ["stats", "--url", "redis+cluster://a:7000/3"])
    assert res.exit_code == 2 and "only database 0" in res.output
    res = CliRunner().invoke(main, ["worker", "tests.workers.basic:registry", "--url",
                                    "unix:///x.sock?cluster=1"])  # fmt: skip
    assert res.exit_code == 2 and "needs TCP" in res.output


# -- on a cluster ----------------------------------------------------------------------------
def _queues_on_every_primary(rc: Any, prefix: str) -> list[str]:
    """One queue name per primary (the slot of `sched:{name}:` decides where it lives)."""
    by_node: dict[str, str] = {}
    for i in range(200):
        name = f"{prefix}-{i}"
        node = rc.get_node_from_key(f"sched:{{{name}}}:")
        by_node.setdefault(node.name, name)
    assert len(by_node) == len(rc.get_primaries()) == 3
    return sorted(by_node.values())


def _drop(rc: Any, names: list[str]) -> None:
    for name in names:
        keys = list(rc.scan_iter(match=f"sched:{{{name}}}:*"))
        if keys:
            rc.delete(*keys)


def test_batches_and_wait_replicas_on_every_primary(rc: Any, queue_name: str) -> None:
    """Several enqueue batches are one pipeline of scripts, and WAIT counts the replica of the
    node that took them: refused by redis-py's ClusterPipeline, or NotDurable from the wrong
    node, before."""
    names = _queues_on_every_primary(rc, queue_name)
    try:
        for name in names:
            q = Queue(rc, name, wait_replicas=1, wait_timeout_ms=2_000)
            ids = q.enqueue_many([JobSpec("t", {"n": i}) for i in range(7)], batch_size=3)
            assert len(set(ids)) == 7 and q.counts().due == 7
            batch = q.claim("w", limit=7)
            assert sorted(j.id for j in batch.jobs) == sorted(ids)
            q.complete_many([(j.id, j.token, None) for j in batch.jobs])
            assert q.counts().due == 0 and {q.status(i) for i in ids} == {"done"}
        assert set(names) <= set(discover_queues(rc))
    finally:
        _drop(rc, names)


def test_async_client_on_every_primary(cluster_url: str, queue_name: str) -> None:
    names = [f"{queue_name}-a{i}" for i in range(6)]

    async def main() -> list[int]:
        client = connect_async(cluster_url)
        try:
            out = []
            for name in names:
                aq = AsyncQueue(client, name, wait_replicas=1, wait_timeout_ms=2_000)
                await aq.enqueue_many([JobSpec("t", None) for _ in range(5)], batch_size=2)
                out.append((await aq.counts()).due)
            return out
        finally:
            await client.aclose()

    try:
        assert asyncio.run(main()) == [5] * 6
    finally:
        with connect(cluster_url) as sync:
            _drop(sync, names)


def test_cli_stats_and_workers_cover_every_primary(
    rc: Any, cluster_url: str, queue_name: str
) -> None:
    names = _queues_on_every_primary(rc, queue_name)
    try:
        for n, name in enumerate(names):
            Queue(rc, name).enqueue_many([JobSpec("t", None) for _ in range(n + 1)])
        res = CliRunner().invoke(main, ["stats", "--url", cluster_url, "--json"])
        assert res.exit_code == 0, res.output
        rows = {r["queue"]: r for r in json.loads(res.output)["queues"]}
        assert [rows[name]["due"] for name in names] == [1, 2, 3]
        res = CliRunner().invoke(main, ["workers", "--url", cluster_url, "--json"])
        assert res.exit_code == 0, res.output
    finally:
        _drop(rc, names)


def test_cli_jobs_show_reads_under_watch_on_every_primary(
    rc: Any, cluster_url: str, queue_name: str
) -> None:
    """`jobs show` WATCHes the job's keys on the node that owns them (a WATCH sent to another
    node would answer MOVED, or watch nothing): a due and a leased job on each primary."""
    names = _queues_on_every_primary(rc, queue_name)
    try:
        for name in names:
            q = Queue(rc, name)
            waiting, held = q.enqueue("t", job_id="a-due", delay_ms=60_000), q.enqueue("t")
            (job,) = q.claim("w1", limit=1, lease_ms=60_000).jobs
            assert job.id == held
            for jid, state, place in ((waiting, "scheduled", "due"), (held, "leased", "leased")):
                res = CliRunner().invoke(
                    main, ["jobs", "show", jid, "--url", cluster_url, "--queue", name, "--json"]
                )
                assert res.exit_code == 0, res.output
                shown = json.loads(res.output)
                assert (shown["id"], shown["state"], shown["places"]) == (jid, state, [place])
                assert shown["queue"] == name, shown
    finally:
        _drop(rc, names)


def test_a_moved_slot_is_followed_by_an_old_client(cluster_url: str, queue_name: str) -> None:
    """Move the queue's slot to another primary behind the client's back: its next script
    call answers MOVED, the driver re-reads the topology and sends it again."""
    client: Any = connect(cluster_url)
    assert is_cluster(client)
    q = Queue(client, queue_name)
    first = q.enqueue("t", {"n": 1})
    source = client.get_node_from_key(q.keys.prefix)
    target = next(n for n in client.get_primaries() if n.name != source.name)
    _move_slot(client, q.keys.prefix, source, target)
    try:
        ids = q.enqueue_many([JobSpec("t", {"n": i}) for i in range(4)], batch_size=2)
        assert q.counts().due == 5 and q.status(first) == "due"
        assert client.get_node_from_key(q.keys.prefix).name == target.name
        assert len(ids) == 4
    finally:
        _drop(client, [queue_name])
        client.close()


def _move_slot(client: Any, key: str, source: object, target: object) -> None:
    src = client.get_redis_connection(source)
    dst = client.get_redis_connection(target)
    slot = client.keyslot(key)
    src_id, dst_id = _cmd(src, "CLUSTER", "MYID"), _cmd(dst, "CLUSTER", "MYID")
    _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    host, port = (
        dst.connection_pool.connection_kwargs["host"],
        dst.connection_pool.connection_kwargs["port"],
    )
    while keys := _cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, 100):
        _cmd(src, "MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)
    for node in (dst, src):
        _cmd(node, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def _cmd(client: redis.Redis, *args: object) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def test_noscript_is_reloaded_on_the_node_that_lost_its_scripts(rc: Any, queue_name: str) -> None:
    q = Queue(rc, queue_name, wait_replicas=1)
    q.enqueue("t", None)
    for node in rc.get_primaries():
        _cmd(rc.get_redis_connection(node), "SCRIPT", "FLUSH")
    try:
        q.enqueue_many([JobSpec("t", None) for _ in range(3)], batch_size=1)
        assert q.counts().due == 4
    finally:
        _drop(rc, [queue_name])


def test_a_flush_racing_every_load_is_answered_by_eval_on_each_node(
    rc: Any, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loads made no-ops (as if a flush followed each): the driver's second resend is EVAL with
    the text, per node, and the WAIT after it still follows its writes."""
    q = Queue(rc, queue_name, wait_replicas=1)
    q.enqueue("t", None)
    for node in rc.get_primaries():
        _cmd(rc.get_redis_connection(node), "SCRIPT", "FLUSH")
    monkeypatch.setattr(redis.Redis, "script_load", lambda self, script: "0" * 40)
    try:
        q.enqueue_many([JobSpec("t", None) for _ in range(3)], batch_size=1)
        assert q.counts().due == 4
    finally:
        _drop(rc, [queue_name])


def test_doctor_and_the_startup_checks_read_every_primary(rc: Any, cluster_url: str) -> None:
    """The test cluster runs without persistence: each primary is reported, by name."""
    from scheduler.admin.startup import check_or_warn

    found = [f for f in check_or_warn(rc, strict=False, log=lambda _: None)]
    named = {f.message.split(": ")[0] for f in found if f.code == "persistence-off"}
    assert named == {f"node {n.name}" for n in rc.get_primaries()} and len(named) == 3
    res = CliRunner().invoke(main, ["doctor", "--url", cluster_url, "--json"])
    assert res.exit_code == 1, res.output
    assert res.output.count("persistence-off") == 3


def test_a_partitioned_queue_spreads_over_every_primary(rc: Any, queue_name: str) -> None:
    from scheduler.client.partitioned import PartitionedQueue

    pq = PartitionedQueue.create(rc, queue_name, partitions=3)
    try:
        nodes = {rc.get_node_from_key(p.keys.prefix).name for p in pq.parts}
        assert nodes == {n.name for n in rc.get_primaries()}
        ids = pq.enqueue_many([JobSpec("t", None) for _ in range(9)], batch_size=2)
        assert [p.counts().due for p in pq.parts] == [3, 3, 3]
        assert {pq.status(i) for i in ids} == {"due"}
    finally:
        _drop(rc, [p.name for p in pq.parts])
        rc.delete(f"sched:{{{queue_name}}}:partitions")


# -- docs/cluster.md: each node's pool holds 100 connections, `?max_connections=N` changes it --
def _with_pool(url: str, size: int | None) -> str:
    if size is None:
        return url
    return url + ("&" if "?" in url else "?") + f"max_connections={size}"


@pytest.mark.parametrize(("size", "expected"), [(None, 100), (7, 7)])
def test_max_connections_in_the_url_sizes_every_nodes_pool(
    cluster_url: str, size: int | None, expected: int
) -> None:
    """A URL's `max_connections` reaches the pool of every node (the seeds after the first,
    which connect() builds itself, included), blocking and asyncio; without it a node's pool is
    redis-py 8's 100. The cap is real: the pool refuses one connection more."""
    url = _with_pool(cluster_url, size)
    rc: Any = connect(url)
    try:
        rc.ping()
        nodes = rc.get_nodes()
        assert len([n for n in nodes if n.server_type == "primary"]) == 3
        seen = {n.name: n.redis_connection.connection_pool.max_connections for n in nodes}
        seen.update(
            {f"seed {n.name}": n.redis_connection.connection_pool.max_connections
             for n in rc.nodes_manager.startup_nodes.values() if n.redis_connection}
        )  # fmt: skip
        assert set(seen.values()) == {expected}, seen
        if size is not None:
            pool = rc.get_primaries()[0].redis_connection.connection_pool
            held = [pool.get_connection() for _ in range(size)]
            try:
                with pytest.raises(redis.exceptions.MaxConnectionsError):
                    pool.get_connection()
            finally:
                for conn in held:
                    pool.release(conn)
    finally:
        rc.close()

    async def on_asyncio() -> dict[str, int]:
        arc: Any = connect_async(url)
        try:
            await arc.ping()
            nodes = arc.get_nodes()
            assert len([n for n in nodes if n.server_type == "primary"]) == 3
            found = {n.name: n.max_connections for n in nodes}
            found.update(
                {f"seed {n.name}": n.max_connections
                 for n in arc.nodes_manager.startup_nodes.values()}
            )  # fmt: skip
            if size is not None:
                node = arc.get_primaries()[0]
                held = [node.acquire_connection() for _ in range(size)]
                try:
                    with pytest.raises(redis.exceptions.MaxConnectionsError):
                        node.acquire_connection()
                finally:
                    for conn in held:
                        node.release(conn)
            return found
        finally:
            await arc.aclose()

    found = asyncio.run(on_asyncio())
    assert set(found.values()) == {expected}, found


@pytest.mark.slow
@pytest.mark.parametrize(("size", "starved"), [(4, True), (40, False)])
def test_a_worker_whose_node_pools_are_smaller_than_its_partitions_is_refused_at_start(
    rc: Any, cluster_url: str, queue_name: str, tmp_path: Path, size: int, starved: bool
) -> None:
    """docs/cluster.md: an idle worker holds one wake-up pop per partition on the partition's
    node, and 4 more connections of each node, so a node pool smaller than that is refused at
    start (exit 2 naming `max_connections`: a starved pool failed heartbeats, and healthy jobs
    ran twice or died), nothing claimed; a larger `max_connections` in the URL runs every job,
    every wake-up pop blocked at once, no pool error."""
    from scheduler.client.partitioned import PartitionedQueue

    name = f"{queue_name}-{size}"
    pq = PartitionedQueue.create(rc, name, partitions=15)
    log = tmp_path / "worker.log"
    worker = None
    try:
        per_node = Counter(rc.get_node_from_key(p.keys.prefix).name for p in pq.parts)
        assert max(per_node.values()) > 4  # more wake-up pops than the small pool holds
        ids = pq.enqueue_many([JobSpec("noop", None) for _ in range(30)])
        worker = spawn_worker(_with_pool(cluster_url, size), name, log=str(log))
        if starved:
            assert worker.wait(timeout=60) == 2, log.read_text()[-2_000:]
            assert f"max_connections={size}" in log.read_text()
            assert {pq.status(i) for i in ids} == {"due"}  # refused before any claim
            return

        wait_for(lambda: all(pq.status(i) == "done" for i in ids), what="every job done")

        # The idle state the doc is about: every partition's wake-up pop blocked on its node
        # (only then has each node's pool held all of them at once).
        def blocked() -> int:
            return sum(
                "b" in c.get("flags", "")
                for node in rc.get_primaries()
                for c in rc.client_list(target_nodes=node)
            )

        wait_for(lambda: blocked() >= len(pq.parts), what="every wake-up pop blocked")
        stop_all([worker])
        text = log.read_text()
        assert "MaxConnectionsError" not in text, text[-2_000:]
    finally:
        if worker is not None:
            stop_all([worker])
        _drop(rc, [p.name for p in pq.parts])
        rc.delete(f"sched:{{{name}}}:partitions")
