"""Render docs/bench.png from a results JSON (runs in the peers venv, which has matplotlib).

python bench/chart.py bench/results/<timestamp>.json docs/bench.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PANELS: list[tuple[str, str, str, bool]] = [
    ("enqueue_single", "jobs_per_s", "enqueue, one job per call (jobs/s)", True),
    ("enqueue_bulk", "jobs_per_s", "bulk enqueue (jobs/s)", True),
    ("drain", "jobs_per_s", "drain, one worker process (jobs/s)", True),
    ("simultaneous", "p99_ms", "simultaneous jobs: p99 lateness (ms)", False),
    ("memory", "bytes_per_job", "Redis memory per pending job (bytes)", False),
]


def value(system: dict[str, Any], workload: str, key: str) -> float | None:
    w = system.get("workloads", {}).get(workload, {})
    if not w.get("ok"):
        return None
    v = w["result"].get(key)
    return float(v) if v is not None else None


def main(src: str, dst: str) -> None:
    data = json.loads(Path(src).read_text())
    systems: dict[str, Any] = data["systems"]
    ceiling = data.get("ceiling", {}).get("loop", {}).get("jobs_per_s")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (workload, key, title, higher) in zip(axes.flat, PANELS, strict=False):
        rows = [(name, value(s, workload, key)) for name, s in systems.items()]
        pts = sorted(
            ((n, v) for n, v in rows if v is not None), key=lambda p: p[1], reverse=not higher
        )
        names = [p[0] for p in pts]
        vals = [p[1] for p in pts]
        colors = ["tab:red" if n == "ours" else "tab:blue" for n in names]
        ax.barh(names, vals, color=colors)
        ax.set_title(
            title + ("  (higher is better)" if higher else "  (lower is better)"), fontsize=9
        )
        ax.tick_params(labelsize=8)
        if ceiling and workload == "drain":
            ax.axvline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.set_xscale("log")
            ax.text(ceiling, -0.6, f" ceiling loop {ceiling:,.0f}/s", fontsize=7, va="top")
        missing = [n for n, v in rows if v is None]
        if missing:
            ax.set_xlabel("no result: " + ", ".join(missing), fontsize=7)
    last = axes.flat[-1]
    last.axis("off")
    rb = data.get("ceiling", {}).get("redis_benchmark", {})
    lines = [f"{k}: {v:,.0f} req/s" for k, v in rb.items() if isinstance(v, float | int)]
    last.text(
        0,
        1,
        "redis-benchmark (pipelined, same server)\n" + "\n".join(lines),
        va="top",
        fontsize=8,
        family="monospace",
    )
    mode = "quick" if data.get("quick") else "full"
    # run.py puts the first transport's systems at the top level; say which one this is.
    transport = (data.get("transports") or ["unix"])[0]
    fig.suptitle(
        f"scheduler benchmark ({mode} run {data['timestamp']}, over {transport}, "
        f"{data['host']['cpus']} CPUs, shared machine: compare ratios, not absolutes)",
        fontsize=11,
    )
    fig.tight_layout()
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dst, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
