"""Review of `worker --processes N` (scheduler/cli/worker_pool.py) and the direct pipeline
(scheduler/core/direct_io.py pipeline_sync / pipeline_async): each test shows one defect and
fails until it is fixed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.exceptions import DataError

from scheduler import Queue
from scheduler.core import direct_io
from tests.fixtures.pools import kill_leftovers
from tests.redis_server import is_cluster_run
from tests.test_worker_pool import alive, children
from tests.workers.procs import ROOT, wait_for

plain_only = pytest.mark.skipif(is_cluster_run(), reason="plain clients only (cluster: cluster_io)")

# Busy for ~300 ms on the server: its reply cannot have arrived when the connection is next
# handed out, so redis-py's "connection has data" check at get_connection() cannot save it.
SLOW_SCRIPT = (
    "local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2]; "
    "while true do local n = redis.call('TIME'); "
    "if n[1] * 1000000 + n[2] - s > 300000 then break end end; return 'slow-reply'"
)
ECHO_SCRIPT = "return ARGV[1]"


# -- direct_io.pipeline_sync / pipeline_async -----------------------------------------------


@plain_only
def test_pipeline_sync_pack_failure_leaves_the_pooled_connection_out_of_step(
    plain: redis.Redis,
) -> None:
    """Defect: pipeline_sync packs and sends each command in turn (direct_io.py send()), so
    an argument hiredis cannot pack in command 2 raises after command 1 was sent; the
    connection goes back to the pool with command 1's reply still to come (no disconnect).
    Every later command on that client then reads the previous command's reply. redis-py's
    pipeline packs everything before sending anything, so nothing is left on the wire."""
    key = "review-" + uuid.uuid4().hex[:12]
    plain.set(key, "before")
    slow = plain.script_load(SLOW_SCRIPT)
    echo = plain.script_load(ECHO_SCRIPT)
    with pytest.raises(Exception):  # noqa: B017 - the type is another test's subject
        direct_io.pipeline_sync(plain, [("EVALSHA", slow, 0), ("EVALSHA", echo, 0, None)])
    try:
        got = plain.get(key)
        assert got == b"before", f"GET read a stale reply: {got!r}"
    finally:
        plain.connection_pool.disconnect()
        plain.delete(key)


@plain_only
def test_pipeline_async_pack_failure_leaves_the_pooled_connection_out_of_step(
    redis_url: str,
) -> None:
    """Defect: the asyncio twin (pipeline_async) sends command 1, fails packing command 2 and
    releases the connection with command 1's reply pending: the next command on the client
    reads that stale reply (redis.asyncio's pipeline sends nothing when packing fails)."""

    async def main() -> Any:
        c = aredis.Redis.from_url(redis_url)
        key = "review-" + uuid.uuid4().hex[:12]
        try:
            await c.set(key, "before")
            slow = await c.script_load(SLOW_SCRIPT)
            echo = await c.script_load(ECHO_SCRIPT)
            with pytest.raises(Exception):  # noqa: B017
                await direct_io.pipeline_async(
                    c, [("EVALSHA", slow, 0), ("EVALSHA", echo, 0, None)]
                )
            return await c.get(key)
        finally:
            await c.connection_pool.disconnect()
            await c.delete(key)
            await c.aclose()

    got = asyncio.run(main())
    assert got == b"before", f"GET read a stale reply: {got!r}"


@plain_only
def test_pipeline_sync_unpackable_argument_raises_data_error_as_redis_py(
    plain: redis.Redis,
) -> None:
    """Defect: with an argument redis-py cannot encode (None), redis-py's pipeline raises
    redis.exceptions.DataError (a RedisError); pipeline_sync lets hiredis' bare TypeError
    through (direct_io._pack), so callers catching RedisError miss it."""
    echo = plain.script_load(ECHO_SCRIPT)
    cmds: list[tuple[Any, ...]] = [("EVALSHA", echo, 0, "a"), ("EVALSHA", echo, 0, None)]
    with plain.pipeline(transaction=False) as pipe:
        for cmd in cmds:
            pipe.execute_command(*cmd)  # type: ignore[no-untyped-call]
        with pytest.raises(DataError):
            pipe.execute(raise_on_error=False)
    try:
        with pytest.raises(DataError):
            direct_io.pipeline_sync(plain, cmds)
    finally:
        plain.connection_pool.disconnect()


# -- worker --processes N: the supervisor ----------------------------------------------------

# The supervisor of scheduler/cli/worker_pool.py with the children given as JSON argv lists
# (what run_pool builds), each with the supervisor's environment.
SUPERVISOR = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from scheduler.cli.worker_pool import Pool
argv = json.loads(sys.argv[1])
sys.exit(Pool(len(argv), argv, [dict(os.environ) for _ in argv]).run())
"""

# A child that fails before it is ready (exit 3, as for an unreachable Redis), once told to.
FAIL_WHEN_TOLD = """
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
"""


def _started_pids(log: Path) -> list[int]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [
        int(line.split("started (pid ")[1].split(")")[0])
        for line in text.splitlines()
        if "started (pid " in line
    ]


def _kill_all(sup: subprocess.Popen[bytes], log: Path) -> None:
    if sup.poll() is None:
        sup.kill()
    sup.wait(10)
    kill_leftovers(log, {sup.pid})
    deadline = time.monotonic() + 10
    while any(alive(p) for p in _started_pids(log)) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_one_signal_after_a_failed_first_start_is_not_a_second_signal(
    redis_url: str, client: redis.Redis, q: Queue, tmp_path: Path
) -> None:
    """Defect: when a child of the first start fails, Pool._supervise stops the others by
    counting a signal of its own (`self._signals += 1`, worker_pool.py _supervise), so the
    operator's first SIGTERM/SIGINT during that stop is forwarded as a second SIGTERM: a
    worker still in its grace period exits at once (130, "second signal"), abandoning its
    running job, although only one signal was sent. Shown with a real worker (child 1, busy
    with a job, grace 60 s) and a child 2 that fails before ready."""
    log, flag = tmp_path / "pool.log", tmp_path / "fail-now"
    worker = [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
              "--queue", q.name, "--grace", "60", "--worker-id", "review-pool-1"]  # fmt: skip
    failing = [sys.executable, "-c", FAIL_WHEN_TOLD, str(flag)]
    env = dict(os.environ, REDIS_URL=redis_url, TEST_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    with open(log, "ab") as out:
        sup = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, json.dumps([worker, failing])],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def text() -> str:
        return log.read_text(errors="replace")

    try:
        wait_for(lambda: "review-pool-1 started" in text(), timeout_s=30, what="worker up")
        job = q.enqueue("sleep", {"s": 20})
        wait_for(lambda: q.status(job) == "leased", timeout_s=15, what="the job running")
        flag.touch()  # child 2 fails before ready: the pool stops child 1 (its grace begins)
        wait_for(lambda: "stopping (grace" in text(), timeout_s=15, what="the pool's own stop")
        assert sup.poll() is None
        sup.send_signal(signal.SIGTERM)  # the operator's first and only signal
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and "second signal" not in text():
            time.sleep(0.05)
        assert "second signal" not in text(), text()[-2000:]
        assert q.status(job) == "leased"  # still in its grace period
        assert len(children(sup.pid)) == 1  # child 1 not killed (a second stop now kills)
    finally:
        _kill_all(sup, log)
