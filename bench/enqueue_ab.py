"""Enqueue through the public API, this checkout against another revision's, interleaved.

    python bench/enqueue_ab.py --rev e7ca063 [--rounds 8] [--bulk 20000] [--single 3000]

One private redis-server (unix socket); each round runs both trees in a shuffled order, each in
its own process importing `scheduler` from its tree (the revision's from a `git archive`
snapshot): `Queue.enqueue_many` of --bulk JobSpecs built inside the timing (as bench/run.py's
bulk workload), then --single calls of `Queue.enqueue` and --single of `AsyncQueue.enqueue`
(awaited one at a time), the bench payload (bench/common.py).
The server is flushed between runs. Prints jobs/s per round and the medians, client and server
together: what a producer sees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def child(url: str, bulk: int, single: int) -> None:
    sys.path.insert(0, str(BENCH))
    import common as c

    from scheduler import JobSpec, Queue

    q = Queue.from_url(url, "ab")
    q.enqueue_many([JobSpec("task", c.payload(i)) for i in range(500)])  # scripts, connection
    t0 = time.perf_counter()
    q.enqueue_many([JobSpec("task", c.payload(i)) for i in range(bulk)])
    bulk_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(single):
        q.enqueue("task", c.payload(i))
    single_s = time.perf_counter() - t0
    async_s = asyncio.run(_async_single(url, single))
    print(json.dumps({"bulk": bulk / bulk_s, "single": single / single_s,
                      "async_single": single / async_s}))  # fmt: skip


async def _async_single(url: str, single: int) -> float:
    import common as c

    from scheduler import AsyncQueue

    q = AsyncQueue.from_url(url, "ab-async")
    await q.enqueue("task", c.payload(0))  # scripts, connection
    t0 = time.perf_counter()
    for i in range(single):
        await q.enqueue("task", c.payload(i))
    took = time.perf_counter() - t0
    await q.aclose()
    return took


def snapshot(rev: str) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="enqueue_ab_"))
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "scheduler", "lua"], capture_output=True
    )
    tar.check_returncode()
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar.stdout, check=True)
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--bulk", type=int, default=20_000)
    ap.add_argument("--single", type=int, default=3_000)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        child(opts.child, opts.bulk, opts.single)
        return
    sys.path.insert(0, str(ROOT))
    import redis

    from bench.redis_server import private_server

    trees = {opts.rev: snapshot(opts.rev), "this checkout": ROOT}
    kinds = ("bulk", "single", "async_single")
    rows: dict[str, dict[str, list[float]]] = {t: {k: [] for k in kinds} for t in trees}
    with private_server() as srv:
        admin = redis.Redis.from_url(srv.url)
        for r in range(opts.rounds):
            order = list(trees)
            random.shuffle(order)
            for name in order:
                admin.flushall()
                env = dict(os.environ, PYTHONPATH=str(trees[name]))
                out = subprocess.run(
                    [sys.executable, __file__, "--rev", opts.rev, "--child", srv.url,
                     "--bulk", str(opts.bulk), "--single", str(opts.single)],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                got = json.loads(out.stdout)
                for k in kinds:
                    rows[name][k].append(got[k])
                print(f"round {r + 1}: {name}: bulk {got['bulk']:,.0f}/s "
                      f"single {got['single']:,.0f}/s async single {got['async_single']:,.0f}/s",
                      file=sys.stderr)  # fmt: skip
    med = {n: {k: round(statistics.median(v)) for k, v in d.items()} for n, d in rows.items()}
    after, before = med["this checkout"], med[opts.rev]
    print(json.dumps({
        "rev": opts.rev, "rounds": opts.rounds, "bulk_n": opts.bulk, "single_n": opts.single,
        "median_jobs_per_s": med,
        "ratio_this_vs_rev": {k: round(after[k] / before[k], 3) for k in after},
        "rounds_jobs_per_s": {n: {k: [round(x) for x in v] for k, v in d.items()}
                              for n, d in rows.items()},
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
