"""Concurrent AsyncQueue.enqueue callers (a web app's request handlers), this checkout against
another revision's, interleaved.

    python bench/enqueue_concurrent.py --rev 0f69549 [--rounds 5] [--jobs 20000]
        [--callers 1,16,128] [--tcp]

One private redis-server (unix socket, or its TCP port with --tcp). Each round runs both trees
in a shuffled order, each in its own process importing `scheduler` from its tree (the
revision's from a `git archive` snapshot): for each number of callers C, C asyncio tasks on one
AsyncQueue each await `enqueue` of the bench payload one job at a time, --jobs in all. Prints
jobs/s (accepted jobs) per round and the medians, the calls that raised, by exception, and
how many connections each run opened (the
redis.asyncio pool opens one per call in flight).
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

from enqueue_ab import snapshot  # noqa: E402


async def _run(url: str, jobs: int, callers: int) -> dict[str, float]:
    import common as c
    import redis.asyncio as aredis

    from scheduler import AsyncQueue

    admin = aredis.Redis.from_url(url)
    opened = int((await admin.info("stats"))["total_connections_received"])
    q = AsyncQueue.from_url(url, f"conc{callers}")
    await q.enqueue("task", c.payload(0))  # scripts, connection
    per = jobs // callers

    errors: dict[str, int] = {}

    async def caller(k: int) -> None:
        for i in range(per):
            try:
                await q.enqueue("task", c.payload(k * per + i))
            except Exception as exc:  # counted: the pool's MaxConnectionsError past 100 calls
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(callers)))
    took = time.perf_counter() - t0
    n = await admin.zcard(f"sched:{{conc{callers}}}:due")
    opened = int((await admin.info("stats"))["total_connections_received"]) - opened
    await admin.aclose()
    await q.aclose()
    failed = sum(errors.values())
    if n != per * callers - failed + 1:
        raise SystemExit(f"{n} jobs in due, expected {per * callers - failed + 1}")
    return {"jobs_per_s": (per * callers - failed) / took, "connections": opened, "errors": errors}


def child(url: str, jobs: int, callers: list[int]) -> None:
    out = {str(c): asyncio.run(_run(url, jobs, c)) for c in callers}
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--callers", default="1,16,128")
    ap.add_argument("--tcp", action="store_true")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    callers = [int(x) for x in opts.callers.split(",")]
    if opts.child:
        child(opts.child, opts.jobs, callers)
        return
    sys.path.insert(0, str(ROOT))
    import redis

    from bench.redis_server import private_server

    trees = {opts.rev: snapshot(opts.rev), "this checkout": ROOT}
    rows: dict[str, dict[str, list[float]]] = {t: {str(c): [] for c in callers} for t in trees}
    conns: dict[str, dict[str, int]] = {t: {} for t in trees}
    errors: dict[str, dict[str, dict[str, int]]] = {t: {} for t in trees}
    with private_server() as srv:
        url = srv.tcp_url if opts.tcp else srv.url
        admin = redis.Redis.from_url(srv.url)
        for r in range(opts.rounds):
            order = list(trees)
            random.shuffle(order)
            for name in order:
                admin.flushall()
                env = dict(os.environ, PYTHONPATH=str(trees[name]))
                out = subprocess.run(
                    [sys.executable, __file__, "--rev", opts.rev, "--child", url,
                     "--jobs", str(opts.jobs), "--callers", opts.callers],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                got = json.loads(out.stdout)
                for k, v in got.items():
                    rows[name][k].append(v["jobs_per_s"])
                    conns[name][k] = max(conns[name].get(k, 0), v["connections"])
                    for e, count in v["errors"].items():
                        errors[name].setdefault(k, {})[e] = (
                            errors[name].get(k, {}).get(e, 0) + count
                        )
                shown = "  ".join(
                    f"{k} callers {v['jobs_per_s']:,.0f}/s ({v['connections']} conn"
                    f"{', errors ' + str(v['errors']) if v['errors'] else ''})"
                    for k, v in got.items()
                )
                print(f"round {r + 1}: {name}: {shown}", file=sys.stderr)
    med = {n: {k: round(statistics.median(v)) for k, v in d.items()} for n, d in rows.items()}
    after, before = med["this checkout"], med[opts.rev]
    print(json.dumps({
        "rev": opts.rev, "rounds": opts.rounds, "jobs": opts.jobs, "tcp": opts.tcp,
        "median_jobs_per_s_by_callers": med,
        "ratio_this_vs_rev": {k: round(after[k] / before[k], 3) for k in after},
        "most_connections_opened_by_callers": conns,
        "failed_calls_by_callers": errors,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
