"""`scheduler queue move` of a big backlog: client time and memory of move_queue over N waiting
jobs, each with an idempotency key or none, on a private server.

    .venv/bin/python bench/queue_move_scale.py [--jobs 100000] [--plain]

Memory is the growth of this process's peak RSS during the move (ru_maxrss); the queue is filled
in small chunks first, so their peak stays under the move's. One run each on a loaded machine
(2026-12-07): 100,000 keyed jobs +48 MB and 32 s at 007fddd (moved ids and keys in Python sets
and dicts, a round trip a key; run with PYTHONPATH on a `git archive` of it), +11 MB and 15 s
with queue_move_ledger.py; 300,000 keyed +12.5 MB, 48 s; 300,000 plain +4 MB, 28 s."""

from __future__ import annotations

import argparse
import resource
import time

from scheduler._spawn import RedisProcess, find_binary
from scheduler.admin.queue_move import move_queue
from scheduler.client.queue import Queue
from scheduler.core.models import JobSpec

HOUR_MS = 3_600_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--plain", action="store_true", help="jobs without an idempotency key")
    args = ap.parse_args()
    server = RedisProcess(find_binary()).start()
    try:
        client = server.client(decode_responses=True)
        q = Queue(client, "bench-move-src")
        for start in range(0, args.jobs, 5_000):
            q.enqueue_many(
                JobSpec("t", {"n": i}, delay_ms=HOUR_MS, key=None if args.plain else f"k{i}")
                for i in range(start, min(args.jobs, start + 5_000))
            )
        before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        report = move_queue(client, q.name, "bench-move-dst")
        took_s = time.perf_counter() - t0
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
        kind = "plain" if args.plain else "keyed"
        print(
            f"queue move of {args.jobs:,} {kind} jobs: {took_s:.1f} s, peak RSS +{grew_mb:.1f} MB "
            f"(moved {report.moved:,}, keys {report.keys:,})"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
