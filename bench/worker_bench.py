"""Our worker alone, no-op handlers, one worker process, a private redis-server.

    .venv/bin/python bench/worker_bench.py [--drain-n 20000] [--concurrency 16,100] [--rounds 20]

Measures (printed as JSON lines):
- drain: n pending jobs, then `scheduler worker` started; jobs/s from the first job done to
  the last (counted from the queue's per-minute `complete` stats, polled every 2 ms).
- idle_lateness: the worker idle; one job due at an instant ~0.3-0.7 s ahead; lateness = the
  server's claim time (job hash `claimed_ms`) minus run_at, and the handler's own start stamp
  (time.time()) minus run_at; repeated `--rounds` times.
- simultaneous: 2,000 jobs due at the same instant; every handler start stamp minus that
  instant (`early` counts negative ones).
- rss: the worker's RSS (VmRSS) after the runs, at concurrency 16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

from redis_server import private_server  # noqa: E402

from scheduler import JobSpec, Queue  # noqa: E402

REGISTRY = "worker_bench_tasks:registry"
STARTS = "wb:starts"
TASKS = """
import asyncio, os, time
import redis
from scheduler.worker.registry import Registry
registry = Registry()
_r = None
_stamps = []

@registry.task(name="noop")
async def noop(payload, ctx):
    return None

def _flush():
    global _r
    if _r is None:
        _r = redis.Redis.from_url(os.environ["WB_URL"])
    if _stamps:
        _r.rpush("wb:starts", *_stamps)
        _stamps.clear()

@registry.task(name="stamp")
async def stamp(payload, ctx):
    # Start times are buffered and pushed in batches, so recording them costs the event loop
    # next to nothing (a blocking push per job would itself delay the later starts).
    _stamps.append(repr(time.time()))
    if len(_stamps) == 1:
        asyncio.get_running_loop().call_later(0.05, _flush)
    elif len(_stamps) >= 200:
        _flush()
"""


def worker(url: str, queue: str, concurrency: int, tmp: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, WB_URL=url, PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]))
    exe = str(Path(sys.executable).parent / "scheduler")
    return subprocess.Popen(
        [exe, "worker", REGISTRY, "--url", url, "--queue", queue, "--concurrency",
         str(concurrency), "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "w.log"), "ab"),
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def completed(r: redis.Redis, q: Queue) -> int:
    # complete.lua counts `done` (older versions wrote `complete`: still read, as stats does).
    return sum(
        int(r.hget(k, "done") or 0) + int(r.hget(k, "complete") or 0)
        for k in r.scan_iter(q.keys.prefix + "stats:*")
    )


def wait_ready(r: redis.Redis, q: Queue) -> None:
    before = completed(r, q)
    q.enqueue("noop")
    deadline = time.monotonic() + 30
    while completed(r, q) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("worker not ready")
        time.sleep(0.01)


def drain(url: str, n: int, conc: int, tmp: str) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    q = Queue.from_url(url, f"drain{conc}")
    q.enqueue_many([JobSpec("noop", {"i": i}) for i in range(n)])
    proc = worker(url, q.name, conc, tmp)
    try:
        t_first = c_first = 0.0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            c = completed(r, q)
            now = time.perf_counter()
            if c and not t_first:
                t_first, c_first = now, c
            if c >= n:
                # None: every job was done by the first poll that saw one (a tiny n), no span.
                rate = round((c - c_first) / (now - t_first)) if now > t_first else None
                return {"bench": "drain", "n": n, "concurrency": conc, "jobs_per_s": rate}
            time.sleep(0.002)
        raise RuntimeError("drain timed out")
    finally:
        stop(proc)


def idle_lateness(url: str, rounds: int, tmp: str) -> dict[str, Any]:
    r = redis.Redis.from_url(url, decode_responses=True)
    q = Queue.from_url(url, "late")
    proc = worker(url, q.name, 16, tmp)
    try:
        wait_ready(r, q)
        server_ms, handler_ms = [], []
        for i in range(rounds):
            r.delete(STARTS)
            time.sleep(0.2)  # idle for sure
            due = datetime.fromtimestamp(time.time() + 0.3 + (i % 5) * 0.1, tz=UTC)
            # keep_payload: a done job keeps its whole hash, claimed_ms too (a lean one drops it).
            job_id = q.enqueue("stamp", run_at=due, keep_payload=True)
            deadline = time.monotonic() + 10
            while r.llen(STARTS) == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            job = q.get_job(job_id)
            claimed = int(job.fields["claimed_ms"])
            server_ms.append(claimed - (job.run_at_ms or 0))
            handler_ms.append((float(r.lindex(STARTS, 0) or 0) - due.timestamp()) * 1000)
        return {"bench": "idle_lateness", "rounds": rounds,
                "claim_minus_run_at_ms": {"p50": statistics.median(server_ms),
                                          "max": max(server_ms), "min": min(server_ms)},
                "handler_start_minus_due_ms": {"p50": round(statistics.median(handler_ms), 2),
                                               "max": round(max(handler_ms), 2),
                                               "min": round(min(handler_ms), 2)}}  # fmt: skip
    finally:
        stop(proc)


def simultaneous(url: str, n: int, tmp: str) -> dict[str, Any]:
    r = redis.Redis.from_url(url, decode_responses=True)
    q = Queue.from_url(url, "simul")
    proc = worker(url, q.name, 16, tmp)
    try:
        wait_ready(r, q)
        r.delete(STARTS)
        due_s = float(int(time.time() + 2.999))
        due = datetime.fromtimestamp(due_s, tz=UTC)
        q.enqueue_many([JobSpec("stamp", {"i": i}, run_at=due) for i in range(n)])
        deadline = time.monotonic() + 30
        while r.llen(STARTS) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        late = sorted((float(x) - due_s) * 1000 for x in r.lrange(STARTS, 0, -1))
        rss_kb = 0
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
        return {"bench": "simultaneous", "n": n, "started": len(late),
                "first_ms": round(late[0], 2), "p50_ms": round(statistics.median(late), 2),
                "max_ms": round(late[-1], 2), "early": sum(1 for x in late if x < 0),
                "worker_rss_mb_conc16": round(rss_kb / 1024, 1)}  # fmt: skip
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drain-n", type=int, default=20000)
    ap.add_argument("--concurrency", default="16,100")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--simultaneous-n", type=int, default=2000)
    a = ap.parse_args()
    import tempfile

    tmp = tempfile.mkdtemp(prefix="wb")
    Path(tmp, "worker_bench_tasks.py").write_text(TASKS)
    with private_server() as srv:
        for conc in (int(x) for x in a.concurrency.split(",")):
            print(json.dumps(drain(srv.url, a.drain_n, conc, tmp)), flush=True)
        print(json.dumps(idle_lateness(srv.url, a.rounds, tmp)), flush=True)
        print(json.dumps(simultaneous(srv.url, a.simultaneous_n, tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
