"""Client CPU per call of the pieces a single enqueue pays for, interleaved in one process.

    python bench/client_overhead.py [--n 20000] [--rounds 3]

- `PING` through redis-py's `execute_command` against the same command on a connection taken
  with the pool's `get_connection` / `release` (what scheduler/core/direct_io.py did for EVALSHA
  until it took connections from the pool's list itself), on one taken from the list as
  direct_io does now (`direct_pool.take` / `give`: the pool's checks without its recorders),
  and on a connection held for the whole loop (no pool at all);
- building one `JobSpec` (the written-out `__init__` of scheduler/core/job_spec.py) against the
  dataclass-generated frozen `__init__` it replaced (an equivalent class built here).

CPU time (process_time) per call, each round all variants in turn, on a private redis-server's
unix socket. Prints one JSON object: per variant the per-round figures in microseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.redis_server import private_server  # noqa: E402
from scheduler import JobSpec  # noqa: E402
from scheduler.core import direct_pool  # noqa: E402

# The generated frozen __init__ JobSpec had before (same fields and defaults).
GeneratedSpec = dataclasses.make_dataclass(
    "GeneratedSpec",
    [(f.name, f.type, dataclasses.field(default=f.default)) if f.default is not dataclasses.MISSING
     else (f.name, f.type) for f in dataclasses.fields(JobSpec)],
    frozen=True,
)  # fmt: skip


def cpu_us(fn: Callable[[], Any], n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return round((time.process_time() - t0) / n * 1e6, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    out: dict[str, list[float]] = {}
    with private_server() as server:
        r = redis.Redis.from_url(server.url)
        r.ping()
        pool = r.connection_pool

        def pooled() -> Any:
            conn = pool.get_connection()
            try:
                conn.send_command("PING")
                return conn.read_response()
            finally:
                pool.release(conn)

        def listed() -> Any:
            conn, from_list = direct_pool.take(pool)
            try:
                conn.send_command("PING")
                return conn.read_response()
            finally:
                direct_pool.give(pool, conn, from_list)

        held = pool.get_connection()

        def on_held() -> Any:
            held.send_command("PING")
            return held.read_response()

        variants: dict[str, Callable[[], Any]] = {
            "PING via execute_command": lambda: r.execute_command("PING"),
            "PING on a pooled connection (get_connection/release)": pooled,
            "PING on a connection from the pool's list (direct_io)": listed,
            "PING on a held connection": on_held,
            "JobSpec(...) written-out __init__": lambda: JobSpec("task", {"i": 1}),
            "frozen dataclass __init__ (before)": lambda: GeneratedSpec("task", {"i": 1}),
        }
        for _ in range(a.rounds):
            for name, fn in variants.items():
                out.setdefault(name, []).append(cpu_us(fn, a.n))
        pool.release(held)
    print(json.dumps({"n": a.n, "redis_py": redis.__version__, "cpu_us_per_call": out}, indent=1))


if __name__ == "__main__":
    main()
