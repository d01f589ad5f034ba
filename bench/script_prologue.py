"""Server time of one EVALSHA: a trivial script, each transition's libs alone (its prologue:
the top-level locals and closures Redis runs on every call), a one-job enqueue cut after its
checks and whole, and huey's whole enqueue (one RPUSH of a 100-byte value) beside them.

    python bench/script_prologue.py [--n 3000] [--rounds 3]

On a private redis-server (unix socket); INFO commandstats' usec per call, the best of
--rounds rounds of --n calls each, so the client and its load do not enter. Prints one JSON
object (microseconds per call).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import common as c  # noqa: E402
import redis  # noqa: E402

from bench.redis_server import private_server  # noqa: E402
from scheduler import JobSpec  # noqa: E402
from scheduler.core.codec import enqueue_args  # noqa: E402
from scheduler.core.ids import new_job_id  # noqa: E402
from scheduler.core.scripts import source  # noqa: E402

# The first line of each transition's own body (its libs come before it): the storage
# generation check (lua/lib/util.lua newer_storage_err), which reads KEYS[1].
BODY_STARTS = dict.fromkeys(("enqueue", "claim", "complete"), "local newer = newer_storage_err")


# Where enqueue.lua's checks end and its reads and writes begin.
ENQUEUE_CHECKS_END = "-- Idempotency keys are read before any write too"


def best_us(
    r: redis.Redis, call: Callable[[int], object], n: int, rounds: int, cmd: str = "evalsha"
) -> float:
    best = float("inf")
    for _ in range(rounds):
        r.config_resetstat()
        for i in range(n):
            call(i)
        st = r.info("commandstats")[f"cmdstat_{cmd}"]
        best = min(best, st["usec"] / st["calls"])
    return round(best, 1)


def _no_keys(r: redis.Redis, sha: str) -> Callable[[int], object]:
    return lambda _i: r.evalsha(sha, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    out: dict[str, float] = {}
    with private_server() as srv:
        r = redis.Redis.from_url(srv.url)
        value = "x" * 100
        out["RPUSH (huey's enqueue)"] = best_us(
            r, lambda _i: r.rpush("huey", value), opts.n, opts.rounds, "rpush"
        )
        out["return 1"] = best_us(r, _no_keys(r, r.script_load("return 1")), opts.n, opts.rounds)
        for name, marker in BODY_STARTS.items():
            text = source(name)
            sha = r.script_load(text[: text.index(marker)] + "\nreturn 1\n")
            out[f"{name}: libs alone"] = best_us(r, _no_keys(r, sha), opts.n, opts.rounds)
        text = source("enqueue")
        checks = text[: text.index(ENQUEUE_CHECKS_END)] + "\nreturn 1\n"
        pre = "sched:{prologue}:"
        keys = [pre, pre + "due", pre + "leased", pre + "dead", pre + "wake"]
        cuts = (("enqueue: one job, checks only", checks), ("enqueue: one job", text))
        for label, script in cuts:
            sha = r.script_load(script)

            def one(i: int, sha: str = sha) -> object:
                spec = JobSpec("task", c.payload(i), job_id=new_job_id())
                return r.evalsha(sha, 5, *keys, *enqueue_args([spec], 1 << 19))

            out[label] = best_us(r, one, opts.n, opts.rounds)
    print(json.dumps({"n": opts.n, "rounds": opts.rounds, "us_per_call": out}, indent=1))


if __name__ == "__main__":
    main()
