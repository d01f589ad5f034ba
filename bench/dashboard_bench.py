"""The dashboard's server time per request on a big queue: 1,000,000 pending and 100,000 dead
jobs (defaults) on a private redis-server. Each page is requested N times in process
(Starlette's TestClient: routing, Redis reads, template rendering; no network), and the Redis
commands per request are counted (INFO commandstats), which shows the work is O(page), not
O(jobs).

    .venv/bin/python bench/dashboard_bench.py                  # 1M pending, 100k dead
    .venv/bin/python bench/dashboard_bench.py --pending 10000 --dead 1000   # the same, small
    .venv/bin/python bench/dashboard_bench.py --partitions 12   # one logical queue over 12
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler import JobSpec, Queue
from scheduler._spawn import RedisProcess, find_binary
from scheduler.admin.inspection import discover_queues
from scheduler.client.partitioned import PartitionedQueue
from scheduler.dashboard import Auth, create_app

QUEUE = "bench"
BATCH = 1000


def fill(q: Queue, pending: int, dead: int) -> None:
    """`dead` dead letters (one attempt, lease lapsed, parked by the reaper: the real path),
    then `pending` due jobs; two tasks and two error types so the filters have work."""
    t0 = time.perf_counter()
    for start in range(0, dead, BATCH):
        n = min(BATCH, dead - start)
        task = "reports.build" if start % (2 * BATCH) == 0 else "emails.send"
        q.enqueue_many([JobSpec(task, {"i": start + i}, max_attempts=1) for i in range(n)])
        q.claim("bench-worker", limit=n, lease_ms=1)
    time.sleep(0.01)
    while q.counts().leased:
        q.claim("bench-worker", limit=0, reap_limit=10_000)
    t1 = time.perf_counter()
    for start in range(0, pending, BATCH):
        n = min(BATCH, pending - start)
        q.enqueue_many([JobSpec("emails.send", {"i": start + i}) for i in range(n)])
    c = q.counts()
    print(
        f"filled: {c.due + c.scheduled} pending, {c.dead} dead "
        f"({t1 - t0:.0f} s dead, {time.perf_counter() - t1:.0f} s pending)",
        flush=True,
    )


def commands(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def measure(web: TestClient, client: redis.Redis, path: str, n: int) -> dict[str, float]:
    web.get(path)  # warm: script load, template compile
    times = []
    before = commands(client)
    for _ in range(n):
        t = time.perf_counter()
        r = web.get(path)
        times.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200, (path, r.status_code)
    per_request = (commands(client) - before) / n
    times.sort()
    return {
        "p50_ms": statistics.median(times),
        "p95_ms": times[int(0.95 * (len(times) - 1))],
        "max_ms": times[-1],
        "redis_cmds": per_request,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--dead", type=int, default=100_000)
    ap.add_argument("-n", type=int, default=200, help="requests per page")
    ap.add_argument("--partitions", type=int, default=1, help="a partitioned queue of N (> 1)")
    args = ap.parse_args()
    server = RedisProcess(find_binary()).start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        q = Queue(client, QUEUE)
        deep = 50_000
        if args.partitions > 1:  # the same jobs spread evenly; pages read the merged queue
            pq = PartitionedQueue.create(client, QUEUE, partitions=args.partitions)
            for part in pq.parts:
                fill(part, args.pending // args.partitions, args.dead // args.partitions)
            q, deep = pq.parts[0], 1_000  # merged pages reach offset + limit <= 2,000
        else:
            fill(q, args.pending, args.dead)
        # The queue list is given (as `scheduler dashboard -q bench` does): discovery by SCAN
        # is cached for a minute and is not per request.
        app = create_app(client=client, queues=[QUEUE], auth=Auth())
        job_id = q.list_jobs("dead", limit=1)[0].id
        pages = {
            "overview (/)": "/",
            "overview live JSON": "/api/overview",
            "dead page": f"/queues/{QUEUE}/dead",
            "dead, older than 1s": f"/queues/{QUEUE}/dead?older_than=1s",
            "dead, task filter": f"/queues/{QUEUE}/dead?task=reports.build",
            f"dead, offset {deep}": f"/queues/{QUEUE}/dead?offset={deep}",
            "queue, due": f"/queues/{QUEUE}?state=due",
            "job": f"/queues/{QUEUE}/jobs/{job_id}",
        }
        print(f"{'page':24} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'cmds/req':>9}")
        with TestClient(app) as web:
            for label, path in pages.items():
                m = measure(web, client, path, args.n)
                print(
                    f"{label:24} {m['p50_ms']:8.2f} {m['p95_ms']:8.2f} {m['max_ms']:8.2f} "
                    f"{m['redis_cmds']:9.1f}",
                    flush=True,
                )
        t = time.perf_counter()
        found = discover_queues(client)
        print(
            f"queue discovery without --queue (SCAN, once a minute, in the background): "
            f"{(time.perf_counter() - t) * 1000:.0f} ms, found {found}"
        )
        print("used_memory:", client.info("memory")["used_memory_human"])
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
