"""One logical queue over N partitions: bulk enqueue and drain with N = 1, 3, 12 on a local
3-primary cluster (3 + 3 replicas) vs one plain node, in one run; the share each partition is
drained at (fairness); and the server-CPU-per-job model from INFO commandstats.

    .venv/bin/python bench/cluster_partitions.py [--jobs 12000] [--workers 2] [--concurrency 50]
                                                 [--batch 20] [--partitions 1,3,12]
                                                 [--targets node,cluster] [--repeat 1]
                                                 [--out bench/results/cluster_partitions.json]

This machine has 2 cores for six servers, the workers and this process, so the cluster-vs-node
ratio measured here is CPU-bound. The model is what holds on real hardware (one machine per
primary): server CPU per job (sum of `usec` of EVALSHA over every primary / jobs) -> jobs/s one
primary sustains (1e6 / that) -> N primaries x that; and the client CPU per job (this process for
enqueue, the worker processes for drain) stays flat as N grows."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from scheduler import JobSpec  # noqa: E402
from scheduler._spawn import RedisProcess, redis_server_binary  # noqa: E402
from scheduler._spawn_cluster import LocalCluster  # noqa: E402
from scheduler.client.partitioned import PartitionedQueue  # noqa: E402
from scheduler.core.connection import connect, primaries  # noqa: E402

SCHEDULER = str(Path(sys.executable).parent / "scheduler")


def _evalsha_usec(client: redis.Redis) -> tuple[float, int]:
    """(usec, calls) of EVALSHA summed over every primary (INFO commandstats)."""
    usec, calls = 0.0, 0
    for node in primaries(client):
        stat = node.info("commandstats").get("cmdstat_evalsha", {})
        usec += float(stat.get("usec", 0))
        calls += int(stat.get("calls", 0))
    return usec, calls


def _reset_stats(client: redis.Redis) -> None:
    for node in primaries(client):
        node.config_resetstat()


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _spawn_workers(
    url: str, queue: str, n: int, concurrency: int, batch: int
) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, TEST_REDIS_URL=url, PYTHONPATH=str(ROOT))
    cmd = [SCHEDULER, "worker", "tests.workers.basic:registry", "--url", url, "--queue", queue]
    cmd += ["--concurrency", str(concurrency), "--batch", str(batch)]
    out = subprocess.DEVNULL
    return [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out) for _ in range(n)]


def run_one(
    url: str, n: int, jobs: int, workers: int, concurrency: int, batch: int
) -> dict[str, Any]:
    client = connect(url)
    name = f"bench-{n}-{time.monotonic_ns() % 10**9}"
    q = PartitionedQueue.create(client, name, partitions=n)
    _reset_stats(client)
    cpu0, t0 = time.process_time(), time.perf_counter()
    q.enqueue_many([JobSpec("noop", None) for _ in range(jobs)], batch_size=500)
    enqueue_s, enqueue_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    enq_usec, _ = _evalsha_usec(client)
    _reset_stats(client)
    start = [p.counts().due for p in q.parts]
    ccpu0 = _children_cpu_s()
    procs = _spawn_workers(url, name, workers, concurrency, batch)
    shares: list[float] = []
    t_first = None
    while True:
        c = q.counts()
        if t_first is None and c.due < jobs:
            t_first = time.perf_counter()
        if shares == [] and c.due <= jobs // 2:  # mid-drain: how much each partition gave
            left = [p.counts().due for p in q.parts]
            shares = [(s - r) / s if s else 0.0 for s, r in zip(start, left, strict=True)]
        if c.due + c.leased == 0:
            break
        time.sleep(0.02)
    drain_s = time.perf_counter() - (t_first or time.perf_counter())
    drain_usec, _ = _evalsha_usec(client)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)
    worker_cpu = _children_cpu_s() - ccpu0
    mean = sum(shares) / len(shares) if shares else 0.0
    client.close()
    return {
        "partitions": n,
        "jobs": jobs,
        "enqueue_jobs_per_s": round(jobs / enqueue_s),
        "enqueue_client_cpu_us_per_job": round(enqueue_cpu / jobs * 1e6, 1),
        "enqueue_server_us_per_job": round(enq_usec / jobs, 2),
        "drain_jobs_per_s": round(jobs / drain_s) if drain_s > 0 else None,
        "drain_server_us_per_job": round(drain_usec / jobs, 2),
        "drain_worker_cpu_us_per_job": round(worker_cpu / jobs * 1e6, 1),
        "mid_drain_share_max_over_mean": round(max(shares) / mean, 3) if mean else None,
        "mid_drain_share_min_over_mean": round(min(shares) / mean, 3) if mean else None,
        "mid_drain_shares_over_mean": [round(x / mean, 3) for x in shares] if mean else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=12000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--batch", type=int, default=20, help="the workers' --batch")
    ap.add_argument("--partitions", default="1,3,12", help="the counts N to run, in order")
    ap.add_argument("--targets", default="node,cluster", help="node, cluster or both")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (target, N)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/cluster_partitions.json"))
    args = ap.parse_args()
    counts = [int(n) for n in args.partitions.split(",")]
    targets = set(args.targets.split(","))
    binary = redis_server_binary()
    if binary is None:
        sys.exit("redis-server not found")
    rows: list[dict[str, Any]] = []
    with RedisProcess(binary, tcp=True) as node, LocalCluster(binary) as cluster:
        for target, url in (("one node", node.tcp_url), ("3-primary cluster", cluster.url)):
            if target.split()[-1] not in targets:
                continue
            for n in [n for n in counts for _ in range(args.repeat)]:
                row = {
                    "target": target,
                    **run_one(url, n, args.jobs, args.workers, args.concurrency, args.batch),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    model = []
    for row in rows:
        us = row["enqueue_server_us_per_job"] + row["drain_server_us_per_job"]
        per_primary = 1e6 / us if us else 0
        model.append({
            "target": row["target"], "partitions": row["partitions"],
            "server_us_per_job": round(us, 2),
            "jobs_per_s_one_primary": round(per_primary),
            "jobs_per_s_3_primaries": round(3 * per_primary),
            "jobs_per_s_12_primaries": round(12 * per_primary),
        })  # fmt: skip
    out = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": vars(args),
        "rows": rows,
        "model": model,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for m in model:
        print(json.dumps(m))


if __name__ == "__main__":
    main()
