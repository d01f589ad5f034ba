"""bullmq-node driver: the real BullMQ (Node.js) through ``driver.mjs`` beside this file.

Node does only what the library does (``Queue.add``, ``Queue.addBulk``, a ``Worker``, the handler
work); counting, lateness and memory are measured here with bench/common.py, as for every other
system. ``bench/run.py`` runs ``npm ci`` here first (node_modules is gitignored).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import common as c

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "driver.mjs"
# BullMQ's default is 1; 10 is the concurrency class of the table and of bullmq-py.
CONCURRENCY = 10


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH")
    return node


def _call(cmd: str, args: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    if not (HERE / "node_modules" / "bullmq").exists():
        raise RuntimeError(f"run `npm ci` in {HERE} first (bench/run.py does)")
    res = subprocess.run(
        [_node(), str(SCRIPT), cmd, json.dumps(args)],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if res.returncode != 0:
        tail = " | ".join(res.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"node {cmd} exited {res.returncode}: {tail}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def meta() -> dict[str, Any]:
    v = _call("version", {})
    return {
        "version": v["bullmq"],
        "node": v["node"],
        "settings": {
            "enqueue": "await queue.add('task', payload) (ioredis, one connection)",
            "bulk": "await queue.addBulk([...]) (one MULTI)",
            "worker": f"new Worker(queue, processor, {{concurrency: {CONCURRENCY}}}), one node "
            "process; handler awaits INCR (and RPUSH for timed jobs) on its own ioredis client",
            "scheduler": "queue.addBulk(..., opts: {delay: ms})",
            "concurrency": CONCURRENCY,
            "msgpackr-extract": "not built (npm install scripts off): msgpackr's JS path",
        },
    }


def enqueue_single(url: str, n: int) -> float:
    return float(_call("enqueue_single", {"url": url, "n": n})["seconds"])


def enqueue_bulk(url: str, n: int) -> float:
    return float(_call("enqueue_bulk", {"url": url, "n": n})["seconds"])


def pending(url: str, n: int, due_s: float = 0.0, first: int = 0) -> None:
    _call("pending", {"url": url, "n": n, "due_s": due_s, "first": first})


def _worker_cmd(url: str, concurrency: int | None) -> list[str]:
    args = {"url": url, "concurrency": concurrency or CONCURRENCY}
    return [_node(), str(SCRIPT), "worker", json.dumps(args)]


def drain(url: str, n: int, concurrency: int | None) -> float:
    pending(url, n)
    r = c.client(url)
    with c.running("bullmq-node-drain", _worker_cmd(url, concurrency), url) as proc:
        return c.drain_rate(n, *c.wait_count(r, n, 30 + n / 50, proc))


def simultaneous(url: str, n: int, delay_s: float) -> list[float]:
    r = c.client(url)
    with c.running("bullmq-node-sched", _worker_cmd(url, None), url) as proc:
        c.wait_ready(r, lambda: pending(url, 1, first=-1), proc, "bullmq-node-sched")
        due = c.due_in(delay_s)
        pending(url, n, due_s=due)
        return c.collect_lateness(r, n, due, c.lateness_timeout(delay_s, n), proc)
