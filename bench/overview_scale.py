"""The dashboard overview with many queues, on a private redis-server (never the shared one).

    .venv/bin/python bench/overview_scale.py [--queues 3000] [--requests 5] [--paths / /workers]

Creates `--queues` queues (one due job each), then times each page through starlette's
TestClient (in process, no network): bytes, seconds and Redis commands (INFO commandstats,
those inside scripts included; the fewest of the requests: the queue discovery, refreshed in
the background once a minute, may run during one) per request (the first request, which
discovers the queues, is not counted). Figures of 2026-12-05 in docs/dashboard.md ('Many queues').
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import redis

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from redis_server import private_server  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from scheduler import Queue  # noqa: E402
from scheduler.dashboard import Auth, create_app  # noqa: E402

PATHS = ("/api/overview", "/", "/workers", "/health", "/schedules")


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=3000)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--paths", nargs="+", default=PATHS)
    args = ap.parse_args()
    with private_server() as server:
        client = redis.Redis(unix_socket_path=server.socket_path, decode_responses=True)
        for i in range(args.queues):
            Queue(client, f"tenant-{i:05d}").enqueue("t", {"n": i})
        app = create_app(client=client, auth=Auth())
        with TestClient(app) as web:
            web.get("/api/overview")  # the discovery
            for path in args.paths:
                sizes, times, cmds = [], [], []
                for _ in range(args.requests):
                    before = commands(client)
                    t0 = time.perf_counter()
                    r = web.get(path)
                    times.append(time.perf_counter() - t0)
                    cmds.append(commands(client) - before)
                    assert r.status_code == 200, r.status_code
                    sizes.append(len(r.content))
                out = {"path": path, "queues": args.queues, "bytes": max(sizes),
                       "median_s": round(statistics.median(times), 3),
                       "redis_cmds": min(cmds)}  # fmt: skip
                if path.startswith("/api"):
                    out["rows"] = len(r.json()["queues"])
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
