"""The worker's own per-job CPU, in process, no Redis (docs/performance.md section 12).

    PYTHONPATH=<tree> python bench/worker_hot_path.py [ROUNDS] [BATCHES]

Each of BATCHES claim replies of 100 jobs goes through parse_claim -> Worker._take (start,
handler dispatch) -> async handlers (one await of a future resolved by call_soon, standing for
the handler's Redis reply) -> _finish -> _completed(['done'] * n) (complete's bookkeeping, not
its send). Prints the CPU us per job (process_time), min over ROUNDS.

On a shared, noisy machine the time moves more than the changes; count instructions instead
(deterministic to ~0.1%): the difference of two runs is the per-job count, free of start-up:

    for b in 20 120; do PYTHONPATH=<tree> valgrind --tool=callgrind \\
        --callgrind-out-file=/tmp/cg.$b python bench/worker_hot_path.py 1 $b 2>&1 | grep Collected
    done        # (Ir(120) - Ir(20)) / 10,000 = instructions per job
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import redis.asyncio as aredis
import uvloop

from scheduler.core.claim_reply import parse_claim
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry

registry = Registry()
BATCH = 100


@registry.task("task")
async def task(payload: Any, ctx: Any) -> None:
    loop = asyncio.get_running_loop()
    reply = loop.create_future()
    loop.call_soon(reply.set_result, None)
    await reply


def reply(first: int) -> list[str]:
    """claim.lua's reply for BATCH due jobs."""
    out = ["1700000000000", "-1", str(BATCH)]
    for i in range(first, first + BATCH):
        payload = json.dumps({"i": i, "pad": "x" * 20})
        out += [f"j{i}", f"{i + 1}-abcdef", "1", "5", "task", payload, "1699999999990", "", "0"]
        out += ["", ""]  # schedule, start_by_ms
    return out


async def main(rounds: int, batches: int) -> list[float]:
    client = aredis.Redis(unix_socket_path="/nonexistent")  # never used: no call is sent
    w = Worker(client, registry, WorkerSettings(queues=("q",), concurrency=16))
    w._loop = asyncio.get_running_loop()
    per_job_us = []
    for rnd in range(rounds):
        replies = [reply((rnd * batches + b) * BATCH) for b in range(batches)]
        t0 = time.process_time()
        for raw in replies:
            w._take("q", parse_claim(raw), time.monotonic())
            while w.running or w._backlog:
                w._slot_free.clear()
                await w._slot_free.wait()
            done, w._completes = w._completes, []
            w._report.clear()
            w._completed(done, ["done"] * len(done))
        per_job_us.append((time.process_time() - t0) / (batches * BATCH) * 1e6)
    return per_job_us


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    r = uvloop.run(main(rounds, batches))
    print(f"{min(r):.2f} us/job (rounds {', '.join(f'{x:.2f}' for x in r)})")
