"""Top-of-the-hour spike: 10,000 jobs due at the same instant, with and without a jitter
window, drained by one worker process. Reports the worst second's load (jobs per second of
run_at, as stored in the due set, and jobs started per wall-clock second) and how long until the
last one started.

The worker loop is driven directly with Queue.claim / Queue.complete_many (no handler work),
on a private redis-server, with the queue's test clock: the clock follows wall time from the
instant the jobs are due, so jittered jobs become claimable as they would in production.

    .venv/bin/python -m bench.spike_bench [--jobs 10000] [--jitter-ms 60000] [--speedup 10]

--speedup N runs the clock N times faster than wall time (a 60 s window drains in 6 s).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from datetime import UTC, datetime

import redis

from bench.redis_server import private_server
from scheduler import JobSpec, Queue

DUE_MS = 3_600_000  # "the top of an hour" on the test clock


def run(url: str, name: str, jobs: int, jitter_ms: int, speedup: float) -> dict[str, float]:
    client = redis.Redis.from_url(url, decode_responses=True)
    q = Queue(client, name, _clock="test")
    clock_key = q.keys.test_clock
    client.set(clock_key, DUE_MS - 1_000)
    at = datetime.fromtimestamp(DUE_MS / 1000, UTC)
    q.enqueue_many([JobSpec("spike", None, run_at=at, jitter_ms=jitter_ms) for _ in range(jobs)])
    per_run_second = Counter(int(s) // 1000 for _, s in client.zrange(q.keys.due, 0, -1,
                                                                     withscores=True))  # fmt: skip
    started_at: list[float] = []
    t0 = time.perf_counter()
    while len(started_at) < jobs:
        sim_ms = DUE_MS + int((time.perf_counter() - t0) * 1000 * speedup)
        client.set(clock_key, sim_ms)
        batch = q.claim("bench", limit=100, lease_ms=60_000)
        if not batch.jobs:
            time.sleep(0.001)
            continue
        # Started at this simulated time (ms after the due instant).
        started_at.extend([sim_ms - DUE_MS] * len(batch.jobs))
        q.complete_many([(j.id, j.token, None) for j in batch.jobs])
    wall_s = time.perf_counter() - t0
    started_per_s = Counter(int(ms // 1000) for ms in started_at)
    client.close()
    return {
        "worst_run_at_second": max(per_run_second.values()),
        "worst_started_second": max(started_per_s.values()),
        "last_started_s": max(started_at) / 1000,
        "drain_wall_s": wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--jitter-ms", type=int, default=60_000)
    ap.add_argument("--speedup", type=float, default=10.0)
    a = ap.parse_args()
    with private_server() as server:
        for label, jitter in (("no jitter", 0), (f"jitter {a.jitter_ms} ms", a.jitter_ms)):
            r = run(server.url, f"spike{jitter}", a.jobs, jitter, a.speedup)
            print(
                f"{label:>18}: worst second by run_at {r['worst_run_at_second']:>6}, "
                f"worst second by start {r['worst_started_second']:>6}, last started "
                f"{r['last_started_s']:.1f} s after the hour (clock x{a.speedup:g}), "
                f"drain took {r['drain_wall_s']:.2f} s wall"
            )


if __name__ == "__main__":
    main()
