"""How long one script holds the server when a parent of many waiting children ends (enqueue
after=): the longest single script of the parent's complete / fail / cancel and of the claims
that take the later steps (lua/lib/flow.lua FLOW_END_STEP), from SLOWLOG on a private server.
Redis runs one script at a time: every other client waits that long.

    .venv/bin/python bench/flow_fanout.py [--children 100000]

One run on this machine (2 cores, shared), 100k children, longest script: complete 2,367 ms
at 2f694b2 (before the bounded steps; run with PYTHONPATH on a worktree of it) against 14.4 ms
now, then 199 claim steps of at most 15.1 ms; fail 2,809 -> 15.1 (steps <= 24.7); cancel
2,906 -> 19.0 (steps <= 16.8)."""

from __future__ import annotations

import argparse
from typing import Any

from scheduler._spawn import RedisProcess, find_binary
from scheduler.client.queue import Queue
from scheduler.core.models import JobSpec


def _longest_us(client: Any) -> tuple[int, int]:
    """(longest script in the slow log, in us; how many entries) since the last reset."""
    entries = client.slowlog_get(100_000)

    def command(e: dict[str, Any]) -> str:  # redis-py leaves it bytes even when decoding
        c = e.get("command", b"")
        return (c.decode(errors="replace") if isinstance(c, bytes) else str(c)).upper()

    scripts = [e for e in entries if command(e).startswith("EVAL")]
    return max((int(e["duration"]) for e in scripts), default=0), len(scripts)


def run(how: str, children: int) -> str:
    server = RedisProcess(find_binary()).start()
    try:
        client = server.client(decode_responses=True)
        q = Queue(client, f"bench-fanout-{how}")
        parent = q.enqueue("parent", None)
        specs = [JobSpec("kid", i, after=[parent]) for i in range(children)]
        q.enqueue_many(specs, batch_size=5_000)
        (job,) = q.claim("w", limit=1).jobs
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        if how == "complete":
            q.complete(parent, job.token)
        elif how == "fail":
            q.fail(parent, job.token, ("E", "boom", ""), retryable=False)
        else:
            q.cancel(parent)
        ended_us, _ = _longest_us(client)
        client.slowlog_reset()
        steps = 0
        while client.exists(q.keys.prefix + "flow:ending"):  # (a key older versions lack)
            q.claim("w", limit=0)
            steps += 1
        step_us, _ = _longest_us(client)
        left = client.zcard(q.keys.flow_waiting)
        return (
            f"{how:8s} of a parent of {children:,} children: "
            f"its own script {ended_us / 1000:7.1f} ms, then {steps} claim steps, "
            f"the longest {step_us / 1000:5.1f} ms; {left} left waiting"
        )
    finally:
        server.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--children", type=int, default=100_000)
    args = ap.parse_args()
    for how in ("complete", "fail", "cancel"):
        print(run(how, args.children), flush=True)


if __name__ == "__main__":
    main()
