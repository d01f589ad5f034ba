"""Our claim latency as the backlog grows: it should stay flat (O(log n + batch)).

    .venv/bin/python bench/claim_latency.py [--max 1000000] [--rounds 200]

One queue per backlog size (1,000, 10,000, ... up to --max pending jobs, all due now) on a
private redis-server, all filled first; then `rounds` rounds, each timing one
`claim(limit=100)` round trip on every queue in turn (the order alternates), then (untimed)
completing the claimed jobs and enqueuing as many new ones, so each backlog stays its size.
Interleaved, a burst of load on this shared machine falls on every size alike instead of on
whichever size was being measured then (run one after the other, the ratio swung 0.9-1.5x).
Prints one JSON line per size and a last line with the p50 ratio of the largest to the smallest.
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


def claim_once(q: Queue) -> float:
    """One timed claim (ms); its jobs completed and replaced untimed."""
    t0 = time.perf_counter()
    batch = q.claim("bench", limit=100, lease_ms=60_000)
    took_ms = (time.perf_counter() - t0) * 1000
    q.complete_many([(j.id, j.token, None) for j in batch.jobs])
    q.enqueue_many([JobSpec("t", PAYLOAD)] * len(batch.jobs))
    return took_ms


def summary(times_ms: list[float]) -> dict[str, float]:
    times_ms = sorted(times_ms)
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
    with private_server() as srv:
        queues = [Queue.from_url(srv.url, f"latency-{n}", result_ttl_ms=1_000) for n in sizes]
        for q, size in zip(queues, sizes, strict=True):
            q.enqueue_many([JobSpec("t", PAYLOAD)] * size, batch_size=2000)
        times: list[list[float]] = [[] for _ in sizes]
        for r in range(a.rounds):
            order = range(len(sizes)) if r % 2 == 0 else reversed(range(len(sizes)))
            for i in order:
                times[i].append(claim_once(queues[i]))
    results = []
    for size, t in zip(sizes, times, strict=True):
        row = {"bench": "claim_latency", "backlog": size, **summary(t)}
        results.append(row)
        print(json.dumps(row), flush=True)
    ratio = results[-1]["p50_ms"] / results[0]["p50_ms"]
    print(json.dumps({"bench": "claim_latency_ratio", "largest_over_smallest_p50":
                      round(ratio, 2), "largest": sizes[-1], "smallest": sizes[0]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
