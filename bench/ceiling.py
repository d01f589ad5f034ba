"""The "ceiling loop": the least work a Lua-claiming Redis scheduler must do per job.

    python bench/ceiling.py '<json args: {"url": ..., "n": ...}>'

Preloads n ids into a due ZSET, then loops: one EVALSHA moves up to 100 due ids to a leased
ZSET and returns them, then one pipeline sends ZREM leased <id> per id (the "complete" step).
Prints one JSON line: {"n", "seconds", "jobs_per_s"}. Needs only redis-py.
"""

from __future__ import annotations

import json
import sys
import time
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


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    print(json.dumps(loop(a["url"], int(a["n"]))))
