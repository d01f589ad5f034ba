"""/workers with many queues and many workers each, on a private redis-server (never the shared
one).

    .venv/bin/python bench/dashboard_workers_scale.py [--queues 200] [--workers 200] [--requests 5]

Registers `--workers` live workers on each of `--queues` queues (one ZSET entry and one
presence hash each, as lua/worker_beat.lua writes them: one beat), then times /workers through
starlette's TestClient (in process, no network): bytes, rows shown, seconds, Redis commands
(INFO commandstats; the fewest of the requests, as bench/overview_scale.py counts them) and
round trips (sends on a connection, a pipeline one: tests/test_dashboard_workers_round_trips.py
counts them so) per request, the first page and the second (?from=). Over a unix socket a round
trip costs little; over a network each adds its latency. Figures in docs/dashboard.md ('Many
workers').
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from redis_server import private_server  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from scheduler.core.keys import QueueKeys  # noqa: E402
from scheduler.dashboard import Auth, create_app  # noqa: E402

TTL_MS = 3_600_000  # the presence hashes outlive the run


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def count_sends() -> list[int]:
    """One entry a round trip sent on any redis-py connection from now on."""
    sent: list[int] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    return sent


def register(client: redis.Redis, queues: int, workers: int) -> list[str]:
    names = [f"tenant-{i:05d}" for i in range(queues)]
    now_ms = int(time.time() * 1000)
    for name in names:
        keys, pipe = QueueKeys(name), client.pipeline(transaction=False)
        for w in range(workers):
            wid = f"host-{w:04d}.{w}"
            pipe.zadd(keys.workers, {wid: now_ms - w})
            pipe.hset(keys.worker(wid), mapping={
                "host": f"host-{w:04d}", "pid": str(1000 + w), "queues": name,
                "started_ms": str(now_ms), "last_heartbeat_ms": str(now_ms - w),
                "in_flight": "1", "concurrency": "4", "stopping": ""})  # fmt: skip
            pipe.pexpire(keys.worker(wid), TTL_MS)
        pipe.execute()
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=200)
    ap.add_argument("--workers", type=int, default=200)
    ap.add_argument("--requests", type=int, default=5)
    args = ap.parse_args()
    with private_server() as server:
        client = redis.Redis(unix_socket_path=server.socket_path, decode_responses=True)
        register(client, args.queues, args.workers)
        app = create_app(client=client, auth=Auth())
        sent = count_sends()
        with TestClient(app) as web:
            web.get("/api/overview")  # the discovery
            for path in ("/workers", "/workers?from=200"):
                sizes, times, cmds, trips = [], [], [], []
                for _ in range(args.requests):
                    before = commands(client)
                    t0, sends = time.perf_counter(), len(sent)
                    r = web.get(path)
                    times.append(time.perf_counter() - t0)
                    trips.append(len(sent) - sends)
                    cmds.append(commands(client) - before)
                    assert r.status_code == 200, r.status_code
                    sizes.append(len(r.content))
                out = {"path": path, "queues": args.queues, "workers": args.workers,
                       "rows": r.text.count("<tr data-worker="), "bytes": max(sizes),
                       "median_s": round(statistics.median(times), 3),
                       "redis_cmds": min(cmds), "round_trips": min(trips)}  # fmt: skip
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
