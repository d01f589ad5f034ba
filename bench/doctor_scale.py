"""`scheduler doctor`'s check of a big healthy backlog: client time and memory of check_queue
over N never-claimed pending jobs (plus a few claimed ones), on a private server.

    .venv/bin/python bench/doctor_scale.py [--jobs 200000]

Memory is the growth of this process's peak RSS during the check (ru_maxrss). One run, 200k
jobs: 16.1 s and +118 MB at 9c7a8a8 (each never-claimed job re-read in a MULTI snapshot; run
with PYTHONPATH on a worktree of it), 5.1 s and +29 MB with doctor_pending's first read."""

from __future__ import annotations

import argparse
import resource
import time

from scheduler._spawn import RedisProcess, find_binary
from scheduler.admin.doctor import check_queue
from scheduler.client.queue import Queue
from scheduler.core.models import JobSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200_000)
    args = ap.parse_args()
    server = RedisProcess(find_binary()).start()
    try:
        client = server.client(decode_responses=True)
        q = Queue(client, "bench-doctor")
        specs = [JobSpec(f"t{i % 4}", {"n": i, "pad": "x" * 20}) for i in range(args.jobs)]
        for i in range(0, len(specs), 50_000):
            q.enqueue_many(specs[i : i + 50_000], batch_size=5_000)
        q.claim("w", limit=100)
        before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        found = check_queue(client, q.name)
        took_s = time.perf_counter() - t0
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
        print(
            f"doctor over {args.jobs:,} pending jobs: {took_s:.1f} s, peak RSS +{grew_mb:.0f} MB, "
            f"{len(found)} findings"
        )
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
