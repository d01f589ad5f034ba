"""2,000 jobs due at one instant, by the worker's concurrency: ours vs the Node.js BullMQ worker.

    python bench/spike_concurrency.py [--n 2000] [--concurrency 16,64,256] [--repeat 2]
        [--systems ours,bullmq-node] [--transport unix|tcp]

bench/run.py's "simultaneous" workload with each system's worker at the given concurrency
(the module's CONCURRENCY, which its simultaneous() uses), everything else as there: one worker
process, the bench handler (RPUSH of a start stamp, then INCR, through the handler's own client),
a fresh private redis-server per run, jobs due DELAY_S ahead on a whole second. Runs are
interleaved (for each repeat: every concurrency, every system) so both see the same minutes.

Why: the start lateness of n jobs at concurrency C is about n x the worker's CPU per job when the
handler is short, whatever C; with a handler that waits on I/O a higher C starts more at once.
The issue's target (p99 <= 200 ms) names no concurrency; run.py measures 16 (ours) and 10
(bullmq-node): this shows what each worker does when the user sizes it for I/O-bound handlers.
Prints one JSON object (runs and medians).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import common as c  # noqa: E402
from driver import percentile  # noqa: E402
from redis_server import private_server  # noqa: E402
from run import DELAY_S  # noqa: E402

MODULES = {"ours": "systems.ours", "bullmq-node": "systems.bullmq_node"}


def one(system: str, concurrency: int, n: int, transport: str) -> dict[str, Any]:
    with private_server() as server:
        url = server.url if transport == "unix" else server.tcp_url
        os.environ[c.ENV_URL] = url
        mod = importlib.import_module(MODULES[system])
        mod.CONCURRENCY = concurrency  # type: ignore[attr-defined]
        late = [float(x) for x in mod.simultaneous(url, n, DELAY_S)]
    return {
        "system": system,
        "concurrency": concurrency,
        "p50_ms": round(percentile(late, 0.50), 1),
        "p99_ms": round(percentile(late, 0.99), 1),
        "max_ms": round(max(late), 1),
        "early": sum(1 for x in late if x < 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", default="16,64,256")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--systems", default="ours,bullmq-node")
    ap.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    systems = a.systems.split(",")
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

    medians = {
        f"{s}@{conc}": {k: median(s, conc, k) for k in ("p50_ms", "p99_ms", "max_ms", "early")}
        for conc in levels
        for s in systems
    }
    out = {"n": a.n, "transport": a.transport, "load": os.getloadavg(), "runs": runs}
    out["medians"] = medians
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
