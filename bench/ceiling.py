"""Reference models on the same server: the least work a Redis scheduler must do per job.

    python bench/ceiling.py '<json args: {"url": ..., "n": ..., "mode": "claim" | "enqueue"}>'

mode "claim" (the "ceiling loop", default): preloads n ids into a due ZSET, then loops: one
EVALSHA moves up to 100 due ids to a leased ZSET and returns them, then one pipeline sends
ZREM leased <id> per id (the "complete" step).

mode "enqueue" (the "pipelined enqueue model", the reference for bulk enqueue): builds n jobs in
Python (id, the common JSON payload) and sends, per job, HSET job:<id> payload <json> state
queued + ZADD due <now> <id>, one pipeline execute per 1,000 jobs (timed: build + send).
It stores less than any real scheduler does, so it is an upper bound for a Python client.

Prints one JSON line: {"n", "seconds", "jobs_per_s", ...}. Needs only redis-py.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import redis

DUE = "ceil:due"
LEASED = "ceil:leased"
BATCH = 100

CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids == 0 then return ids end
redis.call('ZREM', KEYS[1], unpack(ids))
local args = {}
for i, id in ipairs(ids) do
  args[2 * i - 1] = ARGV[3]
  args[2 * i] = id
end
redis.call('ZADD', KEYS[2], unpack(args))
return ids
"""


def loop(url: str, n: int) -> dict[str, Any]:
    if ":6379" in url:
        raise RuntimeError("refusing to touch the shared server")
    r = redis.Redis.from_url(url)
    r.delete(DUE, LEASED)
    with r.pipeline(transaction=False) as pipe:
        for start in range(0, n, 1000):
            pipe.zadd(DUE, {f"job:{i}": 0 for i in range(start, min(n, start + 1000))})
        pipe.execute()
    claim = r.register_script(CLAIM)
    done = 0
    deadline = time.monotonic() + 120
    t0 = time.perf_counter()
    while time.monotonic() < deadline:
        now = time.time()
        ids = claim(keys=[DUE, LEASED], args=[now, BATCH, now + 30])
        if not ids:
            break
        with r.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.zrem(LEASED, job_id)
            pipe.execute()
        done += len(ids)
    seconds = time.perf_counter() - t0
    r.delete(DUE, LEASED)
    return {
        "n": n,
        "done": done,
        "seconds": seconds,
        "jobs_per_s": done / seconds,
        "redis_py": redis.__version__,
        "batch": BATCH,
    }


ENQ_DUE = "ceil:enq:due"
PAD = "x" * 64  # as bench/common.payload


def enqueue_model(url: str, n: int) -> dict[str, Any]:
    if ":6379" in url:
        raise RuntimeError("refusing to touch the shared server")
    r = redis.Redis.from_url(url)
    r.flushdb()
    t0 = time.perf_counter()
    now = time.time()
    with r.pipeline(transaction=False) as pipe:
        for i in range(n):
            job_id = uuid.uuid4().hex
            data = json.dumps({"i": i, "t": 0, "pad": PAD})
            pipe.hset(f"ceil:job:{job_id}", mapping={"payload": data, "state": "queued"})
            pipe.zadd(ENQ_DUE, {job_id: now})
            if (i + 1) % 1000 == 0:
                pipe.execute()
        pipe.execute()
    seconds = time.perf_counter() - t0
    stored = int(r.zcard(ENQ_DUE))
    r.flushdb()
    return {
        "n": n,
        "stored": stored,
        "seconds": seconds,
        "jobs_per_s": n / seconds,
        "redis_py": redis.__version__,
        "model": "per job HSET(payload, state) + ZADD, pipelines of 1,000 jobs",
    }


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    if a.get("mode", "claim") == "enqueue":
        print(json.dumps(enqueue_model(a["url"], int(a["n"]))))
    else:
        print(json.dumps(loop(a["url"], int(a["n"]))))
