"""Our claim latency as the backlog grows: it should stay flat (O(log n + batch)).

    .venv/bin/python bench/claim_latency.py [--max 1000000] [--rounds 200]

For each backlog size (1,000, 10,000, ... up to --max pending jobs, all due now) on a private
redis-server: `rounds` times, time one `claim(limit=100)` round trip, then (untimed) complete
the claimed jobs and enqueue as many new ones, so the backlog stays the same size. Prints one
JSON line per size and a last line with the p50 ratio of the largest size to the smallest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from redis_server import private_server  # noqa: E402

from scheduler import JobSpec, Queue  # noqa: E402

PAYLOAD = {"pad": "x" * 64}


def measure(q: Queue, rounds: int) -> dict[str, float]:
    times_ms = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        batch = q.claim("bench", limit=100, lease_ms=60_000)
        times_ms.append((time.perf_counter() - t0) * 1000)
        q.complete_many([(j.id, j.token, None) for j in batch.jobs])
        q.enqueue_many([JobSpec("t", PAYLOAD)] * len(batch.jobs))
    times_ms.sort()
    return {
        "p50_ms": round(statistics.median(times_ms), 3),
        "p99_ms": round(times_ms[int(len(times_ms) * 0.99) - 1], 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    sizes = [s for s in (1_000, 10_000, 100_000, 1_000_000) if s <= a.max]
    results = []
    with private_server() as srv:
        q = Queue.from_url(srv.url, "latency", result_ttl_ms=1_000)
        have = 0
        for size in sizes:
            q.enqueue_many([JobSpec("t", PAYLOAD)] * (size - have), batch_size=2000)
            have = size
            row = {"bench": "claim_latency", "backlog": size, **measure(q, a.rounds)}
            results.append(row)
            print(json.dumps(row), flush=True)
    ratio = results[-1]["p50_ms"] / results[0]["p50_ms"]
    print(json.dumps({"bench": "claim_latency_ratio", "largest_over_smallest_p50":
                      round(ratio, 2), "largest": sizes[-1], "smallest": sizes[0]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
