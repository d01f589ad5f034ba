"""Cheap bench/ scripts run at tiny sizes, each in a subprocess on its own private server: each
must exit 0 and print the shape its docstring promises (keys, counts equal to n). No figure is
checked. A bench that reads what the measured code no longer has (a renamed function, a field a
lean finished record drops, a changed reply) then fails here, not at the next benchmark run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.redis_server import require_binary

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str) -> list[dict[str, Any]]:
    """bench/<script>'s JSON output: one indented object, or one object per line."""
    require_binary("redis-server", f"bench/{script}'s private server")
    # The timeout is a liveness bound (a hang fails), not a timing goal.
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.strip()
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines()]


def test_worker_bench() -> None:
    rows = bench("worker_bench.py", "--drain-n", "300", "--concurrency", "4", "--rounds", "2",
                 "--simultaneous-n", "20")  # fmt: skip
    assert [r["bench"] for r in rows] == ["drain", "idle_lateness", "simultaneous"]
    drain, late, simul = rows
    assert (drain["n"], drain["concurrency"]) == (300, 4) and "jobs_per_s" in drain
    assert late["rounds"] == 2
    for key in ("claim_minus_run_at_ms", "handler_start_minus_due_ms"):
        assert set(late[key]) == {"p50", "max", "min"}
    assert simul["n"] == simul["started"] == 20
    assert {"first_ms", "p50_ms", "max_ms", "early", "worker_rss_mb_conc16"} <= set(simul)


def test_flow_bench() -> None:
    rows = bench("flow_bench.py", "--jobs", "60", "--batch", "10")
    drains = [r for r in rows if r["bench"] == "flow" and r["case"] != "starvation"]
    assert [r["case"] for r in drains] == ["plain", "priorities", "keys", "hot_cold"]
    for r in drains:
        assert (r["jobs"], r["batch"]) == (60, 10)
        assert r["claims"] >= 6 and {"first_batch", "claim_p50_ms", "jobs_per_s"} <= set(r)
    starve = [r for r in rows if r.get("case") == "starvation"]
    assert len(starve) == 2  # aging on, aging in effect off: the same low-priority jobs
    low = {r["low_served"] + r["low_never_served"] for r in starve}
    assert len(low) == 1 and low.pop() > 0
    assert rows[-1]["bench"] == "flow_ratio"
    assert set(rows[-1]) == {"bench", "priorities_over_plain", "keys_over_plain",
                             "hot_cold_over_plain"}  # fmt: skip


def test_profile_drain_transitions() -> None:
    (out,) = bench("profile_drain.py", "transitions", "--n", "100", "--batch", "10")
    assert (out["n"], out["batch"]) == (100, 10)
    assert list(out["per_job"]) == [
        "enqueue (one call per job)",
        "enqueue_many (batches of 1000)",
        "claim (limit 10)",
        "heartbeat (10 leases per call)",
        "complete_many (10 per call)",
    ]
    for row in out["per_job"].values():
        assert row["commands"]["evalsha"]["calls_per_job"] > 0


def test_memory_layouts_api_rows() -> None:
    (out,) = bench("memory_layouts.py", "--n", "50", "--api-only")
    assert out["n"] == 50
    finished = [r for r in out["rows"] if r["layout"].startswith("finished job via the API")]
    assert len(finished) == 4  # lean and keep_payload, for each of the two payloads
    assert all("bytes_per_job" in r for r in out["rows"])  # at n = 50, noise: any sign
    for r in finished:
        key = r["one_job_key"]  # found: the finished job is still where the bench looks
        assert key["memory_usage"] > 0 and "finished_ms" in key["value_bytes_per_field"]


def test_claim_latency() -> None:
    rows = bench("claim_latency.py", "--max", "1000", "--rounds", "2")
    assert [r["bench"] for r in rows] == ["claim_latency", "claim_latency_ratio"]
    assert rows[0]["backlog"] == 1000 and {"p50_ms", "p99_ms"} <= set(rows[0])


def test_script_prologue() -> None:
    (out,) = bench("script_prologue.py", "--n", "20", "--rounds", "1")
    assert (out["n"], out["rounds"]) == (20, 1)
    assert list(out["us_per_call"]) == [
        "RPUSH (huey's enqueue)",
        "return 1",
        "enqueue: libs alone",
        "claim: libs alone",
        "complete: libs alone",
        "enqueue: one job, checks only",
        "enqueue: one job",
    ]
