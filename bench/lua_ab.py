"""Server time of one enqueue call, this checkout's Lua against another revision's, on one server.

    python bench/lua_ab.py --rev HEAD~1 [--batch 1000] [--rounds 40] [--delay-ms 60000]

Both texts of enqueue.lua, each as its revision sends it (expanded; pruned from the commit that
added scheduler/core/lua_prune.py on; the old one from `git archive <rev> lua`), are loaded into
one private redis-server and called alternately, in a shuffled order each round, with the same
kind of arguments (fresh ids: the bench payload). Each call's own duration comes from SLOWLOG
(threshold 0), so the client, the socket and the client side's load do not enter. Prints the
median and mean microseconds per job of each. Redis CPU contention still moves both alike.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.redis_server import private_server  # noqa: E402
from scheduler import JobSpec  # noqa: E402
from scheduler.core import codec  # noqa: E402
from scheduler.core import scripts as S  # noqa: E402
from scheduler.core.lua_prune import prune  # noqa: E402

KEYS = ["sched:{ab}:", "sched:{ab}:due", "sched:{ab}:leased", "sched:{ab}:dead", "sched:{ab}:wake"]


def text_at(rev: str) -> str:
    tmp = Path(tempfile.mkdtemp())
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "lua"], capture_output=True)
    tar.check_returncode()
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar.stdout, check=True)
    text = S._expand(tmp / "lua", "enqueue.lua", set(), ("enqueue.lua",), "server")
    # As that revision sent it: pruned only from the commit that brought lua_prune in.
    has_prune = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:scheduler/core/lua_prune.py"],
        capture_output=True,
    )
    return prune(text) if has_prune.returncode == 0 else text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True, help="the revision to compare with (git)")
    ap.add_argument("--batch", type=int, default=1000, help="jobs per call")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--delay-ms", type=int, default=None, help="each job's delay (default none)")
    a = ap.parse_args()
    texts = {a.rev: text_at(a.rev), "checkout": S.source("enqueue")}
    per_job: dict[str, list[float]] = {k: [] for k in texts}
    with private_server() as server:
        r = redis.Redis.from_url(server.url)
        sha = {k: r.script_load(t) for k, t in texts.items()}
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 128)
        for _ in range(a.rounds):
            order = list(texts)
            random.shuffle(order)
            for which in order:
                specs = [
                    JobSpec("task", {"i": i, "pad": "x" * 60}, delay_ms=a.delay_ms)
                    for i in range(a.batch)
                ]
                args = codec.enqueue_args(specs, 1 << 20)
                r.slowlog_reset()
                r.evalsha(sha[which], len(KEYS), *KEYS, *args)
                calls = [e for e in r.slowlog_get(16) if e["command"].startswith(b"EVALSHA")]
                per_job[which].append(calls[0]["duration"] / a.batch)
    out = {
        k: {"median_us_per_job": round(statistics.median(v), 2),
            "mean": round(statistics.mean(v), 2)}
        for k, v in per_job.items()
    }  # fmt: skip
    head = {"batch": a.batch, "delay_ms": a.delay_ms, "rounds": a.rounds}
    print(json.dumps({**head, "per_job": out}))


if __name__ == "__main__":
    main()
