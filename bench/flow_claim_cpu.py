"""Redis CPU per claimed job, plain and flow, A/B on ONE private server, interleaved:

    git archive <old-commit> scheduler lua | tar -x -C /tmp/before
    .venv/bin/python bench/flow_claim_cpu.py --before /tmp/before --after .

Loads each checkout's expanded enqueue/claim/complete/release scripts (its
scheduler.core.scripts source(), in a subprocess under that checkout). Per side, four queues of
a --backlog of jobs due now:
  plain        no flow argument; claimed fresh (spec record only), completed, enqueued again
  plain_again  no flow argument; claimed, then released: every later claim reads a job hash
  flow         priority drawn from 0..9 and one concurrency key (limit 10,000, so none is held);
               claimed fresh, completed, enqueued again
  flow_again   the same flow, claimed and released (release moves them through flow_to_due)
Each round runs one claim(limit=--batch) of every (side, queue) in a shuffled order and reads
INFO around that one call (the release calls likewise): the server's main-thread CPU (less an
empty INFO-to-INFO interval: CPU spent, not wall time, so load on the machine hurts it least),
EVALSHA usec (the script's time, which on a loaded machine includes time the server was
descheduled) and the commands the script ran (Redis counts a script's redis.call()s too: exact,
load-free), each per job. Prints one JSON line per (queue, op): each side's median and p25
EVALSHA us/job and the median of the per-round after/before ratios, each side's mean CPU us/job
and their ratio, and each side's mean commands per job."""

from __future__ import annotations

import argparse
import json
import random
import re
import secrets
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import redis  # noqa: E402
from redis_server import private_server  # noqa: E402

PAYLOAD = '{"pad":"' + "x" * 64 + '"}'
NAMES = ("enqueue", "claim", "complete", "release")
DUMP = (
    "import json, sys; sys.path.insert(0, '.');"
    "from scheduler.core.scripts import source;"
    f"print(json.dumps({{n: source(n) for n in {NAMES!r}}}))"
)
QUEUES = ("plain", "plain_again", "flow", "flow_again")


def sources(checkout: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", DUMP], cwd=checkout, check=True,
                         capture_output=True, text=True)  # fmt: skip
    return dict(json.loads(out.stdout))


def job(i: int, flow: bool) -> list[str]:
    field = f"{random.randint(0, 9)}|tenant:1|10000||0|0|" if flow else ""
    return [f"j{i}-{secrets.token_hex(4)}", "t", PAYLOAD, "in", "0", "5",
            "1000,2.0,3600000,0.25", "0", "", "86400000", "", "", field]  # fmt: skip


def claim_stride(rep: list, n: int) -> int:  # type: ignore[type-arg]
    """Fields per job in a claim reply: 11 since start deadlines (the second job's token at
    4 + 11), 10 in the revisions before, which these A/B runs also load."""
    if n >= 2 and re.fullmatch(r"[0-9]+-[0-9A-Za-z]+", str(rep[4 + 11])):
        return 11
    return 10 if n >= 2 else 11


