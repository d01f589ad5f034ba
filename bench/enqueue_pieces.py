"""Where a single enqueue's time goes, against huey's one RPUSH, interleaved in one process.

    python bench/enqueue_pieces.py

On a private redis-server (unix socket), per call, medians of 5 rounds of 3,000: huey's
enqueue as it is on the wire (a pickled tuple, RPUSH through redis-py's execute_command); an
EVALSHA of `return 1` on our direct path (the round trip alone); our enqueue script's EVALSHA
with its arguments built beforehand (the round trip plus the script); `Queue.enqueue` (plus
the client's id, JSON, checks and driver). Wall and CPU (process_time) microseconds.
"""

from __future__ import annotations

import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import common as c  # noqa: E402
import redis  # noqa: E402

from bench.redis_server import private_server  # noqa: E402
from scheduler import JobSpec, Queue  # noqa: E402
from scheduler.core import direct_io  # noqa: E402
from scheduler.core.codec import enqueue_args  # noqa: E402

N = 3000
ROUNDS = 5


def timed(fn: Callable[[int], Any]) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(N):
        fn(i)
    return (time.perf_counter() - t0) / N * 1e6, (time.process_time() - c0) / N * 1e6


def main() -> None:
    with private_server() as server:
        r = redis.Redis.from_url(server.url)
        q = Queue(r, "pieces")
        q.enqueue("task", c.payload(0))  # the scripts loaded
        sha, keys = q._scripts.sha["enqueue"], q._script_keys
        ret1 = r.script_load("return 1")
        argsets: list[list[str]] = []
        variants: dict[str, Callable[[int], Any]] = {
            "huey: RPUSH of a pickle via execute_command": lambda i: r.rpush(
                "huey", pickle.dumps(("task", c.payload(i)))
            ),
            "EVALSHA 'return 1', direct path": lambda i: direct_io.call_sync(
                r, ("EVALSHA", ret1, 0)
            ),
            "enqueue EVALSHA, arguments prebuilt": lambda i: direct_io.call_sync(
                r, ("EVALSHA", sha, len(keys), *keys, *argsets[i])
            ),
            "Queue.enqueue": lambda i: q.enqueue("task", c.payload(i)),
        }
        out: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        for _ in range(ROUNDS):
            for name, fn in variants.items():
                r.flushall()
                q.enqueue("task", 1)
                argsets[:] = [
                    enqueue_args([JobSpec("task", c.payload(i))], 512 * 1024) for i in range(N)
                ]
                out[name].append(timed(fn))
        for name, v in out.items():
            wall = statistics.median(x[0] for x in v)
            cpu = statistics.median(x[1] for x in v)
            print(f"{name:45s} wall {wall:6.1f} us  cpu {cpu:6.1f} us")


if __name__ == "__main__":
    main()
