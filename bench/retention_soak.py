"""Redis memory of finished jobs under a steady load: a producer at --rate jobs/s for --seconds,
one `scheduler worker` draining, used_memory sampled every second.

    python bench/retention_soak.py [--rate 1500] [--seconds 60] [--ttl-ms 3600000]
        [--result-ttl-ms MS (the worker's option)] [--job-ttl-ms MS (each job's, at enqueue)]
        [--keep-payload] [--worker-arg=--some-option --worker-arg=value ...]

While finished jobs are kept longer than the soak lasts, memory grows by (bytes per finished job)
x (completions per second): the slope over the second half of the run gives the bytes per
finished job, and the projection for the retention is bytes x rate x ttl. Once retention is
settable (issue 16), give --result-ttl-ms (the worker's `--result-ttl-ms`) or --job-ttl-ms (each
job's `result_ttl_ms=` at enqueue) shorter than the soak: memory then levels off. The steady
state is the last quarter of the samples (its mean, and its slope, ~0 on a plateau); divided by
rate x ttl it gives the bytes each retained finished job costs (lean, or with --keep-payload).

Producer: `Queue.enqueue_many` of rate/50 jobs every 20 ms (the bench payload), paced by a
deadline; the worker is bench/systems/ours.py's command. Private redis-server as in
profile_drain.py; never 6379. Prints one JSON object. Not a test: figures for docs/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common as c  # noqa: E402
from profile_drain import server  # noqa: E402


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=int, default=1500, help="jobs enqueued per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--ttl-ms", type=int, default=3_600_000, help="retention, for the projection")
    ap.add_argument("--result-ttl-ms", type=int, help="the worker's --result-ttl-ms")
    ap.add_argument("--job-ttl-ms", type=int, help="each job's result_ttl_ms at enqueue")
    ap.add_argument("--keep-payload", action="store_true", help="each job's keep_payload")
    ap.add_argument("--worker-arg", action="append", default=[], help="extra worker argument")
    opts = ap.parse_args()
    if opts.rate <= 0 or opts.seconds <= 0:
        ap.error("--rate and --seconds must be > 0")
    if opts.result_ttl_ms is not None:
        opts.worker_arg += ["--result-ttl-ms", str(opts.result_ttl_ms)]
    # The retention in force: the job's own wins over the worker's (docs/limits.md).
    ttl_ms = opts.job_ttl_ms or opts.result_ttl_ms or opts.ttl_ms
    job_kw: dict[str, Any] = {"result_ttl_ms": opts.job_ttl_ms, "keep_payload": opts.keep_payload}

    from systems import ours

    from scheduler import JobSpec, Queue

    tick_s = 0.02
    per_tick = max(1, round(opts.rate * tick_s))
    samples: list[dict[str, Any]] = []
    with server() as (url, _):
        r = c.client(url)
        q = Queue.from_url(url, c.QUEUE)
        cmd = [*ours._worker_cmd(url, None), *opts.worker_arg]
        with c.running("retention-soak", cmd, url) as proc:
            c.wait_ready(r, lambda: q.enqueue("task", c.payload(-1)), proc, "retention-soak")
            base = c.memory_baseline(r)
            done0 = c.count(r)
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
                    samples.append({
                        "t_s": round(now - t0, 2),
                        "sent": sent,
                        "done": c.count(r) - done0,
                        "memory_bytes": c.memory_baseline(r) - base,
                        "keys": int(r.dbsize()),
                    })  # fmt: skip
                    next_sample += 1.0
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited: {c.log_tail('retention-soak')}")
                time.sleep(max(0.0, min(next_tick, next_sample) - time.monotonic()))
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
    print(json.dumps({
        "rate": opts.rate,
        "seconds": opts.seconds,
        "worker_args": opts.worker_arg,
        "sent": last.get("sent"),
        "done": last.get("done"),
        "backlog_at_end": (last.get("sent", 0) - last.get("done", 0)),
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
        "steady_state_completions_per_s": round(done_rate, 1),
        "steady_state_bytes_per_retained_job": round(steady / retained, 1) if retained else None,
        "samples": samples,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
