"""Recurring schedules at scale, on a private redis-server (never the shared one).

    .venv/bin/python bench/schedules_scale.py --schedules 10000 [--workers 1] [--minutes 2]
        [--phases define,fire,outage,failing] [--outage-schedules 10000] [--outage-min 60]

Half the schedules are cron "* * * * *", half every_ms=60000: all fire at each minute boundary.
Phases (printed as JSON lines):
- define: the API cost of creating N schedules one schedule() call each, of the same N calls
  again (a deploy's sync: 'unchanged'), of redefining all (payload changed: 'updated'), of
  removing and adding back a tenth; Redis memory per schedule (used_memory growth / N).
- fire: `--workers` real `scheduler worker` processes (no-op handler that stamps its start)
  over `--minutes` boundaries; right after the second boundary every schedule is redefined
  (the deploy case: occurrences due and waiting). Lateness = handler start - run_at; the ids
  run are compared with the expected set (each schedule, each boundary): duplicates, missing
  and unexpected ids; SLOWLOG (threshold 1 ms) and commandstats for script time.
- outage: a test clock (scripts read a key, not TIME) and an in-process claim loop (limit
  100): the clock jumps `--outage-min` minutes; how many runs, misfire skips, claims and
  seconds of real script time the catch-up takes, and whether the next minute is normal. A
  tenth of the schedules use catch_up:3, the rest run_once.
- failing: 50 healthy every-1 s schedules, one whose handler always raises, one whose task no
  worker knows, and 50 plain jobs/s, one worker, 20 s: lateness of the healthy runs and of the
  plain jobs, and how many runs went missing.
The figures of 2026-12-04 are in docs/performance.md section 32 (one worker: 10,000 runs at
one instant all started within 0.9 s, 100,000 within 6-8 s; no run doubled or missing).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

from redis_server import private_server  # noqa: E402

from scheduler import Queue  # noqa: E402
from scheduler.core.scripts import TRANSITIONS, Scripts  # noqa: E402

MIN_MS = 60_000
STAMPS = "ss:starts"
REGISTRY = "schedules_scale_tasks:registry"
TASKS = """
import asyncio, os, time
import redis
from scheduler.worker.registry import Registry
registry = Registry()
_r = None
_stamps = []

def _flush():
    global _r
    if _r is None:
        _r = redis.Redis.from_url(os.environ["SS_URL"])
    if _stamps:
        _r.rpush("ss:starts", *_stamps)
        _stamps.clear()

def _stamp(ctx):
    # Buffered and pushed in batches: a blocking push per job would delay the later starts.
    _stamps.append(f"{ctx.job_id}|{time.time() * 1000:.0f}")
    if len(_stamps) == 1:
        asyncio.get_running_loop().call_later(0.05, _flush)
    elif len(_stamps) >= 500:
        _flush()

@registry.task(name="t")
async def t(payload, ctx):
    _stamp(ctx)

@registry.task(name="plain")
async def plain(payload, ctx):
    _stamp(ctx)

@registry.task(name="boom")
async def boom(payload, ctx):
    raise RuntimeError("always fails")
"""


def pct(xs: list[int], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def spread(xs: list[int]) -> dict[str, Any]:
    return {"p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs, default=None)}


def slot_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def misfire_skips(r: redis.Redis, q: Queue) -> int:
    return sum(int(r.hget(k, "misfire_skip") or 0) for k in r.scan_iter(q.keys.prefix + "stats:*"))


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def used(r: redis.Redis) -> int:
    info: dict[str, Any] = r.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


def spec(i: int) -> dict[str, Any]:
    return {"cron": "* * * * *"} if i % 2 else {"every_ms": MIN_MS}


def define_all(q: Queue, n: int, payload: Any) -> tuple[float, collections.Counter[str]]:
    statuses: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    for i in range(n):
        statuses[q.schedule(f"s{i:06d}", "t", payload, **spec(i))] += 1
    return time.perf_counter() - t0, statuses


def phase_define(r: redis.Redis, q: Queue, n: int) -> None:
    base = used(r)
    took, st = define_all(q, n, {"v": 1})
    grew = used(r) - base
    one = "s000001"
    pending = str(r.hget(q.keys.schedule(one), "pending"))
    sample = {
        "schedule_hash": r.memory_usage(q.keys.schedule(one)),
        "cron_slots_zset": r.memory_usage(q.keys.schedule_slots(one)),
        "pending_job_hash": r.memory_usage(q.keys.job(pending)),
    }
    again, st2 = define_all(q, n, {"v": 1})
    redo, st3 = define_all(q, n, {"v": 2})
    t0 = time.perf_counter()
    for i in range(0, n, 10):
        q.remove_schedule(f"s{i:06d}")
    removed = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, n, 10):
        q.schedule(f"s{i:06d}", "t", {"v": 2}, **spec(i))
    readded = time.perf_counter() - t0
    emit({"phase": "define", "schedules": n, "create_s": round(took, 2),
          "create_us_each": round(took / n * 1e6), "created": dict(st),
          "sync_unchanged_s": round(again, 2), "unchanged": dict(st2),
          "redefine_s": round(redo, 2), "redefined": dict(st3),
          "remove_tenth_s": round(removed, 2), "readd_tenth_s": round(readded, 2),
          "bytes_per_schedule": round(grew / n), "memory_usage_sample": sample,
          "due": r.zcard(q.keys.due)})  # fmt: skip


def worker(url: str, queue: str, tmp: str, tag: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SS_URL=url, PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]))
    exe = str(Path(sys.executable).parent / "scheduler")
    return subprocess.Popen(
        [exe, "worker", REGISTRY, "--url", url, "--queue", queue, "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, f"w{tag}.log"), "ab"),
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stamps(r: redis.Redis) -> list[tuple[str, int]]:
    out = []
    for raw in r.lrange(STAMPS, 0, -1):
        job_id, at = str(raw).rsplit("|", 1)
        out.append((job_id, int(at)))
    return out


def script_time(r: redis.Redis) -> dict[str, Any]:
    """The longest script calls from SLOWLOG (by script name) and evalsha's mean."""
    names = {sha: name for name, sha in Scripts(clock="server").sha.items() if name in TRANSITIONS}
    longest: dict[str, int] = {}
    over: collections.Counter[str] = collections.Counter()
    for e in r.slowlog_get(100_000):
        if str(e.get("client_address", "")).startswith("?"):
            continue  # a command inside a script (Redis 7 logs those too): its script counts
        raw = e["command"]
        cmd = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).split()
        name = names.get(cmd[1], f"sha:{cmd[1][:8]}") if cmd[0].upper() == "EVALSHA" else cmd[0]
        longest[name] = max(longest.get(name, 0), int(e["duration"]))
        over[name] += 1
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return {"slowlog_over_1ms": dict(over), "slowlog_max_us": longest,
            "evalsha_calls": stats.get("calls"),
            "evalsha_us_per_call": stats.get("usec_per_call")}  # fmt: skip


