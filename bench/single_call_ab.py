"""One enqueue per call, the queues' straight single-call path against the driver's, in one
process and interleaved (the machine's speed drifts between processes more than these differ).

    python bench/single_call_ab.py [--rounds 9] [--n 3000]

"driver": the path before issue 16's session of 2026-12-02 (fourth): every call through
`Scripts.drive` and `run_sync` / `run_async`, and every asyncio send through redis-py's
`send_packed_command` (an `asyncio.wait_for`, a new Task, whenever the connection has a socket
timeout). "straight": `run_one_sync` / `run_one_async` and direct_io's send without the Task
when it cannot wait. `Queue.enqueue` and `AsyncQueue.enqueue` of the bench payload, on a private
redis-server (unix socket), flushed between runs. Prints the medians and minima of wall and CPU
(process_time) microseconds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import common as c  # noqa: E402
import redis  # noqa: E402
import redis.asyncio as aredis  # noqa: E402

from bench.redis_server import private_server  # noqa: E402
from scheduler import AsyncQueue, Queue  # noqa: E402
from scheduler.core import direct_io, scripts  # noqa: E402
from scheduler.operations.requests import Request  # noqa: E402


def _driver_sync(self: Queue, req: Request) -> Any:
    (reply,) = scripts.run_sync(self.client, self._scripts.drive([(self._script_keys, req)]))
    if isinstance(reply, BaseException):
        raise reply
    return reply


async def _driver_async(self: AsyncQueue, req: Request) -> Any:
    drive = self._scripts.drive([(self._script_keys, req)])
    (reply,) = await scripts.run_async(self.client, drive)
    if isinstance(reply, BaseException):
        raise reply
    return reply


async def _send_with_task(conn: Any, packed: list[bytes]) -> None:
    await conn.send_packed_command(packed)


STRAIGHT = (Queue._execute, AsyncQueue._execute, direct_io._send_async_raw)
DRIVER = (_driver_sync, _driver_async, _send_with_task)


def use(path: tuple[Any, Any, Any]) -> None:
    Queue._execute, AsyncQueue._execute, direct_io._send_async_raw = path  # type: ignore[method-assign]


def per_call(t0: float, c0: float, n: int) -> tuple[float, float]:
    return (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6


async def run(url: str, rounds: int, n: int) -> dict[str, list[tuple[float, float]]]:
    admin = redis.Redis.from_url(url)
    q = Queue(redis.Redis.from_url(url), "ab")
    aq = AsyncQueue(aredis.Redis.from_url(url), "ab-async")
    out: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, path in (("driver", DRIVER), ("straight", STRAIGHT)):
            use(path)
            admin.flushall()
            q.enqueue("task", 0)  # scripts loaded, connection made
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(n):
                q.enqueue("task", c.payload(i))
            out.setdefault(f"Queue.enqueue, {name}", []).append(per_call(t0, c0, n))
            admin.flushall()
            await aq.enqueue("task", 0)
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(n):
                await aq.enqueue("task", c.payload(i))
            out.setdefault(f"AsyncQueue.enqueue, {name}", []).append(per_call(t0, c0, n))
    use(STRAIGHT)
    await aq.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--n", type=int, default=3000)
    opts = ap.parse_args()
    with private_server() as srv:
        out = asyncio.run(run(srv.url, opts.rounds, opts.n))
    summary = {
        k: {
            "wall_us": {"median": round(statistics.median(w for w, _ in v), 1),
                        "min": round(min(w for w, _ in v), 1)},
            "cpu_us": {"median": round(statistics.median(p for _, p in v), 1),
                       "min": round(min(p for _, p in v), 1)},
        }
        for k, v in out.items()
    }  # fmt: skip
    print(json.dumps({"rounds": opts.rounds, "n": opts.n, "per_call": summary}, indent=1))


if __name__ == "__main__":
    main()
