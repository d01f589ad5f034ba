"""Review of growth in long-running processes: a worker runs for weeks, a web app's AsyncQueue
lives as long as the app, a pool supervisor reloads and restarts its children for months. The
state each keeps in Python (or on disk for its own bookkeeping) must stay bounded whatever the
number of jobs, ids, error texts, task names, event loops or reloads it has seen.

Each test drives the real code many times, then checks the size of what is left."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis

from scheduler import AsyncQueue, JobSpec, Queue, Registry
from scheduler.core import loop_guard
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.metrics import UNKNOWN_TASK
from tests.embedded_worker import run_until
from tests.fixtures.pools import kill_leftovers
from tests.test_worker_pool import alive
from tests.workers.procs import ROOT, wait_for

# -- the pool supervisor: a reload's replaced children ---------------------------------------

# worker_pool.py's supervisor over the children given as JSON argv lists, serving the pool's
# metrics (PoolMetrics: the hand-over files live in its temporary directory, under TMPDIR).
SUPERVISOR = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from scheduler.cli.worker_pool import Pool
from scheduler.cli.worker_pool_metrics import PoolMetrics
argv = json.loads(sys.argv[1])
metrics = PoolMetrics(0)
try:
    code = Pool(len(argv), argv, [dict(os.environ) for _ in argv], metrics).run()
finally:
    metrics.close()
sys.exit(code)
"""

# A stand-in pool child (no import of ours: a start costs tens of ms, not a second): says
# `ready` at once and leaves `ready-<pid>` in the directory argv[1]; the supervisor's stop
# (SIGUSR1) ends it as a real child's stop does: its worker returns, its last counts go to the
# file the supervisor named, as worker_pool_child.hand_over_metrics writes it (whole: a .tmp,
# then a rename), and it exits 0. It gives up after 120 s.
CHILD = """
import os, signal, sys, time
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
fd = int(os.environ["SCHEDULER_WORKER_READY_FD"])
os.write(fd, b"ready\\n")
os.close(fd)
open(os.path.join(sys.argv[1], "ready-%d" % os.getpid()), "w").close()
deadline = time.monotonic() + 120
while not stop and time.monotonic() < deadline:
    time.sleep(0.02)
path = os.environ.pop("SCHEDULER_WORKER_FINAL_METRICS", None)
if path is not None:
    with open(path + ".tmp", "w") as f:
        f.write("# HELP scheduler_jobs_total Job outcomes.\\n# TYPE scheduler_jobs_total counter\\n"
                'scheduler_jobs_total{queue="q",task="t",outcome="done"} 7.0\\n')
    os.replace(path + ".tmp", path)
sys.exit(0 if stop else 1)
"""


