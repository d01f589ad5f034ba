"""Server time per job of claim.lua and complete.lua, this checkout against another revision's.

    python bench/claim_ab.py --rev HEAD~1 [--n 20000] [--batch 100]

Two queues on one private redis-server are filled alike (this checkout's enqueue_many, the bench
payload); the revision's claim and complete scripts drain one, this checkout's the other, a
claim of --batch then the complete of what it took, in a shuffled order each round. Each call's
duration comes from SLOWLOG (threshold 0): the client and its load do not enter. Prints the
median and mean microseconds per job of each. Both sides read data this checkout wrote, so a
revision with another storage layout is not comparable here (bench/profile_drain.py
transitions is, through each tree's own public API).
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.flow_claim_cpu import claim_stride  # noqa: E402
from bench.redis_server import private_server  # noqa: E402
from scheduler import JobSpec, Queue  # noqa: E402
from scheduler.core import codec  # noqa: E402
from scheduler.core import scripts as S  # noqa: E402
from scheduler.core.lua_prune import prune  # noqa: E402

NAMES = ("claim", "complete")


def texts_at(rev: str) -> dict[str, str]:
    tmp = Path(tempfile.mkdtemp())
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "lua"], capture_output=True)
    tar.check_returncode()
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar.stdout, check=True)
    has_prune = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:scheduler/core/lua_prune.py"],
        capture_output=True,
    )
    out = {}
    for name in NAMES:
        text = S._expand(tmp / "lua", f"{name}.lua", set(), (f"{name}.lua",), "server")
        out[name] = prune(text) if has_prune.returncode == 0 else text
    return out


def call_us(r: redis.Redis, sha: str, keys: list[str], args: list[object]) -> tuple[float, object]:
    r.slowlog_reset()
    reply = r.evalsha(sha, len(keys), *keys, *args)
    calls = [e for e in r.slowlog_get(16) if "EVALSHA" in str(e["command"]).upper()]
    return float(calls[0]["duration"]), reply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=100)
    a = ap.parse_args()
    sides = {a.rev: texts_at(a.rev), "checkout": {n: S.source(n) for n in NAMES}}
    per: dict[str, list[float]] = {f"{s} {n}": [] for s in sides for n in NAMES}
    with private_server() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        sha = {s: {n: r.script_load(t) for n, t in texts.items()} for s, texts in sides.items()}
        queues = {s: Queue(r, f"ab{i}") for i, s in enumerate(sides)}
        for q in queues.values():
            q.enqueue_many([JobSpec("task", {"i": i, "pad": "x" * 60}) for i in range(a.n)])
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 128)
        for _ in range(a.n // a.batch):
            order = list(sides)
            random.shuffle(order)
            for s in order:
                k = queues[s].keys
                keys = [k.prefix, k.due, k.leased, k.dead, k.wake]
                us, rep = call_us(r, sha[s]["claim"], keys,
                                  ["ab", a.batch, 60_000, secrets.token_hex(8), 1000])  # fmt: skip
                assert isinstance(rep, list)
                n = int(rep[2])
                if n == 0:
                    continue
                per[f"{s} claim"].append(us / n)
                w = claim_stride(rep, n)  # 11 since start deadlines, 10 in older revisions
                jobs = [(rep[3 + i * w], rep[4 + i * w], None) for i in range(n)]
                us, _ = call_us(r, sha[s]["complete"], keys,
                                codec.complete_args(jobs, 3_600_000, 1 << 20))  # fmt: skip
                per[f"{s} complete"].append(us / n)
    out = {k: {"median_us_per_job": round(statistics.median(v), 2),
               "mean": round(statistics.mean(v), 2)} for k, v in per.items()}  # fmt: skip
    print(json.dumps({"n": a.n, "batch": a.batch, "per_job": out}))


if __name__ == "__main__":
    main()
