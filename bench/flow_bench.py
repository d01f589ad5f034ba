"""The cost of flow control (docs/flow-control.md), every case in one run on one private server.

    .venv/bin/python bench/flow_bench.py [--jobs 10000] [--batch 100]

Cases, each in a fresh queue with `--jobs` jobs all due now, drained by one client looping
`claim(limit=batch)` + `complete_many` (each claim timed):
  plain       no flow argument (the plain path)
  priorities  priority drawn from 0..9
  keys        every job its own concurrency key (10,000 distinct keys at the default), limit 1
  hot_cold    half the jobs on one hot key (limit 2) enqueued first, then half on distinct cold
              keys: without head-of-line blocking the first claim is a full batch
and `starvation` (test clock, deterministic): a priority-9 flood larger than the claim rate with
a few priority-0 jobs; prints the longest wait of a priority-0 job against priority_aging_ms.
Prints one JSON line per case and a last line with the ratios to plain (same run)."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import redis  # noqa: E402
from redis_server import private_server  # noqa: E402

from scheduler import Queue  # noqa: E402

PAYLOAD = {"pad": "x" * 64}


def drain(q: Queue, batch: int) -> dict[str, Any]:
    times_ms: list[float] = []
    sizes: list[int] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        b = q.claim("bench", limit=batch, lease_ms=60_000)
        times_ms.append((time.perf_counter() - t0) * 1000)
        if not b.jobs:
            break
        sizes.append(len(b.jobs))
        q.complete_many([(j.id, j.token, None) for j in b.jobs])
    drain_s = time.perf_counter() - t_start
    times_ms.pop()  # the last, empty claim
    times_ms.sort()
    return {
        "claims": len(sizes),
        "first_batch": sizes[0] if sizes else 0,
        "claim_p50_ms": round(statistics.median(times_ms), 3),
        "claim_p99_ms": round(times_ms[max(int(len(times_ms) * 0.99) - 1, 0)], 3),
        "drain_s": round(drain_s, 3),
        "jobs_per_s": round(sum(sizes) / drain_s),
    }


def case(url: str, name: str, jobs: int, batch: int) -> dict[str, Any]:
    q = Queue.from_url(url, "flow-" + name, result_ttl_ms=1_000)
    rnd = random.Random(7)
    specs: list[Any] = []
    for i in range(jobs):
        if name == "plain":
            kw: dict[str, Any] = {}
        elif name == "priorities":
            kw = {"priority": rnd.randint(0, 9)}
        elif name == "keys":
            kw = {"concurrency_key": f"k{i}", "concurrency_limit": 1}
        elif i < jobs // 2:  # hot_cold: the hot key first
            kw = {"concurrency_key": "hot", "concurrency_limit": 2}
        else:
            kw = {"concurrency_key": f"cold{i}", "concurrency_limit": 1}
        specs.append(kw)
    for kw in specs:  # one by one: JobSpec has no flow fields in every version
        q.enqueue("t", PAYLOAD, **kw)
    out = drain(q, batch)
    if name == "hot_cold":
        # The hot key's jobs drain 2 per claim at most (none complete mid-claim here).
        out["hot_jobs"] = jobs // 2
    return {"bench": "flow", "case": name, "jobs": jobs, "batch": batch, **out}


def starvation(url: str, aging_ms: int) -> dict[str, Any]:
    """Per 50 ms tick: 20 priority-9 jobs arrive, one claim of 10 runs (overload). Priority-0
    jobs arrive every 10 ticks; their wait is claim time - run_at (server test clock)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    q = Queue(client, "flow-starve", _clock="test", result_ttl_ms=1_000)
    now = 1_000_000
    client.set(q.keys.test_clock, now)
    client.hset(q.keys.config, "priority_aging_ms", aging_ms)
    low: dict[str, int] = {}
    waits: list[int] = []
    for tick in range(400):
        for _ in range(20):
            q.enqueue("hi", PAYLOAD, priority=9)
        if tick % 10 == 0 and tick < 300:
            low[q.enqueue("lo", PAYLOAD)] = now
        b = q.claim("bench", limit=10, lease_ms=60_000)
        for j in b.jobs:
            if j.id in low:
                waits.append(now - low.pop(j.id))
        q.complete_many([(j.id, j.token, None) for j in b.jobs])
        now += 50
        client.set(q.keys.test_clock, now)
    return {
        "bench": "flow",
        "case": "starvation",
        "priority_aging_ms": aging_ms,
        "low_served": len(waits),
        "low_never_served": len(low),
        "low_wait_max_ms": max(waits) if waits else None,
        "low_wait_p50_ms": statistics.median(waits) if waits else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--aging-ms", type=int, default=2_000)
    a = ap.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    with private_server() as srv:
        for name in ("plain", "priorities", "keys", "hot_cold"):
            rows[name] = case(srv.url, name, a.jobs, a.batch)
            print(json.dumps(rows[name]), flush=True)
        print(json.dumps(starvation(srv.url, a.aging_ms)), flush=True)
    plain = rows["plain"]
    ratios = {
        f"{n}_over_plain": {
            "claim_p50": round(r["claim_p50_ms"] / plain["claim_p50_ms"], 2),
            "drain": round(r["drain_s"] / plain["drain_s"], 2),
        }
        for n, r in rows.items()
        if n != "plain"
    }
    print(json.dumps({"bench": "flow_ratio", **ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
