"""2,000 jobs due at one instant, by the worker's concurrency: ours vs the Node.js BullMQ worker,
against the handler's own floor.

    python bench/spike_concurrency.py [--n 2000] [--concurrency 16,64,256] [--repeat 2]
        [--systems ours,bullmq-node,handler-floor] [--transport unix|tcp]

bench/run.py's "simultaneous" workload with each system's worker at the given concurrency
(the module's CONCURRENCY, which its simultaneous() uses), everything else as there: one worker
process, the bench handler (RPUSH of a start stamp, then INCR, through the handler's own client),
a fresh private redis-server per run, jobs due DELAY_S ahead on a whole second. Runs are
interleaved (for each repeat: every concurrency, every system) so both see the same minutes.

Why: the start lateness of n jobs at concurrency C is about n x the worker's CPU per job when the
handler is short, whatever C; with a handler that waits on I/O a higher C starts more at once.
The issue's target (p99 <= 200 ms) names no concurrency; run.py measures 16 (ours) and 10
(bullmq-node): this shows what each worker does when the user sizes it for I/O-bound handlers.

The "handler-floor" row is no peer: it is the least start lateness ANY worker running this handler
in one process can reach on this machine. A fresh subprocess (its own CPU and event loop, as a
worker's are) builds the handler's client as systems/ours.py does, runs one warm-up handler call
(the worker benches send one job before the spike, so one connection exists), then runs the n
timed handler calls at the given concurrency on uvloop (asyncio when uvloop is missing) with no
scheduler, no queue and no claiming at all: each of C slots starts its next call as soon as its
last one ends, so start k is about the end of call k-C. Each call pushes its start stamp exactly
as the real handler does (common.handle_async); lateness = stamp - t0, t0 being the instant right
before the first call, as if all n were due then and a perfect worker saw them at once. "early"
is 0 by construction. worker_cpu_ms is that subprocess's CPU over the n calls. The issue's target
(p99 <= 200 ms) can be read against it: what a worker adds on top of the floor is the scheduler's
cost; a floor near the target leaves the scheduler little room on this machine.
Prints one JSON object (runs and medians).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import common as c  # noqa: E402
from driver import percentile  # noqa: E402
from redis_server import private_server  # noqa: E402
from run import DELAY_S  # noqa: E402

MODULES = {
    "ours": "systems.ours",
    "ours-2p": "systems.ours_2p",  # scheduler worker --processes 2, each at the concurrency
    "bullmq-node": "systems.bullmq_node",
}


FLOOR = "handler-floor"


def floor_child(url: str, n: int, concurrency: int) -> None:
    """Run in the floor's subprocess: the bare handler, n times at ``concurrency``; prints JSON."""
    import asyncio

    import redis.asyncio as aredis

    async def main() -> dict[str, float]:
        # The handler's client exactly as systems/ours.py builds it (uncapped pool, no timeout).
        kw: dict[str, Any] = {"max_connections": 2**31}
        if os.environ.get("BENCH_HANDLER_SOCKET_TIMEOUT") != "default":
            kw["socket_timeout"] = None
        r = aredis.Redis.from_url(url, **kw)
        await c.handle_async(r, c.payload(-1))  # warm-up: one connection, no stamp
        left = n

        async def slot() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await c.handle_async(r, c.payload(0, True))

        cpu0 = time.process_time()
        t0 = time.time()
        await asyncio.gather(*(slot() for _ in range(concurrency)))
        cpu = time.process_time() - cpu0
        await r.aclose()
        return {"t0": t0, "cpu_ms": cpu * 1000.0}

    try:
        import uvloop

        out = uvloop.run(main())
    except ImportError:
        out = asyncio.run(main())
    print(json.dumps(out))


def floor(url: str, n: int, concurrency: int) -> tuple[list[float], float]:
    """The handler-floor run on ``url``: lateness per job (ms), the subprocess's CPU (ms)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p)
    code = f"import spike_concurrency as s; s.floor_child({url!r}, {n}, {concurrency})"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=c.lateness_timeout(0.0, n),
        check=True,
    )
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    late = c.collect_lateness(c.client(url), n, float(res["t0"]), 10.0)
    return late, float(res["cpu_ms"])


def one(system: str, concurrency: int, n: int, transport: str) -> dict[str, Any]:
    cpu_ms = None
    with private_server() as server:
        url = server.url if transport == "unix" else server.tcp_url
        os.environ[c.ENV_URL] = url
        if system == FLOOR:
            late, cpu_ms = floor(url, n, concurrency)
        else:
            mod = importlib.import_module(MODULES[system])
            # A variant (systems/ours_2p.py) runs its BASE module's functions: set it there.
            getattr(mod, "BASE", mod).CONCURRENCY = concurrency
            late = [float(x) for x in mod.simultaneous(url, n, DELAY_S)]
    row: dict[str, Any] = {
        "system": system,
        "concurrency": concurrency,
        "p50_ms": round(percentile(late, 0.50), 1),
        "p99_ms": round(percentile(late, 0.99), 1),
        "max_ms": round(max(late), 1),
        "early": sum(1 for x in late if x < 0),
    }
    if cpu_ms is not None:
        row["worker_cpu_ms"] = round(cpu_ms, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", default="16,64,256")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--systems", default=f"ours,bullmq-node,{FLOOR}")
    ap.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    systems = a.systems.split(",")
    unknown = [s for s in systems if s != FLOOR and s not in MODULES]
    if unknown:
        ap.error(f"unknown systems {unknown}: pick from {[*MODULES, FLOOR]}")
    runs = []
    for r in range(a.repeat):
        for conc in levels:
            for system in systems:
                row = one(system, conc, a.n, a.transport)
                row["repeat"] = r
                print(json.dumps(row), file=sys.stderr)
                runs.append(row)

    def median(system: str, conc: int, k: str) -> float:
        return statistics.median(
            x[k] for x in runs if x["system"] == system and x["concurrency"] == conc
        )

    keys = ("p50_ms", "p99_ms", "max_ms", "early")
    medians = {
        f"{s}@{conc}": {
            k: median(s, conc, k) for k in keys + (("worker_cpu_ms",) if s == FLOOR else ())
        }
        for conc in levels
        for s in systems
    }
    out = {"n": a.n, "transport": a.transport, "load": os.getloadavg(), "runs": runs}
    out["medians"] = medians
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
