"""Rolling deploys: this version's `scheduler workers quiet|stop` (and the dashboard's buttons)
asked of a worker from before operator stops (828eb42), which never reads the request. Before:
'stop requested ... at its next beat it stops' (exit 0), `scheduler workers` showing 'stop
asked' while the worker ran on. Such a worker is known by its beats, which never write the
`stopping` field every later beat writes: nothing is asked, and the answer says to signal it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.admin.worker_stop import OLDER, ask_stop
from scheduler.cli.main import main
from tests.old_tree import old_worktree
from tests.workers.procs import stop_all, wait_for

OLD_REV = "e75411e"  # the supported window's first version (the queue index), before stops


def _old_beat(client: redis.Redis, q: Queue, worker_id: str) -> None:
    """A worker's registry entry as worker_beat.lua wrote it before 828eb42 (no `stopping`)."""
    sec, _ = client.time()
    client.zadd(q.keys.workers, {worker_id: int(sec) * 1000})
    client.hset(q.keys.worker(worker_id), mapping={
        "host": "old-host", "pid": "4242", "queues": q.name, "started_ms": str(int(sec) * 1000),
        "last_heartbeat_ms": str(int(sec) * 1000), "in_flight": "0", "concurrency": "16",
    })  # fmt: skip


@pytest.mark.parametrize("verb", ["quiet", "stop"])
def test_a_worker_that_cannot_read_a_stop_is_not_asked(
    client: redis.Redis, redis_url: str, q: Queue, verb: str
) -> None:
    _old_beat(client, q, "old-1")
    assert ask_stop(client, [q.keys], "old-1", verb) == OLDER
    assert client.exists(q.keys.worker_stop("old-1")) == 0
    got = CliRunner().invoke(main, ["workers", verb, "old-1", "--url", redis_url, "-q", q.name])
    assert got.exit_code == 1, got.output
    assert "requested" not in got.output
    assert "older version" in got.output and "SIGTERM" in got.output, got.output
    assert client.exists(q.keys.worker_stop("old-1")) == 0  # nothing written
    # A worker of this version beside it is still asked by --all.
    client.hset(q.keys.worker("new-1"), mapping={"host": "h", "pid": "1", "stopping": ""})
    client.zadd(q.keys.workers, {"new-1": int(client.time()[0]) * 1000})
    got = CliRunner().invoke(main, ["workers", verb, "--all", "-y", "--url", redis_url, "-q",
                                    q.name])  # fmt: skip
    assert got.exit_code == 1, got.output
    assert client.get(q.keys.worker_stop("new-1")) == verb
    assert client.exists(q.keys.worker_stop("old-1")) == 0


@pytest.fixture(scope="module")
def old_tree() -> Iterator[Path]:
    with old_worktree(OLD_REV, "rolling-stop-") as where:
        yield where


def test_a_real_older_worker_is_named_not_asked(
    old_tree: Path, client: redis.Redis, redis_url: str, q: Queue, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=str(old_tree), TEST_REDIS_URL=redis_url)
    start = "from scheduler.cli.main import main; main()"
    with open(tmp_path / "old.log", "ab") as out:
        w = subprocess.Popen(
            [sys.executable, "-c", start, "worker", "tests.workers.basic:registry", "--url",
             redis_url, "--queue", q.name],
            cwd=old_tree, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: client.zcard(q.keys.workers) == 1, 60, "the old worker's beat")
        (wid,) = [str(w) for w in client.zrange(q.keys.workers, 0, -1)]
        # Named with -q: on the suite's shared server the queue index lists other tests'
        # queues, and this queue reaches it only through a newer client's write (none here),
        # so the discovery would not look here (CI: "no live worker ... on any queue").
        got = CliRunner().invoke(main, ["workers", "stop", wid, "-q", q.name, "--url", redis_url])
        assert got.exit_code == 1 and "older version" in got.output, got.output
        assert client.exists(q.keys.worker_stop(wid)) == 0
        assert w.poll() is None
    finally:
        stop_all([w])
