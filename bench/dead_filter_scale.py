"""The dead-letter filters at scale: client time of dead_ids(task=...) and
dead_ids(error_type=...) (what `scheduler dead list/requeue/purge --task / --error-type` read)
over N dead jobs of 4 tasks, on a private server. A tenth of them are children parked before a
first claim in the real layout's shape: their hash has no task, their spec record has.

    .venv/bin/python bench/dead_filter_scale.py [--dead 100000] [--runs 3]

Prints the best of `runs` for each filter and the matches found (the same before and after)."""

from __future__ import annotations

import argparse
import time

from scheduler._spawn import RedisProcess, find_binary
from scheduler.client.queue import Queue
from scheduler.core.models import JobSpec


def fill(q: Queue, n: int) -> None:
    """n dead jobs: enqueued, claimed and failed non-retryably (one in ten with its hash's task
    field removed, as a child parked before its first claim has none)."""
    client = q.client
    specs = [JobSpec(f"t{i % 4}", {"n": i}, max_attempts=1) for i in range(n)]
    for i in range(0, n, 50_000):
        q.enqueue_many(specs[i : i + 50_000], batch_size=5_000)
    err = ("ValueError", "boom", "")
    other = ("KeyError", "gone", "")
    done = 0
    while done < n:
        batch = q.claim("bench", limit=1000, lease_ms=600_000)
        if not batch.jobs:
            break
        for j in batch.jobs:
            q.fail(j.id, j.token, err if done % 3 else other, retryable=False)
            done += 1
    pipe = client.pipeline(transaction=False)
    for k, job_id in enumerate(q.dead_ids()):
        if k % 10 == 0:
            pipe.hdel(q.keys.job(job_id), "task")
    pipe.execute()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dead", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    server = RedisProcess(find_binary()).start()
    try:
        client = server.client(decode_responses=True)
        q = Queue(client, "bench-dead")
        t0 = time.perf_counter()
        fill(q, args.dead)
        print(f"{args.dead:,} dead jobs made in {time.perf_counter() - t0:.1f} s")
        filters = {"task=t1": {"task": "t1"}, "error_type=KeyError": {"error_type": "KeyError"}}
        for label, kw in filters.items():
            best, found = float("inf"), 0
            for _ in range(args.runs):
                t0 = time.perf_counter()
                found = len(q.dead_ids(**kw))
                best = min(best, time.perf_counter() - t0)
            print(f"dead_ids({label}) over {args.dead:,} dead: {best:.2f} s, {found:,} match")
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
