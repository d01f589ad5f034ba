"""The plain path's cost (no flow argument used), A/B on ONE private server, interleaved:

    git archive <old-commit> scheduler lua | tar -x -C /tmp/before
    .venv/bin/python bench/flow_plain_ab.py --before /tmp/before --after .

Loads each checkout's expanded enqueue/claim/complete scripts (its scheduler.core.scripts
source(), run in a subprocess under that checkout), keeps a 10,000-job backlog in one queue per
side, and per round times one claim(limit=100) and one complete of its jobs on each side in a
shuffled order, so load on a shared machine hits both alike. Prints the p50 of each and the
after/before ratio."""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import redis  # noqa: E402
from flow_claim_cpu import claim_stride  # noqa: E402
from redis_server import private_server  # noqa: E402

PAYLOAD = '{"pad":"' + "x" * 64 + '"}'
DUMP = (
    "import json, sys; sys.path.insert(0, '.');"
    "from scheduler.core.scripts import source;"
    "print(json.dumps({n: source(n) for n in ('enqueue', 'claim', 'complete')}))"
)


def sources(checkout: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", DUMP], cwd=checkout, check=True,
                         capture_output=True, text=True)  # fmt: skip
    return dict(json.loads(out.stdout))


def job(i: int, width: int) -> list[str]:
    fields = [f"j{i}-{secrets.token_hex(4)}", "t", PAYLOAD, "in", "0", "5",
              "1000,2.0,3600000,0.25", "0", "", "86400000", "", ""]  # fmt: skip
    return fields + [""] * (width - 12)  # 13 with the flow field


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=400)
    a = ap.parse_args()
    sides = {"before": sources(a.before), "after": sources(a.after)}
    with private_server() as srv:
        c = redis.Redis.from_url(srv.url, decode_responses=True)
        sha = {(s, n): c.script_load(text) for s, src in sides.items() for n, text in src.items()}
        width = {s: 13 if "flow_arg" in src["enqueue"] else 12 for s, src in sides.items()}
        keys = {s: [f"sched:{{ab{s}}}:" + k for k in ("", "due", "leased", "dead", "wake")]
                for s in sides}  # fmt: skip
        times: dict[tuple[str, str], list[float]] = {(s, o): [] for s in sides
                                                     for o in ("claim", "complete")}  # fmt: skip

        def enqueue(s: str, n: int) -> None:
            args = [str(n)] + [f for i in range(n) for f in job(i, width[s])]
            c.evalsha(sha[s, "enqueue"], 5, *keys[s], *args)

        for s in sides:
            for _ in range(10):
                enqueue(s, 1000)
        for _ in range(a.rounds):
            for s in random.sample(list(sides), 2):
                t0 = time.perf_counter()
                nonce = secrets.token_hex(8)
                rep = c.evalsha(sha[s, "claim"], 5, *keys[s], "w", "100", "60000", nonce, "100")
                times[s, "claim"].append(time.perf_counter() - t0)
                n = int(rep[2])
                w = claim_stride(rep, n)
                triples = [v for k in range(n) for v in (rep[3 + w * k], rep[4 + w * k], "null")]
                t0 = time.perf_counter()
                c.evalsha(sha[s, "complete"], 5, *keys[s], "1000", *triples)
                times[s, "complete"].append(time.perf_counter() - t0)
                enqueue(s, n)
    for op in ("claim", "complete"):
        b = statistics.median(times["before", op]) * 1000
        f = statistics.median(times["after", op]) * 1000
        row = {"bench": "flow_plain_ab", "op": f"{op}(100)", "before_p50_ms": round(b, 3)}
        print(json.dumps({**row, "after_p50_ms": round(f, 3), "ratio": round(f / b, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
