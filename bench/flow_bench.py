"""The cost of flow control (docs/flow-control.md), every case in one run on one private server.

    .venv/bin/python bench/flow_bench.py [--jobs 10000] [--batch 100]

Cases, each in a fresh queue with `--jobs` jobs all due now, drained by one client stepping
`claim(limit=batch)` + `complete_many` (each claim timed), the cases' steps interleaved in a
shuffled order so machine load hits them alike:
  plain       no flow argument (the plain path)
  priorities  priority drawn from 0..9
  keys        every job its own concurrency key (10,000 distinct keys at the default), limit 1
  hot_cold    half the jobs on one hot key (limit 2) enqueued first, then half on distinct cold
              keys: without head-of-line blocking the first claim is a full batch
and `starvation` (test clock, deterministic): a priority-9 flood that fills every batch, with a
few priority-0 jobs; the longest wait of a priority-0 job with priority_aging_ms = --aging-ms,
and with aging in effect off. `--cases plain` runs the plain case alone (an A/B against an
older checkout: see bench/README.md --ours-src).
Prints one JSON line per case and a last line with the ratios to plain (same run)."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import redis  # noqa: E402
from redis_server import private_server  # noqa: E402

from scheduler import Queue  # noqa: E402

PAYLOAD = {"pad": "x" * 64}


class Drain:
    """One case's queue, drained one claim(limit=batch) + complete_many step at a time, so
    the cases can be interleaved: a loaded machine then slows every case alike."""

    def __init__(self, name: str, q: Queue, jobs: int, batch: int, watch: set[str]) -> None:
        self.name, self.q, self.jobs, self.batch, self.watch = name, q, jobs, batch, watch
        self.times_ms: list[float] = []
        self.sizes: list[int] = []
        self.busy_s = 0.0
        self.watched_done_at: int | None = None
        self.done = False

    def step(self) -> None:
        t0 = time.perf_counter()
        b = self.q.claim("bench", limit=self.batch, lease_ms=60_000)
        t1 = time.perf_counter()
        if b.jobs:
            self.q.complete_many([(j.id, j.token, None) for j in b.jobs])
        self.busy_s += time.perf_counter() - t0
        if not b.jobs:
            self.done = True
            return
        self.times_ms.append((t1 - t0) * 1000)
        self.sizes.append(len(b.jobs))
        if self.watch:
            self.watch.difference_update(j.id for j in b.jobs)
            if not self.watch:
                self.watched_done_at = len(self.sizes)

    def row(self) -> dict[str, Any]:
        times = sorted(self.times_ms)
        out = {
            "bench": "flow",
            "case": self.name,
            "jobs": self.jobs,
            "batch": self.batch,
            "claims": len(self.sizes),
            "first_batch": self.sizes[0] if self.sizes else 0,
            "claim_p50_ms": round(statistics.median(times), 3),
            "claim_p99_ms": round(times[max(int(len(times) * 0.99) - 1, 0)], 3),
            "drain_s": round(self.busy_s, 3),
            "jobs_per_s": round(sum(self.sizes) / self.busy_s),
        }
        if self.name == "hot_cold":
            # The hot key drains 2 per claim (one client, K=2): the whole drain is long by
            # design; claims_until_cold_done is how long the cold keys waited (their own
            # drain is jobs/2 / (batch - 2) claims of it).
            out["claims_until_cold_done"] = self.watched_done_at
        return out


def case(url: str, name: str, jobs: int, batch: int) -> Drain:
    q = Queue.from_url(url, "flow-" + name, result_ttl_ms=1_000)
    rnd = random.Random(7)
    cold: set[str] = set()
    for i in range(jobs):  # one by one: an older JobSpec has no flow fields (the plain A/B)
        if name == "plain":
            kw: dict[str, Any] = {}
        elif name == "priorities":
            kw = {"priority": rnd.randint(0, 9)}
        elif name == "keys":
            kw = {"concurrency_key": f"k{i}", "concurrency_limit": 1}
        elif i < jobs // 2:  # hot_cold: the hot key first
            kw = {"concurrency_key": "hot", "concurrency_limit": 2}
        else:
            kw = {"concurrency_key": f"cold{i}", "concurrency_limit": 1}
        jid = q.enqueue("t", PAYLOAD, **kw)
        if i >= jobs // 2 and name == "hot_cold":
            cold.add(jid)
    return Drain(name, q, jobs, batch, cold)


def starvation(url: str, aging_ms: int) -> dict[str, Any]:
    """Per 50 ms tick: 10 priority-9 jobs arrive and one claim of 10 runs, so the flood alone
    fills every batch; a priority-0 job arrives every 10 ticks (300 of the 400). Its wait is
    claim time - run_at on the server's (test) clock."""
    client = redis.Redis.from_url(url, decode_responses=True)
    q = Queue(client, f"flow-starve-{aging_ms}", _clock="test", result_ttl_ms=1_000)
    now = 1_000_000
    client.set(q.keys.test_clock, now)
    client.hset(q.keys.config, "priority_aging_ms", aging_ms)
    low: dict[str, int] = {}
    waits: list[int] = []
    for tick in range(400):
        for _ in range(10):
            q.enqueue("hi", PAYLOAD, priority=9)
        if tick % 10 == 0 and tick < 300:
            low[q.enqueue("lo", PAYLOAD)] = now
        b = q.claim("bench", limit=10, lease_ms=60_000)
        for j in b.jobs:
            if j.id in low:
                waits.append(now - low.pop(j.id))
        q.complete_many([(j.id, j.token, None) for j in b.jobs])
        now += 50
        client.set(q.keys.test_clock, now)
    return {
        "bench": "flow",
        "case": "starvation",
        "priority_aging_ms": aging_ms,
        "low_served": len(waits),
        "low_never_served": len(low),
        "low_wait_max_ms": max(waits) if waits else None,
        "low_wait_p50_ms": statistics.median(waits) if waits else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--aging-ms", type=int, default=2_000)
    ap.add_argument("--cases", default="plain,priorities,keys,hot_cold,starvation")
    a = ap.parse_args()
    cases = a.cases.split(",")
    rows: dict[str, dict[str, Any]] = {}
    with private_server() as srv:
        drains = [
            case(srv.url, n, a.jobs, a.batch)
            for n in ("plain", "priorities", "keys", "hot_cold")
            if n in cases
        ]
        rnd = random.Random(11)
        while not all(d.done for d in drains):
            for d in rnd.sample(drains, len(drains)):  # interleaved, in a shuffled order
                if not d.done:
                    d.step()
        for d in drains:
            rows[d.name] = d.row()
            print(json.dumps(rows[d.name]), flush=True)
        if "starvation" in cases:
            for aging in (a.aging_ms, 10**9):  # with the aging rule, and (in effect) without
                print(json.dumps(starvation(srv.url, aging)), flush=True)
    if "plain" not in rows:
        return 0
    plain = rows["plain"]
    ratios = {
        f"{n}_over_plain": {
            "claim_p50": round(r["claim_p50_ms"] / plain["claim_p50_ms"], 2),
            "drain": round(r["drain_s"] / plain["drain_s"], 2),
        }
        for n, r in rows.items()
        if n != "plain"
    }
    print(json.dumps({"bench": "flow_ratio", **ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