def stats(c: redis.Redis) -> tuple[int, int, float]:
    """(EVALSHA usec, commands run by scripts or clients less EVALSHA and INFO, the server's
    main-thread CPU in us) so far, from one INFO call."""
    cs = c.execute_command("INFO", "cpu", "commandstats")
    skip = ("cmdstat_evalsha", "cmdstat_info")
    calls = sum(
        int(v["calls"]) for k, v in cs.items() if k.startswith("cmdstat_") and k not in skip
    )
    cpu = (float(cs["used_cpu_user_main_thread"]) + float(cs["used_cpu_sys_main_thread"])) * 1e6
    return int(cs.get("cmdstat_evalsha", {}).get("usec", 0)), calls, cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=5000)
    a = ap.parse_args()
    sides = {"before": sources(a.before), "after": sources(a.after)}
    with private_server() as srv:
        c = redis.Redis.from_url(srv.url, decode_responses=True)
        sha = {(s, n): c.script_load(text) for s, src in sides.items() for n, text in src.items()}
        keys = {(s, qn): [f"sched:{{{s}-{qn}}}:" + k for k in ("", "due", "leased", "dead", "wake")]
                for s in sides for qn in QUEUES}  # fmt: skip
        us: dict[tuple[str, str, str], list[float]] = {}
        calls: dict[tuple[str, str, str], list[float]] = {}
        cpu: dict[tuple[str, str, str], list[float]] = {}
        # The main-thread CPU of one INFO-to-INFO interval with nothing in it, taken off each
        # measured call's interval.
        idle = []
        for _ in range(50):
            a0, b0 = stats(c)[2], stats(c)[2]
            idle.append(b0 - a0)
        base = statistics.median(idle)

        def enqueue(s: str, qn: str, n: int) -> None:
            for b in range(0, n, 1000):
                k = min(1000, n - b)
                args = [str(k)] + [f for i in range(k) for f in job(i, qn.startswith("flow"))]
                c.evalsha(sha[s, "enqueue"], 5, *keys[s, qn], *args)

        def timed(s: str, qn: str, op: str, *args: str) -> list[str]:
            u0, c0, p0 = stats(c)
            rep: list[str] = c.evalsha(sha[s, op], 5, *keys[s, qn], *args)  # type: ignore[assignment]
            n = int(rep[2]) if op == "claim" else len(args) // 2
            u1, c1, p1 = stats(c)
            cpu.setdefault((qn, op, s), []).append((p1 - p0 - base) / n if n else float("nan"))
            # A round whose claim leased nothing adds a 0 to both sides' pairing: skipped by n.
            us.setdefault((qn, op, s), []).append((u1 - u0) / n if n else float("nan"))
            calls.setdefault((qn, op, s), []).append((c1 - c0) / n if n else float("nan"))
            return rep

        for s in sides:
            for qn in QUEUES:
                enqueue(s, qn, a.backlog)
        order = [(s, qn) for s in sides for qn in QUEUES]
        for _ in range(a.rounds):
            for s, qn in random.sample(order, len(order)):
                nonce = secrets.token_hex(8)
                rep = timed(s, qn, "claim", "w", str(a.batch), "60000", nonce, "100")
                n = int(rep[2])
                w = claim_stride(rep, n)
                pairs = [(rep[3 + w * k], rep[4 + w * k]) for k in range(n)]
                if qn.endswith("_again"):
                    timed(s, qn, "release", *[v for p in pairs for v in p])
                else:
                    triples = [v for i, t in pairs for v in (i, t, "null")]
                    c.evalsha(sha[s, "complete"], 5, *keys[s, qn], "1000", *triples)
                    enqueue(s, qn, n)
    load = Path("/proc/loadavg").read_text().split()[:3]
    for qn in QUEUES:
        for op in ("claim", "release"):
            if (qn, op, "before") not in us:
                continue
            pairs = [(x, y) for x, y in zip(us[qn, op, "before"], us[qn, op, "after"], strict=True)
                     if x == x and y == y and x > 0]  # fmt: skip
            bs, fs = [x for x, _ in pairs], [y for _, y in pairs]
            row = {
                "bench": "flow_claim_cpu",
                "queue": qn,
                "op": f"{op}({a.batch})",
                "rounds": len(pairs),
                "before_us_per_job": round(statistics.median(bs), 2),
                "after_us_per_job": round(statistics.median(fs), 2),
                "before_p25": round(statistics.quantiles(bs, n=4)[0], 2),
                "after_p25": round(statistics.quantiles(fs, n=4)[0], 2),
                "paired_ratio": round(statistics.median(y / x for x, y in pairs), 3),
            }
            cmds = {s: round(statistics.fmean(v for v in calls[qn, op, s] if v == v), 2)
                    for s in sides}  # fmt: skip
            cpus = {s: [v for v in cpu[qn, op, s] if v == v] for s in sides}
            cpu_row = {
                "cpu_us_per_job": {s: round(statistics.fmean(v), 2) for s, v in cpus.items()},
                "cpu_ratio": round(
                    statistics.fmean(cpus["after"]) / statistics.fmean(cpus["before"]), 3
                ),
            }
            print(json.dumps({**row, **cpu_row, "cmds_per_job": cmds, "loadavg": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