def _started(log: Path) -> list[tuple[int, int]]:
    """(slot from 0, pid) of every child the supervisor started, in order."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = re.findall(r"worker process (\d+) started \(pid (\d+)\)", text)
    return [(int(n) - 1, int(pid)) for n, pid in found]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_pool_reload_leaves_no_hand_over_files_behind(tmp_path: Path) -> None:
    """`scheduler worker --processes 2 --metrics-port P`, reloaded 3 times (a deploy each):
    every replaced child stops gracefully and, as a child that returns from its worker does,
    writes its last counts to the hand-over file the supervisor named. A restarted child's file
    is read and deleted (PoolMetrics.reaped); a reload's replaced one is documented to reset
    its slot, but its file stays in the supervisor's temporary directory until the pool exits:
    2 more files per reload, for as long as the pool runs (months of daily deploys: thousands,
    on a /tmp that is often RAM)."""
    tmp, flags, log, n = tmp_path / "tmp", tmp_path / "flags", tmp_path / "pool.log", 2
    tmp.mkdir()
    flags.mkdir()
    argv = [[sys.executable, "-c", CHILD, str(flags)] for _ in range(n)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp))
    with open(log, "ab") as out:
        sup = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, json.dumps(argv)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def handoffs() -> list[str]:
        return sorted(str(p.relative_to(tmp)) for p in tmp.glob("scheduler-pool-metrics-*/*"))

    def all_ready(k: int) -> bool:  # generation k's children have said `ready`
        started = _started(log)
        return len(started) == n * (k + 1) and all(
            (flags / f"ready-{pid}").exists() for _, pid in started[-n:]
        )

    def all_gone(pids: list[int]) -> bool:
        return not any(alive(p) for p in pids)

    try:
        wait_for(lambda: all_ready(0), what="the first children ready")
        for k in range(1, 4):
            sup.send_signal(signal.SIGHUP)
            wait_for(functools.partial(all_ready, k), what=f"reload {k}")
            newest = {slot: pid for slot, pid in _started(log)}
            replaced = [pid for _, pid in _started(log) if pid not in newest.values()]
            wait_for(functools.partial(all_gone, replaced), what=f"reload {k} done")
        # The supervisor notices a replaced child's end within a loop turn (0.2 s).
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not handoffs(), timeout_s=3.0, what="no hand-over file left")
        left = handoffs()
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0, log.read_text(errors="replace")[-2000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait(10)
        kill_leftovers(log, {sup.pid})
    assert left == [], f"{len(left)} hand-over files of replaced children left: {left}"


# -- the worker: many jobs, ids, error texts and task names -----------------------------------


def test_a_worker_keeps_nothing_per_job_id_error_text_or_task_name(
    redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    """1,000 jobs of distinct ids (a quarter done, the rest failing with a distinct error text,
    sync and async), 250 jobs of distinct task names nobody registered (a hand-edited or
    misspelled task): once all are settled, the worker holds no per-job entry, its log limiter
    one window per kind of line, and its metrics one series per (task, outcome) of registered
    tasks plus `(unknown)`, not one per name, id or error."""
    reg = Registry()

    @reg.task(name="ok")
    async def ok(payload: int, ctx: object) -> int:
        return payload

    @reg.task(name="boom")
    async def boom(payload: int, ctx: object) -> None:
        raise ValueError(f"distinct error text {payload}")

    @reg.task(name="sync_boom")
    def sync_boom(payload: int, ctx: object) -> None:
        raise RuntimeError(f"distinct sync error text {payload}")

    q = Queue(client, queue_name)
    tasks = ("ok", "boom", "sync_boom", "boom")
    specs = [JobSpec(tasks[i % 4], i, max_attempts=1, job_id=f"id-{i}") for i in range(1000)]
    specs += [JobSpec(f"unregistered_{i}", i, max_attempts=1) for i in range(250)]
    q.enqueue_many(specs)
    seen: list[Worker] = []

    def settled() -> bool:
        c = q.counts()
        w = seen[0]
        return c.due + c.scheduled + c.leased == 0 and not (w._held or w._completes or w._fails)

    settings = WorkerSettings(queues=(queue_name,), heartbeat_ms=200, lease_ms=2_000)
    assert run_until(redis_url, reg, settings, settled, timeout_s=30, setup=seen.append)
    w = seen[0]
    assert q.counts().dead == 1000  # 750 failed, 250 unknown tasks
    per_job = {"running": w.running, "held": w._held, "abandoned": w._abandoned,
               "behind": w._behind, "suspects": w._suspects, "backlog": w._backlog,
               "give_back": w._give_back}  # fmt: skip
    assert {k: len(v) for k, v in per_job.items() if v} == {}
    assert len(w._log_limit._windows) <= 5
    assert len(w.queues[0]._ops_by_ttl) <= 1
    samples = [s for m in w.metrics.registry.collect() for s in m.samples]
    labels = {(s.labels["task"], s.labels.get("outcome")) for s in samples if "task" in s.labels}
    assert {t for t, _ in labels} == {"ok", "boom", "sync_boom", UNKNOWN_TASK}, labels
    assert len(w.metrics._tasks) == 4 and len(w.metrics._outcomes) <= 4


# -- an app's AsyncQueue over many event loops -------------------------------------------------


def test_an_async_queue_used_from_many_event_loops_keeps_one_loops_state(redis_url: str) -> None:
    """A script or a sync web app calls asyncio.run() per unit of work on one long-lived
    AsyncQueue: each run's loop, tasks and pooled connections must not pile up on the queue,
    its client or the module-level guards (a bound per loop would grow for the app's life)."""
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    aq = AsyncQueue(client, f"loops-{os.getpid()}-{id(client)}")

    async def unit(i: int) -> None:
        await aq.enqueue("t", i)
        await asyncio.gather(*(aq.enqueue("t", [i, j], job_id=f"u{i}-{j}") for j in range(6)))
        await aq.counts()

    def loops_alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop))

    try:
        asyncio.run(unit(-1))
        before = loops_alive()
        for i in range(40):
            asyncio.run(unit(i))
        assert loops_alive() - before <= 1  # the last run's, held until the next call
        pool = client.connection_pool
        conns = len(pool._available_connections) + len(pool._in_use_connections)
        b = aq._batcher
        assert (len(b._flying), len(b._waiting), len(b._tasks), b._in_flight) == (0, 0, 0, 0)
        assert conns <= 8, conns
        assert sum(1 for e in loop_guard._BOUND.values() if e[0]() is client) == 1
    finally:

        async def close() -> None:
            await aq.counts()  # on this loop: the closed loops' connections dropped first
            await client.aclose()

        asyncio.run(close())
        sync = redis.Redis.from_url(redis_url)
        keys = list(sync.scan_iter(match=aq.keys.pattern(), count=1000))
        if keys:
            sync.delete(*keys)
        sync.close()
