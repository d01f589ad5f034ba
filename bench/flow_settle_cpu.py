"""Redis CPU per settled job (complete, fail's retry, fail's park), plain and flow, A/B on ONE
private server, interleaved (bench/flow_claim_cpu.py's method, for the settling side):

    git archive <old-commit> scheduler lua | tar -x -C /tmp/before
    .venv/bin/python bench/flow_settle_cpu.py --before /tmp/before --after .

Loads each checkout's expanded enqueue/claim/complete/fail scripts (its
scheduler.core.scripts source(), in a subprocess under that checkout). Per side and op, two
queues of a --backlog of jobs due now:
  plain  no flow argument
  flow   one concurrency key, limit 10,000 (so none is held: a release finds no held job)
Each round, for every (side, queue, op) in a shuffled order: one untimed claim(limit=--batch),
then the timed settlement of what it leased: one complete call of the batch, or the batch's
fail calls in one pipeline (retry: retryable, delay 0, back into due and claimed again later;
park: not retryable, dead, replaced by new jobs). INFO is read around the timed part: the
server's main-thread CPU (less an empty INFO-to-INFO interval), EVALSHA usec (script time) and
the commands the scripts ran, each per job. A fail pipeline's CPU includes each call's own
request handling, alike on both sides (ratios are diluted by it, not biased). Prints one JSON
line per (queue, op): each side's median EVALSHA us/job and the median of the per-round
after/before ratios, each side's mean CPU us/job and their ratio, and commands per job."""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import redis  # noqa: E402
from flow_claim_cpu import claim_stride, stats  # noqa: E402  (one INFO read: EVALSHA usec, commands, CPU)
from redis_server import private_server  # noqa: E402

PAYLOAD = '{"pad":"' + "x" * 64 + '"}'
NAMES = ("enqueue", "claim", "complete", "fail")
DUMP = (
    "import json, sys; sys.path.insert(0, '.');"
    "from scheduler.core.scripts import source;"
    f"print(json.dumps({{n: source(n) for n in {NAMES!r}}}))"
)
QUEUES = ("plain", "flow")
OPS = ("complete", "fail_retry", "fail_park")


def sources(checkout: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", DUMP], cwd=checkout, check=True,
                         capture_output=True, text=True)  # fmt: skip
    return dict(json.loads(out.stdout))


def job(i: int, flow: bool) -> list[str]:
    # max_attempts 10,000: a retried job is claimed again and again without being parked.
    field = "0|tenant:1|10000||0|0|" if flow else ""
    return [f"j{i}-{secrets.token_hex(4)}", "t", PAYLOAD, "in", "0", "10000",
            "1000,2.0,3600000,0.25", "0", "", "86400000", "", "", field]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=2000)
    a = ap.parse_args()
    sides = {"before": sources(a.before), "after": sources(a.after)}
    Key = tuple[str, str, str]
    with private_server() as srv:
        c = redis.Redis.from_url(srv.url, decode_responses=True)
        sha = {(s, n): c.script_load(text) for s, src in sides.items() for n, text in src.items()}
        names = ("", "due", "leased", "dead", "wake")
        keys = {(s, qn, op): [f"sched:{{{s}-{qn}-{op}}}:" + k for k in names]
                for s in sides for qn in QUEUES for op in OPS}  # fmt: skip
        us: dict[Key, list[float]] = {}
        calls: dict[Key, list[float]] = {}
        cpu: dict[Key, list[float]] = {}
        idle = []
        for _ in range(50):
            a0, b0 = stats(c)[2], stats(c)[2]
            idle.append(b0 - a0)
        base = statistics.median(idle)

        def enqueue(k: Key, n: int) -> None:
            for b in range(0, n, 1000):
                m = min(1000, n - b)
                args = [str(m)] + [f for i in range(m) for f in job(i, k[1] == "flow")]
                c.evalsha(sha[k[0], "enqueue"], 5, *keys[k], *args)

        def settle(k: Key, pairs: list[tuple[str, str]]) -> None:
            s, _, op = k
            if op == "complete":
                triples = [v for i, t in pairs for v in (i, t, "null")]
                c.evalsha(sha[s, "complete"], 5, *keys[k], "1000", *triples)
                return
            retry = "1" if op == "fail_retry" else "0"
            p = c.pipeline(transaction=False)
            for i, t in pairs:
                p.evalsha(sha[s, "fail"], 5, *keys[k], i, t, retry, "E", "boom", "", "0.5", "0")
            p.execute()

        for k in keys:
            enqueue(k, a.backlog)
        order = list(keys)
        for _ in range(a.rounds):
            for k in random.sample(order, len(order)):
                nonce = secrets.token_hex(8)
                rep = c.evalsha(sha[k[0], "claim"], 5, *keys[k], "w", str(a.batch), "60000",
                                nonce, "100")  # fmt: skip
                n = int(rep[2])  # type: ignore[index]
                if not n:
                    continue
                w = claim_stride(rep, n)  # type: ignore[arg-type]
                pairs = [(rep[3 + w * j], rep[4 + w * j]) for j in range(n)]  # type: ignore[index]
                u0, c0, p0 = stats(c)
                settle(k, pairs)
                u1, c1, p1 = stats(c)
                key = (k[1], k[2], k[0])
                cpu.setdefault(key, []).append((p1 - p0 - base) / n)
                us.setdefault(key, []).append((u1 - u0) / n)
                calls.setdefault(key, []).append((c1 - c0) / n)
                if k[2] != "fail_retry":
                    enqueue(k, n)
    load = Path("/proc/loadavg").read_text().split()[:3]
    for qn in QUEUES:
        for op in OPS:
            bs, fs = us[qn, op, "before"], us[qn, op, "after"]
            m = min(len(bs), len(fs))
            cpus = {s: cpu[qn, op, s] for s in sides}
            row = {
                "bench": "flow_settle_cpu",
                "queue": qn,
                "op": f"{op}({a.batch})",
                "rounds": m,
                "before_us_per_job": round(statistics.median(bs), 2),
                "after_us_per_job": round(statistics.median(fs), 2),
                "paired_ratio": round(
                    statistics.median(y / x for x, y in zip(bs[:m], fs[:m], strict=True) if x > 0),
                    3,
                ),
                "cpu_us_per_job": {s: round(statistics.fmean(v), 2) for s, v in cpus.items()},
                "cpu_ratio": round(
                    statistics.fmean(cpus["after"]) / statistics.fmean(cpus["before"]), 3
                ),
                "cmds_per_job": {s: round(statistics.fmean(calls[qn, op, s]), 2) for s in sides},
                "loadavg": load,
            }
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