def wait_boundary(k: int) -> int:
    """Sleep until the k-th minute boundary from now (k >= 1); returns it in ms."""
    b = (int(time.time() * 1000) // MIN_MS + k) * MIN_MS
    time.sleep(max(b / 1000 - time.time(), 0))
    return b


def phase_fire(url: str, r: redis.Redis, q: Queue, n: int, workers: int, minutes: int) -> None:
    r.delete(STAMPS)
    r.config_set("slowlog-log-slower-than", 1000)
    r.config_set("slowlog-max-len", 100_000)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        Path(tmp, "schedules_scale_tasks.py").write_text(TASKS)
        procs = [worker(url, q.name, tmp, str(k)) for k in range(workers)]
        # Slots that passed while defining run first (late, under the misfire policy): the
        # window starts at the first boundary after they are done.
        deadline = time.time() + 300
        while (q.counts().due or r.zcard(q.keys.leased)) and time.time() < deadline:
            time.sleep(0.5)
        first = (int(time.time() * 1000) // MIN_MS + 1) * MIN_MS
        r.delete(STAMPS)
        skips_before = misfire_skips(r, q)
        r.slowlog_reset()
        r.config_resetstat()
        redefine: dict[str, Any] = {}
        try:
            for m in range(minutes):
                wait_boundary(1)
                if m == 1:  # the deploy case: due occurrences waiting while all are redefined
                    took, st = define_all(q, n, {"v": 3})
                    redefine = {"redefine_at_boundary_s": round(took, 2), "statuses": dict(st)}
            # The window ends at the last boundary passed (a long redefinition passes another).
            last = int(time.time() * 1000) // MIN_MS * MIN_MS
            boundaries = (last - first) // MIN_MS + 1
            deadline = time.time() + 55
            while r.llen(STAMPS) < n * boundaries and time.time() < deadline:
                time.sleep(0.2)
            time.sleep(1)
        finally:
            for p in procs:
                stop(p)
    runs = stamps(r)
    count = collections.Counter(job_id for job_id, _ in runs)
    expected = {
        f"schedule:s{i:06d}:{slot}" for i in range(n) for slot in range(first, last + 1, MIN_MS)
    }
    late = [at - int(job_id.rsplit(":", 1)[1]) for job_id, at in runs if job_id in expected]
    first_start: dict[str, int] = {}
    for job_id, at in runs:
        first_start.setdefault(job_id, at)
    per_boundary = {}
    for slot in range(first, last + 1, MIN_MS):
        ends = [at for job_id, at in first_start.items() if job_id.endswith(f":{slot}")]
        per_boundary[str(slot)] = round((max(ends) - slot) / 1000, 2) if ends else None
    skips = misfire_skips(r, q) - skips_before
    emit({"phase": "fire", "schedules": n, "workers": workers, "boundaries": boundaries,
          "runs": len(runs), "expected": len(expected),
          "duplicates": sum(1 for c in count.values() if c > 1),
          "missing": len(expected - count.keys()),
          # Slots before the window: defined before the workers started, run late at their start.
          "before_window": sum(1 for i in count if slot_of(i) < first),
          "unexpected": sum(1 for i in count.keys() - expected if first <= slot_of(i) <= last),
          "misfire_skips": skips,
          "late_ms": spread(late),
          "last_start_after_boundary_s": per_boundary, **redefine, **script_time(r)})  # fmt: skip


def drain(q: Queue, r: redis.Redis, now: int) -> tuple[collections.Counter[str], int, float]:
    r.set(q.keys.test_clock, now)
    ran: collections.Counter[str] = collections.Counter()
    claims = 0
    t0 = time.perf_counter()
    while True:
        b = q.claim("w", limit=100, lease_ms=3_600_000)
        claims += 1
        for j in b.jobs:
            ran[j.id] += 1
        if b.jobs:
            q.complete_many([(j.id, j.token, None) for j in b.jobs])
        if len(b.jobs) < 100 and not (0 <= b.next_ms <= now):
            return ran, claims, time.perf_counter() - t0


def phase_outage(r: redis.Redis, n: int, outage_min: int) -> None:
    q = Queue(r, "ss-outage", _clock="test")
    t0 = 1_000_000 * MIN_MS
    r.set(q.keys.test_clock, t0)
    for i in range(n):
        misfire = "catch_up:3" if i % 10 == 0 else "run_once"
        q.schedule(f"o{i:06d}", "t", misfire=misfire, **spec(i))
    ran, _, _ = drain(q, r, t0 + MIN_MS + 1_000)
    back = t0 + (1 + outage_min) * MIN_MS + 1_000
    ran, claims, took = drain(q, r, back)
    per = collections.Counter(job_id.rsplit(":", 1)[0] for job_id in ran)
    skips = misfire_skips(r, q)
    starved = r.scard(q.keys.schedules_refill)
    nxt, _, took_next = drain(q, r, back + MIN_MS)
    emit({"phase": "outage", "schedules": n, "outage_min": outage_min, "runs": len(ran),
          "most_runs_one_schedule": max(per.values(), default=0),
          "schedules_run": len(per), "misfire_skips": skips, "claims": claims,
          "catch_up_s": round(took, 2), "refill_pending_after": starved,
          "next_minute_runs": len(nxt), "next_minute_s": round(took_next, 2)})  # fmt: skip


def phase_failing(url: str, r: redis.Redis, seconds: int) -> None:
    q = Queue(r, "ss-fail")
    r.delete(STAMPS)
    healthy = 50
    for i in range(healthy):
        q.schedule(f"h{i:03d}", "t", every_ms=1_000)
    q.schedule("boom", "boom", every_ms=1_000, max_attempts=3)
    q.schedule("ghost", "no.such.task", every_ms=1_000, max_attempts=3)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        Path(tmp, "schedules_scale_tasks.py").write_text(TASKS)
        proc = worker(url, q.name, tmp, "f")
        try:
            time.sleep(2)
            start = int(time.time() * 1000)
            plain_at: dict[str, int] = {}
            end = time.time() + seconds
            while time.time() < end:
                job_id = q.enqueue("plain", None)
                plain_at[job_id] = int(time.time() * 1000)
                time.sleep(0.02)
            stop_ms = int(time.time() * 1000)
            time.sleep(3)
        finally:
            stop(proc)
    runs = stamps(r)
    sched_late = [
        at - int(i.rsplit(":", 1)[1])
        for i, at in runs
        if i.startswith("schedule:h") and at >= start
    ]
    plain_late = [at - plain_at[i] for i, at in runs if i in plain_at]
    ran = {i for i, _ in runs}
    missing = [
        f"schedule:h{i:03d}:{slot}"
        for i in range(healthy)
        for slot in range((start // 1000 + 1) * 1000, stop_ms - 1000, 1_000)
        if f"schedule:h{i:03d}:{slot}" not in ran
    ]
    emit({"phase": "failing", "seconds": seconds,
          "healthy_runs": len(sched_late), "healthy_missing": len(missing),
          "healthy_late_ms": spread(sched_late),
          "plain_jobs": len(plain_at), "plain_run": len(plain_late),
          "plain_late_ms": spread(plain_late),
          "dead": len(q.dead_ids())})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--minutes", type=int, default=2)
    ap.add_argument("--phases", default="define,fire,outage,failing")
    ap.add_argument("--outage-schedules", type=int, default=None)
    ap.add_argument("--outage-min", type=int, default=60)
    ap.add_argument("--fail-seconds", type=int, default=20)
    args = ap.parse_args()
    phases = args.phases.split(",")
    with private_server() as server:
        url = server.url
        r = redis.Redis.from_url(url, decode_responses=True)
        q = Queue(r, "ss")
        if "define" in phases or "fire" in phases:
            phase_define(r, q, args.schedules)
        if "fire" in phases:
            phase_fire(url, r, q, args.schedules, args.workers, args.minutes)
        if "outage" in phases:
            n = args.outage_schedules or min(args.schedules, 10_000)
            phase_outage(r, n, args.outage_min)
        if "failing" in phases:
            phase_failing(url, r, args.fail_seconds)


if __name__ == "__main__":
    main()
