"""A worker on several queues: a wake-up on any of them reaches it (one blocking pop on every
queue's key on one server; one per queue on a cluster, whose keys of two queues live in
different slots), and --worker-id names it."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.keys import QueueKeys
from tests.redis_server import is_cluster_run
from tests.workers.procs import spawn_worker, stop_all, wait_for


def test_two_queues_each_wake_the_worker(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    a, b = Queue(client, queue_name + "-a"), Queue(client, queue_name + "-b")
    w = spawn_worker(redis_url, a.name, "--queue", b.name, "--worker-id", "multi-1")
    try:
        wait_for(lambda: client.zscore(QueueKeys(b.name).workers, "multi-1") is not None,
                 what="the worker's registration")  # fmt: skip
        # Enqueued while the worker is idle: only a wake-up on that queue's key gets it going
        # before its 30 s safety re-claim.
        ja = a.enqueue("echo", {"q": "a"})
        wait_for(lambda: a.status(ja) == "done", timeout_s=10, what="job on queue a")
        jb = b.enqueue("echo", {"q": "b"})
        wait_for(lambda: b.status(jb) == "done", timeout_s=10, what="job on queue b")
        assert client.hget(QueueKeys(a.name).worker("multi-1"), "queues") == f"{a.name},{b.name}"
    finally:
        stop_all([w])
    for q in (a, b):
        for key in client.scan_iter(match=q.keys.pattern()):
            client.delete(key)


@pytest.mark.skipif(is_cluster_run(), reason="one server: a cluster blocks per queue (per node)")
def test_many_queues_do_not_take_every_pooled_connection_while_idle(
    redis_url: str, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    """A blocking pop per queue held a pooled connection each while idle: with more queues
    than the pool has connections (redis-py 8: 100 by default; here 6: the pop, a claim, a
    heartbeat, a report and the presence beat may each hold one), claims and heartbeats
    got MaxConnectionsError."""
    queues = [Queue(client, f"{queue_name}-{i}") for i in range(12)]
    sep = "&" if "?" in redis_url else "?"
    log = tmp_path / "worker.log"
    extra = [a for q in queues[1:] for a in ("--queue", q.name)]
    w = spawn_worker(redis_url + f"{sep}max_connections=6", queues[0].name, *extra,
                     "--worker-id", "multi-many", log=str(log))  # fmt: skip
    try:
        wait_for(lambda: client.zscore(QueueKeys(queues[0].name).workers, "multi-many")
                 is not None, what="the worker's registration")  # fmt: skip
        # Idle: its wake-up pop is blocking (the server counts it), not a sleep of a guess.
        wait_for(lambda: int(client.info("clients")["blocked_clients"]) >= 1,
                 what="the worker's blocking wake-up pop")  # fmt: skip
        jobs = [(q, q.enqueue("echo", {"i": i})) for i, q in enumerate(queues[::3])]
        for q, job_id in jobs:

            def done(q: Queue = q, j: str = job_id) -> bool:
                return q.status(j) == "done"

            wait_for(done, timeout_s=15, what="a job")
    finally:
        stop_all([w])
    assert "MaxConnectionsError" not in log.read_text()
    for q in queues:
        for key in client.scan_iter(match=q.keys.pattern()):
            client.delete(key)


def test_unsafe_worker_id_is_refused(redis_url: str) -> None:
    res = CliRunner().invoke(main, ["worker", "tests.workers.basic:registry", "--url", redis_url,
                                    "--worker-id", "é" * 101])  # fmt: skip
    assert res.exit_code == 2 and "invalid" in res.output  # 202 bytes: over claim's 200
