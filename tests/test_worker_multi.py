"""A worker on several queues: a wake-up on any of them reaches it (it blocks on each queue's
key separately, since on a cluster the keys of two queues live in different slots), and
--worker-id names it."""

from __future__ import annotations

import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.keys import QueueKeys
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


def test_unsafe_worker_id_is_refused(redis_url: str) -> None:
    res = CliRunner().invoke(main, ["worker", "tests.workers.basic:registry", "--url", redis_url,
                                    "--worker-id", "a}{b"])  # fmt: skip
    assert res.exit_code == 2 and "invalid" in res.output
