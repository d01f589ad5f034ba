"""A cluster node down for good (its primary and replica killed, `cluster-require-full-coverage
no`, so the other slots stay served): a worker of queues on the other nodes still starts and
runs their jobs. Its start used to load the scripts on every primary, so it exited 3 until the
dead node came back. Own cluster (the kill would break a shared one), ~8 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import Queue
from scheduler._spawn_cluster import LocalCluster
from scheduler.core.keys import QueueKeys
from scheduler.core.scripts import Scripts
from tests.redis_server import require_server
from tests.workers.procs import spawn_worker, stop_all, wait_for

pytestmark = pytest.mark.slow


def _queues_on_two_primaries(cluster: LocalCluster) -> tuple[str, str]:
    by_port: dict[int, str] = {}
    for i in range(200):
        name = f"nd{i}"
        by_port.setdefault(cluster.primary_for(QueueKeys(name).prefix).port, name)
        if len(by_port) == 2:
            break
    good, gone = by_port.values()
    return good, gone


def test_a_worker_starts_and_runs_while_another_queues_node_is_down(tmp_path: Path) -> None:
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=1000) as cluster:
        for node in cluster.nodes:
            with cluster.node_client(node) as c:
                c.config_set("cluster-require-full-coverage", "no")
        good, gone = _queues_on_two_primaries(cluster)
        dead = cluster.primary_for(QueueKeys(gone).prefix)
        live = cluster.primary_for(QueueKeys(good).prefix)
        # LocalCluster makes node i + primaries the replica of primary i: no failover.
        cluster.nodes[cluster.nodes.index(dead) + cluster.primaries].kill()
        dead.kill()
        q = Queue.from_url(cluster.url, good)
        job_id = q.enqueue("noop", None)
        log = tmp_path / "worker.log"
        worker = spawn_worker(cluster.url, good, log=str(log))
        try:
            wait_for(lambda: q.status(job_id) == "done" or worker.poll() is not None,
                     timeout_s=60, what="the job done or the worker gone")  # fmt: skip
            assert worker.poll() is None, log.read_text()[-2000:]
            assert q.status(job_id) == "done"
            # The scripts were loaded where the queue lives, and the settings read there only
            # (a warning naming the dead node would say its durability is unchecked).
            with cluster.node_client(live) as c:
                scripts = Scripts()
                assert all(c.script_exists(*(scripts.sha[name] for name, _ in
                                              scripts.preload_commands())))  # fmt: skip
            assert f":{dead.port}" not in log.read_text()
        finally:
            stop_all([worker])
