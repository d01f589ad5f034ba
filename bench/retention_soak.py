"""Redis memory of finished jobs under a steady load: a producer at --rate jobs/s for --seconds,
--workers `scheduler worker` processes (default 1) draining the same queue, used_memory sampled
every second.

    python bench/retention_soak.py [--rate 1500] [--seconds 60] [--workers 1] [--ttl-ms 3600000]
        [--result-ttl-ms MS (the worker's option)] [--job-ttl-ms MS (each job's, at enqueue)]
        [--keep-payload] [--worker-arg=--some-option --worker-arg=value ...]

While finished jobs are kept longer than the soak lasts, memory grows by (bytes per finished job)
x (completions per second): the slope over the second half of the run gives the bytes per
finished job, and the projection for the retention is bytes x rate x ttl. Once retention is
settable (issue 16), give --result-ttl-ms (the worker's `--result-ttl-ms`) or --job-ttl-ms (each
job's `result_ttl_ms=` at enqueue) shorter than the soak: memory then levels off. The steady
state is the last quarter of the samples (its mean, and its slope, ~0 on a plateau); divided by
rate x ttl it gives the bytes each retained finished job costs (lean, or with --keep-payload).

That plateau is only clean when the workers keep up: the backlog (due + leased, sampled with the
memory) must stay bounded over the steady window, else pending jobs pile up in the memory too.
`backlog_bounded` in the output says which; with one worker on a 2-core machine shared with
redis-server and the producer, 1,500/s is not kept up, hence --workers.

Producer: `Queue.enqueue_many` of rate/50 jobs every 20 ms (the bench payload), paced by a
deadline; the worker is bench/systems/ours.py's command. Private redis-server as in
profile_drain.py; never 6379. Prints one JSON object. Not a test: figures for docs/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common as c  # noqa: E402
from profile_drain import group_cpu_s, redis_cpu_s, server  # noqa: E402


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def backlog_bounded(points: list[tuple[float, float]], rate: float) -> bool:
    """Whether a backlog series (t_s, due + leased) over the steady window stays bounded: from
    its first third to its last the median grows by at most 1% of the arrival rate per second,
    and the last third's median holds at most 2 s of arrivals. Medians, because on the shared
    machine everything stalls for a few seconds now and then and the workers then catch up: a
    transient, not a backlog that grows. False under 6 samples (a run shorter than ~24 s)."""
    k = len(points) // 3
    if k < 2:
        return False
    first, last = points[:k], points[-k:]
    t_first, t_last = median(t for t, _ in first), median(t for t, _ in last)
    b_first, b_last = median(b for _, b in first), median(b for _, b in last)
    growth_per_s = (b_last - b_first) / max(t_last - t_first, 1e-9)
    return growth_per_s <= 0.01 * rate and b_last <= 2 * rate


def verdict(bounded: bool, clean: bool) -> str:
    if not bounded:
        return "workers did NOT keep up: the backlog grows, the plateau includes pending jobs"
    if not clean:
        return "backlog bounded but the window is a catch-up (completions != arrivals): no plateau"
    return "workers kept up: clean plateau"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=int, default=1500, help="jobs enqueued per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=1, help="worker processes on the queue")
    ap.add_argument("--ttl-ms", type=int, default=3_600_000, help="retention, for the projection")
    ap.add_argument("--result-ttl-ms", type=int, help="the worker's --result-ttl-ms")
    ap.add_argument("--job-ttl-ms", type=int, help="each job's result_ttl_ms at enqueue")
    ap.add_argument("--keep-payload", action="store_true", help="each job's keep_payload")
    ap.add_argument("--worker-arg", action="append", default=[], help="extra worker argument")
    opts = ap.parse_args()
    if opts.rate <= 0 or opts.seconds <= 0 or opts.workers <= 0:
        ap.error("--rate, --seconds and --workers must be > 0")
    if opts.result_ttl_ms is not None:
        opts.worker_arg += ["--result-ttl-ms", str(opts.result_ttl_ms)]
    # The retention in force: the job's own wins over the worker's (docs/limits.md).
    ttl_ms = opts.job_ttl_ms or opts.result_ttl_ms or opts.ttl_ms
    job_kw: dict[str, Any] = {"result_ttl_ms": opts.job_ttl_ms, "keep_payload": opts.keep_payload}

    from systems import ours

    import scheduler
    from scheduler import JobSpec, Queue
    from scheduler.core.keys import QueueKeys

    tick_s = 0.02
    per_tick = max(1, round(opts.rate * tick_s))
    samples: list[dict[str, Any]] = []
    names = [f"retention-soak-{i}" for i in range(opts.workers)]
    with server() as (url, _), contextlib.ExitStack() as stack:
        r = c.client(url)
        q = Queue.from_url(url, c.QUEUE)
        cmd = [*ours._worker_cmd(url, None), *opts.worker_arg]
        procs = [stack.enter_context(c.running(name, cmd, url)) for name in names]
        c.wait_ready(r, lambda: q.enqueue("task", c.payload(-1)), procs[0], names[0])
        # Every worker registered (worker_beat at start), so none joins mid-run.
        workers_key = QueueKeys(c.QUEUE).workers
        if not c.wait_until(lambda: int(r.zcard(workers_key)) >= opts.workers, 30.0, 0.05):
            raise RuntimeError(f"only {r.zcard(workers_key)}/{opts.workers} workers registered")
        base = c.memory_baseline(r)
        done0 = c.count(r)
        worker_cpu0 = [group_cpu_s(p.pid) for p in procs]
        redis_cpu0, producer_cpu0 = redis_cpu_s(r), time.process_time()
        sent = 0
        t0 = time.monotonic()
        next_tick = t0
        next_sample = t0
        end = t0 + opts.seconds
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_tick:
                q.enqueue_many(
                    [JobSpec("task", c.payload(sent + k), **job_kw) for k in range(per_tick)]
                )
                sent += per_tick
                next_tick += tick_s
            if now >= next_sample:
                counts = q.counts()
                samples.append({
                    "t_s": round(now - t0, 2),
                    "sent": sent,
                    "done": c.count(r) - done0,
                    "backlog": counts.due + counts.leased,
                    "memory_bytes": c.memory_baseline(r) - base,
                    "keys": int(r.dbsize()),
                })  # fmt: skip
                next_sample += 1.0
            for name, proc in zip(names, procs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited: {c.log_tail(name)}")
            time.sleep(max(0.0, min(next_tick, next_sample) - time.monotonic()))
        elapsed_s = time.monotonic() - t0
        # CPU seconds per wall second of the run: on 2 cores, how close to saturation.
        worker_cpu = [group_cpu_s(p.pid) - w for p, w in zip(procs, worker_cpu0, strict=True)]
        cores = {
            "workers": [round(w / elapsed_s, 2) for w in worker_cpu],
            "redis": round((redis_cpu_s(r) - redis_cpu0) / elapsed_s, 2),
            "producer": round((time.process_time() - producer_cpu0) / elapsed_s, 2),
        }
    half = [s for s in samples if s["t_s"] >= opts.seconds / 2]
    mem_per_s = slope([(s["t_s"], s["memory_bytes"]) for s in half])
    done_per_s = slope([(s["t_s"], s["done"]) for s in half])
    per_job = mem_per_s / done_per_s if done_per_s else float("nan")
    last = samples[-1] if samples else {}
    tail = samples[-max(2, len(samples) // 4) :]
    steady = sum(s["memory_bytes"] for s in tail) / len(tail) if tail else float("nan")
    # Finished jobs alive at once on the plateau: what the worker completed per second (below
    # --rate when it cannot keep up: the backlog is then pending jobs, also in the memory).
    done_rate = (tail[-1]["done"] - tail[0]["done"]) / max(tail[-1]["t_s"] - tail[0]["t_s"], 1e-9)
    retained = done_rate * ttl_ms / 1000
    tail_slope = slope([(s["t_s"], s["memory_bytes"]) for s in tail])
    tail_span_s = max(tail[-1]["t_s"] - tail[0]["t_s"], 1e-9) if tail else float("nan")
    backlog = [(s["t_s"], float(s["backlog"])) for s in tail]
    bounded = backlog_bounded(backlog, opts.rate)
    arrivals_per_s = (tail[-1]["sent"] - tail[0]["sent"]) / tail_span_s if tail else float("nan")
    # A bounded backlog can still be a catch-up after a stall: the window is steady only when
    # the workers completed what arrived in it (within 5%).
    clean = bounded and abs(done_rate - arrivals_per_s) <= 0.05 * arrivals_per_s
    print(json.dumps({
        "rate": opts.rate,
        "seconds": opts.seconds,
        "workers": opts.workers,
        "worker_args": opts.worker_arg,
        # Which tree ran (PYTHONPATH may point at a snapshot of a commit, as in docs/).
        "source": str(Path(scheduler.__file__).resolve().parent.parent),
        "sent": last.get("sent"),
        "done": last.get("done"),
        "producer_rate_per_s": round(sent / elapsed_s, 1),
        # due + leased at the last sample; bounded = the workers kept up over the steady window.
        "backlog_at_end": last.get("backlog"),
        "backlog_slope_per_s": round(slope(backlog), 1),
        "backlog_max_steady": max((b for _, b in backlog), default=None),
        "backlog_bounded": bounded,
        "steady_window_clean": clean,
        "verdict": verdict(bounded, clean),
        "cpu_cores_used": cores,
        "completions_per_s": round(done_per_s, 1),
        "memory_growth_bytes_per_s": round(mem_per_s, 1),
        "bytes_per_finished_job": round(per_job, 1),
        "ttl_ms": ttl_ms,
        "job_ttl_ms": opts.job_ttl_ms,
        "keep_payload": opts.keep_payload,
        "projected_steady_state_bytes": round(per_job * opts.rate * ttl_ms / 1000),
        "memory_at_end_bytes": last.get("memory_bytes"),
        # Meaningful once ttl < seconds: the plateau, its slope, bytes per retained job.
        "steady_state_bytes": round(steady),
        "steady_state_slope_bytes_per_s": round(tail_slope, 1),
        "steady_window_s": [tail[0]["t_s"], tail[-1]["t_s"]] if tail else None,
        "steady_state_producer_rate_per_s": round(arrivals_per_s, 1),
        "steady_state_completions_per_s": round(done_rate, 1),
        "steady_state_bytes_per_retained_job": round(steady / retained, 1) if retained else None,
        "samples": samples,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
