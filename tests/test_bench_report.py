"""bench/run.py's report arithmetic: which way each ratio points, who counts as a peer, and the
per-transport tables. Pure functions on hand-made results; no server, no benchmark run."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def run() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("run")
    finally:
        sys.path.remove(str(BENCH))


def system(
    drain: float, single: float, bulk: float, p99: float, max_ms: float, mem: float
) -> dict[str, Any]:
    def ok(result: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "result": result}

    return {
        "status": "ok",
        "meta": {"version": "1"},
        "workloads": {
            "drain": ok({"jobs_per_s": drain}),
            "enqueue_single": ok({"jobs_per_s": single}),
            "enqueue_bulk": ok({"jobs_per_s": bulk}),
            "simultaneous": ok(
                {
                    "n": 2000,
                    "first_ms": 1.0,
                    "p50_ms": p99 / 2,
                    "p99_ms": p99,
                    "max_ms": max_ms,
                    "early": 0,
                }
            ),
            "memory": ok({"bytes_per_job": mem}),
        },
    }


def results(run: Any, by: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "timestamp": "t",
        "quick": True,
        "host": {"cpus": 2, "platform": "p", "python": "3"},
        "redis": {"version": "7", "transport": "x"},
        "sizes": {"drain": 10},
        "install": {},
        "ceiling": {"enqueue_model": {"jobs_per_s": 100_000.0, "model": "m", "n": 10}},
        "by_transport": {},
    }
    for transport, systems in by.items():
        out["by_transport"][transport] = {
            "systems": systems,
            "ratios": run.compute_ratios({**out, "systems": systems}),
        }
    first = next(iter(by))
    out["systems"] = out["by_transport"][first]["systems"]
    out["ratios"] = out["by_transport"][first]["ratios"]
    return out


def versus_row(lines: list[str], label: str) -> list[str]:
    row = next(ln for ln in lines if ln.startswith(f"| {label} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_versus_ratios_point_the_right_way(run: Any) -> None:
    systems = {
        "ours": system(drain=12_000, single=5_000, bulk=80_000, p99=150, max_ms=180, mem=900),
        "bullmq-node": system(
            drain=10_000, single=10_000, bulk=20_000, p99=300, max_ms=320, mem=450
        ),
    }
    lines = run.versus_lines(systems, "unix socket")
    # Higher is better: 12k / 10k.
    assert versus_row(lines, "drain jobs/s")[3:] == ["1.20x", "yes"]
    assert versus_row(lines, "single enqueue jobs/s")[3:] == ["0.50x", "no"]
    # Lower is better: a ratio below 1 is a win.
    assert versus_row(lines, "simultaneous start lateness p99 ms")[3:] == ["0.50x", "yes"]
    assert versus_row(lines, "bytes per pending job")[3:] == ["2.00x", "no"]


def test_versus_block_needs_both_systems(run: Any) -> None:
    only_ours = {"ours": system(1, 1, 1, 1, 1, 1)}
    assert run.versus_lines(only_ours, "tcp") == []


def test_node_peer_counts_as_best_peer_and_ours_never_does(run: Any) -> None:
    systems = {
        "ours": system(drain=50_000, single=50_000, bulk=50_000, p99=1, max_ms=1, mem=1),
        "bullmq-node": system(drain=9_000, single=1, bulk=1, p99=500, max_ms=500, mem=700),
        "huey": system(drain=3_000, single=18_000, bulk=8_000, p99=900, max_ms=900, mem=219),
    }
    ratios = run.compute_ratios({"systems": systems, "ceiling": {}})
    best = ratios["best_peer"]
    assert best["drain"]["system"] == "bullmq-node"
    assert best["enqueue_single"]["system"] == "huey"
    assert best["memory"]["system"] == "huey"
    assert ratios["to_best_peer"]["ours"]["drain"] == pytest.approx(50_000 / 9_000)


def test_targets_per_transport_against_bullmq_node(run: Any) -> None:
    fast = system(drain=12_000, single=20_000, bulk=90_000, p99=150, max_ms=190, mem=380)
    slow = system(drain=6_000, single=20_000, bulk=70_000, p99=250, max_ms=260, mem=380)
    node = system(drain=10_000, single=10_000, bulk=20_000, p99=300, max_ms=320, mem=700)
    res = results(run, {"unix": {"ours": fast, "bullmq-node": node},
                        "tcp": {"ours": slow, "bullmq-node": node}})  # fmt: skip
    rows = {ln.split("|")[1].strip(): ln.split("|")[3].strip() for ln in run.targets_lines(res)
            if ln.startswith("| [") or ln.startswith("| memory")}  # fmt: skip
    assert rows["[unix socket] drain >= bullmq-node"] == "met"
    assert rows["[TCP 127.0.0.1] drain >= bullmq-node"] == "not met"
    model = "bulk enqueue >= 80% of the pipelined enqueue model (unix)"
    assert rows[f"[unix socket] {model}"] == "met"  # 90k / 100k
    assert rows[f"[TCP 127.0.0.1] {model}"] == "not met"  # 70k / 100k
    assert rows["memory per pending job <= 400 B (90-byte JSON payload)"] == "met"


def test_report_has_one_table_per_transport(run: Any) -> None:
    node = system(drain=10_000, single=10_000, bulk=20_000, p99=300, max_ms=320, mem=700)
    ours = system(drain=12_000, single=20_000, bulk=90_000, p99=150, max_ms=190, mem=380)
    md = run.markdown(results(run, {"unix": {"ours": ours, "bullmq-node": node},
                                    "tcp": {"ours": ours, "bullmq-node": node}}))  # fmt: skip
    assert "## Over unix socket" in md
    assert "## Over TCP 127.0.0.1" in md
    assert md.count("ours vs bullmq-node over") == 2


def test_old_results_without_transports_still_render(run: Any) -> None:
    ours = system(drain=1, single=1, bulk=1, p99=1, max_ms=1, mem=1)
    old = results(run, {"unix": {"ours": ours}})
    del old["by_transport"]
    assert set(run.by_transport(old)) == {"unix"}
    assert "## Over unix socket" in run.markdown(old)


def test_driver_maps_dashed_system_names_to_modules() -> None:
    """`bullmq-node` is imported as systems.bullmq_node; a missing one says so, per workload."""
    import json
    import subprocess

    def meta(name: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, str(BENCH / "driver.py"), name, "meta",
             json.dumps({"url": "unix:///nonexistent/r.sock", "tcp_url": ""})],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return row

    assert meta("no-such-system")["error"] == "driver missing"
    # The module exists: whatever meta() answers, it is not "driver missing".
    assert meta("bullmq-node").get("error") != "driver missing"


def test_drain_rounds_median_leaves_a_failed_round_out(run: Any) -> None:
    def ok(v: float) -> dict[str, Any]:
        return {"ok": True, "result": {"n": 10, "jobs_per_s": v, "concurrency": None}}

    merged = run.merge_rounds(
        [ok(9_000), {"ok": False, "error": "timed out after 45s"}, ok(13_000), ok(10_000)]
    )
    assert merged["ok"] is True
    # Median of the three that succeeded: the failed round counts neither as 0 nor at all.
    assert merged["result"]["jobs_per_s"] == 10_000
    assert merged["result"]["rounds"] == [9_000, None, 13_000, 10_000]
    assert merged["result"]["median_of"] == 3
    assert merged["result"]["failed_rounds"] == [{"round": 2, "error": "timed out after 45s"}]
    assert merged["result"]["n"] == 10
    # Even count: the mean of the middle two.
    assert run.merge_rounds([ok(8_000), ok(12_000)])["result"]["jobs_per_s"] == 10_000
    every_one_failed = run.merge_rounds([{"ok": False, "error": "x"}] * 2)
    assert every_one_failed["ok"] is False
    assert run.metric({"workloads": {"drain": every_one_failed}}, "drain", "jobs_per_s") is None


def test_report_shows_drain_rounds_and_uses_their_median(run: Any) -> None:
    def with_rounds(entry: dict[str, Any], *values: float | None) -> dict[str, Any]:
        rows = [
            {"ok": False, "error": "boom"}
            if v is None
            else {"ok": True, "result": {"jobs_per_s": v}}
            for v in values
        ]
        entry["workloads"]["drain"] = run.merge_rounds(rows)
        return entry

    ours = with_rounds(system(1, 20_000, 90_000, 150, 190, 380), 11_000, 14_000, 12_000)
    node = with_rounds(system(1, 10_000, 20_000, 300, 320, 700), 13_000, None, 10_000)
    res = results(run, {"unix": {"ours": ours, "bullmq-node": node}})
    res["drain_rounds"] = 3
    md = run.markdown(res)
    assert "drain: median of 3 interleaved rounds" in md
    assert "ours 11,000 / 14,000 / 12,000 (median 12,000)" in md
    assert "bullmq-node 13,000 / failed / 10,000 (median 11,500)" in md
    # The ours-vs-bullmq-node row reads the medians: 12,000 / 11,500.
    assert versus_row(md.splitlines(), "drain jobs/s")[1:4] == ["12,000", "11,500", "1.04x"]
    # One round (--drain-rounds 1, or an old results file): no rounds line.
    single = results(run, {"unix": {"ours": system(1, 1, 1, 1, 1, 1)}})
    assert "Drain jobs/s per round" not in run.markdown(single)


def test_report_shows_single_enqueue_rounds_and_uses_their_median(run: Any) -> None:
    rows = [{"ok": True, "result": {"jobs_per_s": v}} for v in (2_100.0, 4_000.0, 3_900.0)]
    ours = system(1, 20_000, 90_000, 150, 190, 380)
    ours["workloads"]["enqueue_single"] = run.merge_rounds(rows, "enqueue_single")
    node = system(1, 3_000, 20_000, 300, 320, 700)
    res = results(run, {"unix": {"ours": ours, "bullmq-node": node}})
    res["enqueue_rounds"] = 3
    md = run.markdown(res)
    assert "single enqueue: median of 3 interleaved rounds per system" in md
    assert "Single enqueue jobs/s per round" in md
    assert "ours 2,100 / 4,000 / 3,900 (median 3,900)" in md
    # The ours-vs-bullmq-node row reads the median, not the first (slow) round: 3,900 / 3,000.
    assert versus_row(md.splitlines(), "single enqueue jobs/s")[1:4] == ["3,900", "3,000", "1.30x"]
    failed = run.merge_rounds([{"ok": False, "error": "x"}], "enqueue_single")
    assert failed["ok"] is False and failed["error"] == "every enqueue_single round failed"
