"""Benchmark entry point: peers vs ours vs the Redis ceiling, on a private redis-server.

    python bench/run.py [--quick] [--systems a,b] [--transport unix|tcp|both] [--sizes k=n,...]
                        [--out bench/results] [--chart docs/bench.png] [--drain-rounds N]
                        [--enqueue-rounds N]

Standard library only: the Python peer libraries live in their own virtualenv(s) under bench/
(created here on first use), the Node.js peer in bench/systems/bullmq_node/node_modules
(`npm ci`, pinned by its package-lock.json); "ours" runs in the current interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from redis_server import Server, private_server  # noqa: E402

# redis-py is pinned once for every peer venv: bullmq needs redis<6, and the other peers accept
# that; pinning keeps results comparable and stops one peer's install from moving another's.
REDIS_PY = "redis==5.3.1"
BASE_REQS = [REDIS_PY, "hiredis==3.5.0", "matplotlib==3.11.2"]


@dataclass(frozen=True)
class Peer:
    requirements: tuple[str, ...]
    venv: str = "peers"  # bench/.venv-<venv>; give a peer its own if it conflicts on redis-py


PEERS: dict[str, Peer] = {
    "rq": Peer(("rq==3.0.0",)),
    "arq": Peer(("arq==0.28.0",)),
    "saq": Peer(("saq==0.26.4",)),
    # The Python port of BullMQ; the real one (Node.js) is "bullmq-node" in NODE_PEERS.
    "bullmq-py": Peer(("bullmq==2.15.0",)),
    "dramatiq": Peer(("dramatiq[redis]==2.2.1",)),
    "huey": Peer(("huey==3.5.4",)),
    "celery": Peer(("celery[redis]==5.6.3",)),
    # taskiq 0.13 removed taskiq.compat.model_dump, which taskiq-redis 1.0.9 still imports.
    "taskiq": Peer(("taskiq==0.12.6", "taskiq-redis==1.0.9")),
    "streaq": Peer(("streaq==7.2.0",)),
}
# Node.js peers: name -> directory with package.json + package-lock.json (exact versions) and a
# Python shim (__init__.py) that driver.py imports; `npm ci` installs node_modules there.
NODE_PEERS: dict[str, Path] = {"bullmq-node": BENCH / "systems" / "bullmq_node"}
ALL_PEERS = [*NODE_PEERS, *PEERS]
SYSTEMS = ["ours", *ALL_PEERS]
# Our own variants: run in this interpreter like "ours", only when named in --systems.
OURS_VARIANTS = ["ours-2p"]
TRANSPORTS = {"unix": ["unix"], "tcp": ["tcp"], "both": ["unix", "tcp"]}

FULL = {
    "enqueue_single": 5000,
    "enqueue_bulk": 20000,
    "drain": 5000,
    "simultaneous": 2000,
    "memory": 10000,
    "ceiling_loop": 200000,
    "redis_benchmark": 200000,
    "claim_latency_max": 1_000_000,
}
QUICK = {
    "enqueue_single": 300,
    "enqueue_bulk": 1000,
    "drain": 300,
    "simultaneous": 200,
    "memory": 2000,
    "ceiling_loop": 20000,
    "redis_benchmark": 20000,
    "claim_latency_max": 100_000,
}
DELAY_S = 2.0
# Quick mode runs the client-only workloads in one driver subprocess per system.
CLIENT_ONLY = ["meta", "enqueue_single", "enqueue_bulk", "memory"]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- virtualenvs


def venv_python(name: str) -> Path:
    return BENCH / f".venv-{name}" / "bin" / "python"


def _pip(py: Path, args: list[str], timeout: float = 900) -> tuple[bool, str]:
    cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"pip timed out after {timeout:.0f}s"
    if out.returncode == 0:
        return True, ""
    lines = [ln for ln in (out.stderr or out.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "ERROR" in ln] or lines
    return False, " | ".join(errors[-3:])[:600]


def ensure_venvs(names: list[str], reinstall: bool) -> dict[str, dict[str, Any]]:
    """Create the venv(s) and install each peer separately; return per-peer install status."""
    status: dict[str, dict[str, Any]] = {}
    by_venv: dict[str, list[str]] = {}
    for name in names:
        by_venv.setdefault(PEERS[name].venv, []).append(name)
    if names:
        by_venv.setdefault("peers", [])  # the chart and the ceiling loop run in it
    for vname, peers in by_venv.items():
        vdir = BENCH / f".venv-{vname}"
        stamp_path = vdir / "bench-install.json"
        stamp: dict[str, Any] = {}
        if stamp_path.exists():
            stamp = json.loads(stamp_path.read_text())
        py = venv_python(vname)
        if not py.exists():
            log(f"creating {vdir.relative_to(ROOT)}")
            venv.EnvBuilder(with_pip=True, clear=True).create(vdir)
            stamp = {}
        base = BASE_REQS if vname == "peers" else [REDIS_PY]
        if stamp.get("_base") != base or reinstall:
            log(f"installing {' '.join(base)} into .venv-{vname}")
            ok, reason = _pip(py, base)
            stamp["_base"] = base if ok else None
            if not ok:
                log(f"base install failed: {reason}")
        constraints = vdir / "constraints.txt"
        constraints.write_text(REDIS_PY + "\n")
        for peer in peers:
            reqs = list(PEERS[peer].requirements)
            prev = stamp.get(peer, {})
            if prev.get("requirements") != reqs or reinstall:
                log(f"installing {peer}: {' '.join(reqs)}")
                ok, reason = _pip(py, ["-c", str(constraints), *reqs])
                prev = {"requirements": reqs, "ok": ok, "reason": reason}
                stamp[peer] = prev
                if not ok:
                    log(f"  {peer} install failed: {reason}")
            status[peer] = {**prev, "venv": f".venv-{vname}"}
        stamp_path.write_text(json.dumps(stamp, indent=1))
    return status


def ensure_node(names: list[str], reinstall: bool) -> dict[str, dict[str, Any]]:
    """`npm ci` each Node peer, cached by the sha256 of its package-lock.json."""
    status: dict[str, dict[str, Any]] = {}
    for name in names:
        pdir = NODE_PEERS[name]
        lock = pdir / "package-lock.json"
        stamp_path = pdir / "node_modules" / "bench-install.json"
        digest = hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else ""
        reqs = [f"npm ci ({pdir.relative_to(ROOT)}/package-lock.json)"]
        prev: dict[str, Any] = {}
        if stamp_path.exists():
            prev = json.loads(stamp_path.read_text())
        if prev.get("lock_sha256") != digest or not prev.get("ok") or reinstall:
            log(f"installing {name}: npm ci in {pdir.relative_to(ROOT)}")
            try:
                out = subprocess.run(
                    ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                    cwd=pdir,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                ok, reason = out.returncode == 0, (out.stderr or out.stdout).strip()[-600:]
            except (OSError, subprocess.SubprocessError) as exc:
                ok, reason = False, str(exc)
            prev = {"lock_sha256": digest, "ok": ok, "reason": "" if ok else reason}
            if ok:
                stamp_path.write_text(json.dumps(prev, indent=1))
            else:
                log(f"  {name} install failed: {reason}")
        status[name] = {"requirements": reqs, "ok": prev["ok"], "reason": prev["reason"],
                        "venv": "node_modules"}  # fmt: skip
    return status


# --------------------------------------------------------------------------- subprocesses


def kill_leftovers(pidfile: Path) -> None:
    if not pidfile.exists():
        return
    for line in pidfile.read_text().split():
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(line), signal.SIGKILL)
    pidfile.write_text("")


def run_json(
    cmd: list[str], timeout: float, pidfile: Path, extra_env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Run a subprocess in its own process group; return its JSON stdout lines and stderr tail."""
    env = dict(os.environ, BENCH_PIDFILE=str(pidfile), PYTHONUNBUFFERED="1", **(extra_env or {}))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_leftovers(pidfile)
    rows = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                rows.append(obj)
    tail = " | ".join(err.strip().splitlines()[-3:])[-500:]
    if timed_out:
        tail = f"timed out after {timeout:.0f}s; {tail}"
    return rows, tail


def run_system(
    name: str,
    py: str,
    groups: list[list[str]],
    sizes: dict[str, int],
    server: Server,
    timeout: float,
    pidfile: Path,
    concurrency: int | None,
    transport: str = "unix",
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"status": "ok", "python": py, "workloads": {}}
    for wls in groups:
        args = {
            "transport": transport,
            "url": server.url,
            "tcp_url": server.tcp_url,
            "n": sizes.get(wls[-1], 1000),
            "sizes": {w: sizes[w] for w in wls if w in sizes},
            "delay_s": DELAY_S,
            "concurrency": concurrency,
        }
        t0 = time.perf_counter()
        rows, err = run_json(
            [py, str(BENCH / "driver.py"), name, ",".join(wls), json.dumps(args)],
            timeout,
            pidfile,
            extra_env,
        )
        got = {r.get("workload"): r for r in rows}
        for w in wls:
            row = got.get(w) or {"ok": False, "error": err or "no output from driver"}
            row.pop("system", None)
            row.pop("workload", None)
            if w == "meta":
                entry["meta"] = row.get("result", {}) if row.get("ok") else {}
                if not row.get("ok"):
                    entry["status"] = "failed"
                    entry["reason"] = row.get("error", "")
            else:
                entry["workloads"][w] = row
            mark = "ok" if row.get("ok") else f"FAILED: {row.get('error', '')[:160]}"
            log(f"  {name}[{transport}].{w}: {mark}")
        log(f"  ({time.perf_counter() - t0:.1f}s)")
    return entry


# --------------------------------------------------------------------------- ceiling

SMALL_SCRIPT = "return redis.call('INCR', KEYS[1])"


def redis_benchmark(server: Server, n: int) -> dict[str, Any]:
    sha = server.cli("SCRIPT", "LOAD", SMALL_SCRIPT)
    commands = {
        "EVALSHA (small script)": ["EVALSHA", sha, "1", "ceil:k"],
        "ZADD": ["ZADD", "ceil:z", "__rand_int__", "m:__rand_int__"],
        "ZRANGEBYSCORE LIMIT 100": ["ZRANGEBYSCORE", "ceil:z", "-inf", "+inf", "LIMIT", "0", "100"],
        "HSET": ["HSET", "ceil:h:__rand_int__", "state", "queued", "payload", "x" * 64],
    }
    out: dict[str, Any] = {"settings": f"redis-benchmark -n {n} -P 16 -c 50 -r 100000 (unix)"}
    for label, cmd in commands.items():
        try:
            res = subprocess.run(
                [
                    "redis-benchmark",
                    "-s",
                    server.socket_path,
                    "-n",
                    str(n),
                    "-P",
                    "16",
                    "-r",
                    "100000",
                    "--csv",
                    *cmd,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            last = res.stdout.strip().splitlines()[-1]
            out[label] = float(last.split(",")[1].strip('"'))
        except (subprocess.SubprocessError, IndexError, ValueError) as exc:
            out[label] = f"failed: {exc}"
    server.cli("DEL", "ceil:k", "ceil:z")
    return out


# --------------------------------------------------------------------------- report

HIGHER = {("enqueue_single", "jobs_per_s"), ("enqueue_bulk", "jobs_per_s"), ("drain", "jobs_per_s")}
METRICS = [
    ("enqueue_single", "jobs_per_s"),
    ("enqueue_bulk", "jobs_per_s"),
    ("drain", "jobs_per_s"),
    ("simultaneous", "p99_ms"),
    ("memory", "bytes_per_job"),
]


def metric(entry: dict[str, Any], workload: str, key: str) -> float | None:
    w = entry.get("workloads", {}).get(workload, {})
    if not w.get("ok"):
        return None
    v = w.get("result", {}).get(key)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def merge_rounds(rows: list[dict[str, Any]], workload: str = "drain") -> dict[str, Any]:
    """One drain (or single-enqueue) entry from the driver rows of every round (the normal pass
    first): jobs_per_s is the median of the rounds that succeeded; each round's value stays in
    result["rounds"] (None for a failed round, whose error goes to result["failed_rounds"])."""
    values: list[float | None] = []
    failed: list[dict[str, Any]] = []
    for i, row in enumerate(rows, 1):
        v = row.get("result", {}).get("jobs_per_s") if row.get("ok") else None
        if isinstance(v, int | float) and math.isfinite(v):
            values.append(float(v))
        else:
            values.append(None)
            failed.append({"round": i, "error": str(row.get("error", "no jobs_per_s"))[:300]})
    good = [v for v in values if v is not None]
    first = next((r for r in rows if r.get("ok")), rows[0])
    if not good:
        return {**first, "ok": False, "error": f"every {workload} round failed",
                "result": {"rounds": values, "failed_rounds": failed}}  # fmt: skip
    result = {**first.get("result", {}), "jobs_per_s": statistics.median(good)}
    result.update(rounds=values, median_of=len(good))
    if failed:
        result["failed_rounds"] = failed
    return {**first, "ok": True, "result": result}


ROUNDS_LABEL = {"drain": ("Drain", "drain"), "enqueue_single": ("Single enqueue", "single enqueue")}


def rounds_lines(systems: dict[str, Any], workload: str = "drain") -> list[str]:
    """One line: each system's rounds of the workload (jobs/s, in run order) and their median."""
    title, word = ROUNDS_LABEL[workload]
    parts, n = [], 0
    for name, e in systems.items():
        res = e.get("workloads", {}).get(workload, {}).get("result", {})
        rounds = res.get("rounds")
        if not isinstance(rounds, list) or len(rounds) < 2:
            continue
        n = max(n, len(rounds))
        vals = " / ".join("failed" if v is None else fmt(v) for v in rounds)
        med = res.get("jobs_per_s")
        parts.append(f"{name} {vals} (median {fmt(med) if med is not None else '—'})")
    if not parts:
        return []
    return [
        f"{title} jobs/s per round, in run order ({word}: median of {n} interleaved rounds; "
        f"every {word} figure of this transport is that median): " + "; ".join(parts),
        "",
    ]


def compute_ratios(results: dict[str, Any]) -> dict[str, Any]:
    systems: dict[str, Any] = results["systems"]
    ceiling = results.get("ceiling", {}).get("loop", {}).get("jobs_per_s")
    ratios: dict[str, Any] = {"best_peer": {}, "to_best_peer": {}, "to_ceiling": {}}
    for workload, key in METRICS:
        vals = {n: metric(e, workload, key) for n, e in systems.items() if n in ALL_PEERS}
        good = {n: v for n, v in vals.items() if v is not None and (v > 0 or workload != "memory")}
        if not good:
            continue
        higher = (workload, key) in HIGHER
        if not higher:
            good = {n: v for n, v in good.items() if v > 0} or good
        best_name = (max if higher else min)(good, key=lambda n: good[n])
        best = good[best_name]
        ratios["best_peer"][workload] = {"system": best_name, "value": best, "metric": key}
        for name, entry in systems.items():
            v = metric(entry, workload, key)
            if v is None:
                continue
            if best:
                ratios["to_best_peer"].setdefault(name, {})[workload] = v / best
            if higher and ceiling:
                ratios["to_ceiling"].setdefault(name, {})[workload] = v / ceiling
    return ratios


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


TRANSPORT_LABEL = {"unix": "unix socket", "tcp": "TCP 127.0.0.1"}


def by_transport(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-transport runs; results files from before --transport hold one (unix) run."""
    by: dict[str, dict[str, Any]] = results.get("by_transport") or {
        "unix": {"systems": results["systems"], "ratios": results["ratios"]}
    }
    return by


def system_table(systems: dict[str, Any], ratios: dict[str, Any]) -> list[str]:
    lines = [
        "| system | version | enqueue jobs/s (xbest) | bulk enqueue jobs/s (xbest) "
        "| drain jobs/s (xbest, xceiling) | lateness ms first / p50 / p99 / max (p99 xbest) "
        "| early | bytes/job (xbest) | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in systems.items():
        rb = ratios["to_best_peer"].get(name, {})
        rc = ratios["to_ceiling"].get(name, {})

        def cell(
            workload: str,
            key: str,
            extra: str = "",
            _rb: dict[str, float] = rb,
            _e: dict[str, Any] = e,
        ) -> str:
            v = metric(_e, workload, key)
            if v is None:
                w = _e.get("workloads", {}).get(workload)
                return "n/a" if w and w.get("unsupported") else "—"
            r = _rb.get(workload)
            return f"{fmt(v)} ({r:.2f}x{extra})" if r is not None else fmt(v)

        drain = cell("drain", "jobs_per_s")
        if rc.get("drain") is not None and drain.endswith(")"):
            drain = drain[:-1] + f", {rc['drain']:.3f}x ceil)"
        sim = e.get("workloads", {}).get("simultaneous", {})
        if sim.get("ok"):
            s = sim["result"]
            p99r = rb.get("simultaneous")
            late = (
                f"{fmt(s['first_ms'])} / {fmt(s['p50_ms'])} / {fmt(s['p99_ms'])} / "
                f"{fmt(s['max_ms'])}" + (f" ({p99r:.2f}x)" if p99r is not None else "")
            )
            early = str(s["early"])
        else:
            late, early = "—", "—"
        problems = [
            f"{w}: {r.get('error', '')}"
            for w, r in e.get("workloads", {}).items()
            if not r.get("ok")
        ]
        status = e["status"] if e["status"] != "ok" else ("ok" if not problems else "partial")
        if e.get("reason"):
            status += f": {e['reason']}"
        elif problems:
            status += "; " + "; ".join(problems)
        status = status.replace("|", "/").replace("\n", " ")[:300]
        version = e.get("meta", {}).get("version", "")
        lines.append(
            f"| {name} | {version} | {cell('enqueue_single', 'jobs_per_s')} "
            f"| {cell('enqueue_bulk', 'jobs_per_s')} | {drain} | {late} | {early} "
            f"| {cell('memory', 'bytes_per_job')} | {status} |"
        )
    lines += [
        "",
        "Best peer per metric: "
        + ", ".join(
            f"{w} = {b['system']} ({fmt(b['value'])})" for w, b in ratios["best_peer"].items()
        ),
        "",
    ]
    return lines


VERSUS = "bullmq-node"
# (label, workload, result key, higher is better)
VERSUS_ROWS = [
    ("drain jobs/s", "drain", "jobs_per_s", True),
    ("single enqueue jobs/s", "enqueue_single", "jobs_per_s", True),
    ("bulk enqueue jobs/s", "enqueue_bulk", "jobs_per_s", True),
    ("simultaneous start lateness p99 ms", "simultaneous", "p99_ms", False),
    ("simultaneous start lateness max ms", "simultaneous", "max_ms", False),
    ("bytes per pending job", "memory", "bytes_per_job", False),
]


def versus_lines(systems: dict[str, Any], label: str) -> list[str]:
    """ours / bullmq-node for each headline metric, from the same run and transport."""
    ours, ref = systems.get("ours"), systems.get(VERSUS)
    if not ours or not ref:
        return []
    out = [
        f"ours vs {VERSUS} over {label} (ratio = ours / {VERSUS}; for lateness and bytes lower "
        "is better, so a ratio < 1 means ours wins):",
        "",
        f"| metric | ours | {VERSUS} | ratio | ours better? |",
        "|---|---|---|---|---|",
    ]
    for what, workload, key, higher in VERSUS_ROWS:
        a, b = metric(ours, workload, key), metric(ref, workload, key)
        ratio = a / b if a is not None and b else None
        better = "?" if ratio is None else ("yes" if (ratio >= 1) == higher else "no")
        if ratio is not None and ratio == 1:
            better = "tie"
        rs = "?" if ratio is None else f"{ratio:.2f}x"
        out.append(f"| {what} | {fmt(a)} | {fmt(b)} | {rs} | {better} |")
    return [*out, ""]


def markdown(results: dict[str, Any]) -> str:
    by = by_transport(results)
    ceiling = results.get("ceiling", {})
    loop = ceiling.get("loop", {}).get("jobs_per_s")
    mode = "quick" if results["quick"] else "full"
    lines = [
        f"# Benchmark results ({mode} run, {results['timestamp']})",
        "",
        f"Machine: {results['host']['cpus']} CPUs, {results['host']['platform']}, Python "
        f"{results['host']['python']}; private redis-server {results['redis']['version']} over "
        f"{results['redis'].get('transport', 'a unix socket')}. The machine is shared and noisy: "
        "read the ratios (xbest peer, xceiling loop, ours vs bullmq-node, all from this same "
        "run), not the absolute numbers.",
        "",
        "Sizes: "
        + ", ".join(f"{k} n={v}" for k, v in results["sizes"].items())
        + f"; simultaneous jobs due {DELAY_S:g} s ahead (rounded up to a whole second)"
        + (
            f"; drain: median of {results['drain_rounds']} interleaved rounds per system"
            if results.get("drain_rounds", 1) > 1
            else ""
        )
        + (
            f"; single enqueue: median of {results['enqueue_rounds']} interleaved rounds per "
            "system."
            if results.get("enqueue_rounds", 1) > 1
            else "."
        ),
        "",
    ]
    for transport, run in by.items():
        label = TRANSPORT_LABEL.get(transport, transport)
        lines += [f"## Over {label}", ""]
        lines += system_table(run["systems"], run["ratios"])
        lines += rounds_lines(run["systems"])
        lines += rounds_lines(run["systems"], "enqueue_single")
        lines += versus_lines(run["systems"], label)
    lines += ["## Ceiling (same server, same run)", ""]
    if loop:
        lp = ceiling["loop"]
        lines.append(
            f"- ceiling loop (Lua claim-{lp.get('batch', 100)} into a leased ZSET + "
            f"pipelined ZREM per id, redis-py {lp.get('redis_py', '?')}): "
            f"**{fmt(loop)} jobs/s** over {lp.get('n')} ids"
        )
    elif ceiling.get("loop"):
        lines.append(f"- ceiling loop failed: {ceiling['loop'].get('error')}")
    em = ceiling.get("enqueue_model", {})
    if em.get("jobs_per_s"):
        lines.append(
            f"- pipelined enqueue model ({em.get('model')}, redis-py {em.get('redis_py', '?')}): "
            f"**{fmt(em['jobs_per_s'])} jobs/s** over {em.get('n')} jobs"
        )
    elif em:
        lines.append(f"- pipelined enqueue model failed: {em.get('error')}")
    for k, v in ceiling.get("redis_benchmark", {}).items():
        lines.append(
            f"- redis-benchmark {k}: {fmt(v) if isinstance(v, float) else v}"
            + (" req/s" if isinstance(v, float) else "")
        )
    lines += claim_latency_lines(results) + targets_lines(results)
    lines += ["", "## How each system was driven", ""]
    first = next(iter(by.values()))["systems"]
    for name, e in first.items():
        meta = e.get("meta") or {}
        settings = meta.get("settings", {})
        extra = {k: v for k, v in meta.items() if k not in ("settings", "version", "transport")}
        desc = "; ".join(f"{k}: {v}" for k, v in settings.items())
        if e["status"] != "ok":
            desc = f"{e['status']}: {e.get('reason', '')}"
        lines.append(f"- **{name}** {meta.get('version', '')} {json.dumps(extra)} — {desc}")
    inst = results.get("install", {})
    failed = {k: v for k, v in inst.items() if not v.get("ok")}
    lines += ["", "## Install status", ""]
    lines += [
        f"- {k}: {' '.join(v.get('requirements', []))} in {v.get('venv')} — "
        + ("ok" if v.get("ok") else f"FAILED: {v.get('reason')}")
        for k, v in inst.items()
    ]
    if not failed:
        lines.append("- all peers installed")
    lines += ["", "## Figures this run does not measure", "", *OTHER_FIGURES, ""]
    return "\n".join(lines)


# Issue 16's figures that come from other benches (their results are committed beside this file).
OTHER_FIGURES = [
    "- Steady memory of finished jobs at 1,500 jobs/s, result TTL 60 s, two workers: 34.7 MB, "
    "387 B per retained job (82.5 MB / 939 B with keep_payload); `python bench/retention_soak.py "
    "--rate 1500 --seconds 300 --workers 2 --result-ttl-ms 60000` (docs/performance.md section "
    "11; bench/results/retention_soak_*.json; measured 2026-12-01)",
    "- 2,000 due at once by worker concurrency 16 / 64 / 256, p99 (medians of 2; the machine "
    "noisy: the floor at 16 measured 278 and 607 ms in the two repeats): ours 373 / 370 / 538 "
    "ms, bullmq-node 790 / 370 / 481 ms, 0 early; the bench handler alone in one process, no "
    "scheduler (handler-floor: the least any one-process Python worker can do here) 442 / 156 / "
    "466 ms: `cd bench && python spike_concurrency.py --concurrency 16,64,256 --repeat 2` "
    "(section 15; spike_concurrency_20261201T2253.json)",
    "- Drain per job, ours vs bullmq-node, 3 interleaved pairs: 1.19-1.25x jobs/s, worker CPU "
    "50.5-56 vs 62-68 us/job, Redis CPU 42.5-45 vs 52.8-59.5: `python bench/profile_drain.py "
    "drain --system ours|bullmq-node --n 20000`; server time per transition: `python "
    "bench/claim_ab.py --rev <rev>`, `python bench/lua_ab.py --rev <rev>` (section 13)",
    "- Memory per pending job, tiny payload: 278 B (target 250: not met; one hash of records "
    "per queue would take 253); `python bench/memory_layouts.py --api-only --n 10000` "
    "(sections 8, 14, 15)",
    "- Issue 16's targets over three quick runs at 7d5fa25 (unix / tcp each): drain 1.08-1.17x "
    "bullmq-node, single enqueue 0.58-0.95x huey, bulk 0.71-1.24x the pipelined model, 2,000 at "
    "once p99 154-279 ms (<= 200 in four of six), 354 B per pending job: `python bench/run.py "
    "--quick --systems ours,bullmq-node,huey --transport both --sizes drain=20000,"
    "simultaneous=2000,enqueue_single=5000,enqueue_bulk=20000,memory=10000` (section 15; "
    "bench/results/20261201T224341.json, ...224519.json, ...224657.json)",
]


def claim_latency_lines(results: dict[str, Any]) -> list[str]:
    rows = [r for r in results.get("claim_latency", []) if r.get("bench") == "claim_latency"]
    if not rows:
        return []
    out = [
        "",
        "## Our claim latency as the backlog grows (claim of 100, one round trip)",
        "",
        "| pending jobs | p50 ms | p99 ms |",
        "|---|---|---|",
    ]
    out += [f"| {r['backlog']:,} | {r['p50_ms']} | {r['p99_ms']} |" for r in rows]
    ratio = rows[-1]["p50_ms"] / rows[0]["p50_ms"]
    out.append(
        f"\np50 at {rows[-1]['backlog']:,} / p50 at {rows[0]['backlog']:,}: **{ratio:.2f}x**"
    )
    return out


def count_s(n: object) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def targets_lines(results: dict[str, Any]) -> list[str]:
    """Where ours stands against the project's targets (issue 16), from this run's numbers only."""
    by = by_transport(results)
    if not any(
        run["systems"].get("ours", {}).get("status") in ("ok", "partial") for run in by.values()
    ):
        return []
    lat = [r for r in results.get("claim_latency", []) if r.get("bench") == "claim_latency"]
    lat_ratio = lat[-1]["p50_ms"] / lat[0]["p50_ms"] if len(lat) > 1 else None
    model = results.get("ceiling", {}).get("enqueue_model", {}).get("jobs_per_s")

    def row(what: str, value: str, ok: bool | None) -> str:
        return f"| {what} | {value} | {'met' if ok else 'not met' if ok is not None else '?'} |"

    def r2(x: float | None) -> str:
        return "?" if x is None else f"{x:.2f}x"

    out = ["", "## Targets (from this run)", "", "| target | this run | |", "|---|---|---|"]
    mem_done = False
    for transport, run in by.items():
        ours = run["systems"].get("ours", {})
        if ours.get("status") not in ("ok", "partial"):
            continue
        tl = TRANSPORT_LABEL.get(transport, transport)
        to_best = run["ratios"].get("to_best_peer", {}).get("ours", {})
        ref = run["systems"].get(VERSUS, {})
        d_ours, d_ref = metric(ours, "drain", "jobs_per_s"), metric(ref, "drain", "jobs_per_s")
        d_vs = d_ours / d_ref if d_ours is not None and d_ref else None
        out.append(row(f"[{tl}] drain >= {VERSUS}", r2(d_vs), None if d_vs is None else d_vs >= 1))
        single = to_best.get("enqueue_single")
        out.append(
            row(
                f"[{tl}] single enqueue >= the best peer's",
                r2(single),
                None if single is None else single >= 1,
            )
        )
        bulk = metric(ours, "enqueue_bulk", "jobs_per_s")
        b_vs = bulk / model if bulk is not None and model else None
        out.append(
            row(
                f"[{tl}] bulk enqueue >= 80% of the pipelined enqueue model (unix)",
                f"{r2(b_vs)} ({fmt(bulk)} / {fmt(model)})",
                None if b_vs is None else b_vs >= 0.8,
            )
        )
        sim = ours.get("workloads", {}).get("simultaneous", {})
        sim = sim.get("result", sim)
        p99 = sim.get("p99_ms")
        out.append(
            row(
                f"[{tl}] {count_s(sim.get('n'))} jobs due at one instant: p99 lateness <= 200 ms, "
                "none early",
                f"p99 {fmt(p99)} ms, max {fmt(sim.get('max_ms'))} ms, "
                f"early {sim.get('early', '?')}",
                None if p99 is None else p99 <= 200 and sim.get("early") == 0,
            )
        )
        mem = metric(ours, "memory", "bytes_per_job")
        if not mem_done and mem is not None:
            mem_done = True
            out.append(
                row(
                    "memory per pending job <= 400 B (90-byte JSON payload)",
                    f"{fmt(mem)} B",
                    mem <= 400,
                )
            )
    out.append(
        row(
            f"claim latency at {count_s(lat[-1]['backlog'] if lat else None)} pending "
            "within 1.2x of 1,000",
            r2(lat_ratio),
            None if lat_ratio is None else lat_ratio <= 1.2,
        )
    )
    return out


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes; finishes in < 2 min")
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)}",
    )
    ap.add_argument("--out", default=str(BENCH / "results"))
    ap.add_argument("--chart", default=str(ROOT / "docs" / "bench.png"))
    ap.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="override every worker's concurrency (default: each library's own)",
    )
    ap.add_argument(
        "--transport",
        choices=sorted(TRANSPORTS),
        default="both",
        help="how every system reaches the private server: unix socket, tcp 127.0.0.1, or both "
        "(each system runs once per transport; the report has one table each)",
    )
    ap.add_argument(
        "--sizes",
        default="",
        help="override sizes, e.g. drain=5000,simultaneous=2000 (keys as in FULL/QUICK)",
    )
    ap.add_argument(
        "--ours-src",
        default="",
        help="directory holding the scheduler/ (and lua/) to bench as 'ours', e.g. a git archive "
        "of one commit (default: the installed package)",
    )
    ap.add_argument("--reinstall", action="store_true", help="re-run pip / npm ci for every peer")
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument(
        "--drain-rounds",
        type=int,
        default=3,
        help="drains per system per transport (default 3): after the normal pass, N-1 more "
        "drain-only rounds over every system whose drain succeeded, interleaved (round r drains "
        "each system in turn); the reported drain jobs/s is the median of the rounds. 1 = one "
        "drain per system",
    )
    ap.add_argument(
        "--enqueue-rounds",
        type=int,
        default=3,
        help="single-enqueue runs per system per transport (default 3), interleaved as the "
        "drain rounds; the reported single enqueue jobs/s is their median (one run moved 2x "
        "between minutes here). 1 = one run per system",
    )
    opts = ap.parse_args()
    if opts.drain_rounds < 1:
        ap.error("--drain-rounds must be >= 1")
    if opts.enqueue_rounds < 1:
        ap.error("--enqueue-rounds must be >= 1")
    wanted = [s.strip() for s in opts.systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SYSTEMS + OURS_VARIANTS]
    if unknown:
        ap.error(f"unknown systems: {unknown}; known: {SYSTEMS + OURS_VARIANTS}")
    sizes = dict(QUICK if opts.quick else FULL)
    for item in filter(None, (x.strip() for x in opts.sizes.split(","))):
        key, _, val = item.partition("=")
        if key not in sizes or not val.isdigit() or int(val) <= 0:
            ap.error(f"--sizes: bad item {item!r}; keys: {','.join(sizes)}")
        sizes[key] = int(val)
    transports = TRANSPORTS[opts.transport]
    # --ours-src: import "ours" (driver, worker, claim latency) from another tree, e.g. a
    # `git archive` of one commit, while the working tree is mid-change.
    ours_env: dict[str, str] | None = None
    if opts.ours_src:
        src = Path(opts.ours_src).resolve()
        if not (src / "scheduler" / "__init__.py").is_file():
            ap.error(f"--ours-src {src}: no scheduler/__init__.py there")
        ours_env = {
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(src), os.environ.get("PYTHONPATH", "")])
            )
        }
    t_start = time.monotonic()
    install = ensure_venvs([s for s in wanted if s in PEERS], opts.reinstall)
    install.update(ensure_node([s for s in wanted if s in NODE_PEERS], opts.reinstall))
    log(f"venvs ready in {time.monotonic() - t_start:.1f}s")
    peers_py = venv_python("peers")
    # ceiling.py needs only redis-py: without the peers venv (no Python peer asked for) it runs
    # in this interpreter; the result records which redis-py it used.
    ceiling_py = str(peers_py) if peers_py.exists() else sys.executable
    timeout = 45.0 if opts.quick else 600.0
    # Larger simultaneous/drain sizes than the quick defaults need a longer driver timeout.
    timeout = max(timeout, 30.0 + sizes["simultaneous"] / 50 + sizes["drain"] / 100)
    if opts.quick:
        groups = [CLIENT_ONLY, ["drain"], ["simultaneous"]]
    else:
        groups = [[w] for w in [*CLIENT_ONLY, "drain", "simultaneous"]]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    results: dict[str, Any] = {
        "timestamp": stamp,
        "quick": opts.quick,
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "sizes": {k: v for k, v in sizes.items()},
        "delay_s": DELAY_S,
        "drain_rounds": opts.drain_rounds,
        "enqueue_rounds": opts.enqueue_rounds,
        "transports": transports,
        "ours_src": str(Path(opts.ours_src).resolve()) if opts.ours_src else "",
        "install": install,
        "systems": {},
        "by_transport": {},
        "ceiling": {},
    }
    with tempfile.TemporaryDirectory(prefix="benchpids") as piddir, private_server() as server:
        pidfile = Path(piddir) / "pids"
        pidfile.write_text("")
        results["redis"] = {
            "version": server.cli("INFO", "server").split("redis_version:")[1].split()[0],
            "transport": " and ".join(
                "unix socket" if t == "unix" else "tcp 127.0.0.1" for t in transports
            ),
        }
        log(f"private redis-server at {server.url} (tcp {server.port})")
        for transport in transports:
            systems: dict[str, Any] = {}
            results["by_transport"][transport] = {"systems": systems}
            pythons: dict[str, str] = {}

            def run_groups(
                name: str,
                wls: list[list[str]],
                pythons: dict[str, str] = pythons,
                transport: str = transport,
            ) -> dict[str, Any]:
                """run_system for `name` (its interpreter in `pythons`) over this transport
                (bound as defaults: this function is made anew for each transport)."""
                return run_system(
                    name,
                    pythons[name],
                    wls,
                    sizes,
                    server,
                    timeout,
                    pidfile,
                    opts.concurrency,
                    transport,
                    ours_env if name == "ours" or name in OURS_VARIANTS else None,
                )

            for name in wanted:
                log(f"system {name} over {transport}")
                if name == "ours" or name in OURS_VARIANTS:
                    if not (BENCH / "systems" / "ours.py").exists():
                        systems[name] = {
                            "status": "skipped",
                            "reason": "driver missing",
                            "workloads": {},
                        }
                        log("  skipped: driver missing")
                        continue
                    py = sys.executable
                elif not install.get(name, {}).get("ok"):
                    systems[name] = {
                        "status": "failed",
                        "workloads": {},
                        "reason": f"install failed: {install.get(name, {}).get('reason')}",
                    }
                    continue
                elif name in NODE_PEERS:
                    py = sys.executable  # the shim needs only redis-py; the work runs in node
                else:
                    py = str(venv_python(PEERS[name].venv))
                pythons[name] = py
                systems[name] = run_groups(name, groups)
            # One drain or single-enqueue figure per system is too few on this shared machine
            # (bullmq-node's own drain moved 7.8k-11.4k jobs/s between back-to-back runs; our
            # single enqueue 2.1k-4.0k within one run): N-1 more rounds of each, interleaved so
            # that every system sees the same minutes; the median is reported.
            for workload, n_rounds in (
                ("drain", opts.drain_rounds),
                ("enqueue_single", opts.enqueue_rounds),
            ):
                done = [n for n in pythons if systems[n]["workloads"].get(workload, {}).get("ok")]
                rounds = {n: [systems[n]["workloads"][workload]] for n in done}
                for r in range(2, n_rounds + 1):
                    for name in done:
                        log(f"{workload} round {r}/{n_rounds}: {name} over {transport}")
                        extra = run_groups(name, [[workload]])
                        rounds[name].append(extra["workloads"][workload])
                if n_rounds > 1:
                    for name, rows in rounds.items():
                        merged = merge_rounds(rows, workload)
                        systems[name]["workloads"][workload] = merged
                        vals = merged["result"]["rounds"]
                        log(f"  {name}[{transport}].{workload} rounds (jobs/s): {vals}")
        if not opts.no_ceiling:
            log("ceiling: redis-benchmark")
            server.cli("FLUSHALL")
            results["ceiling"]["redis_benchmark"] = redis_benchmark(
                server, sizes["redis_benchmark"]
            )
            for label, mode, n in (
                ("loop", "claim", sizes["ceiling_loop"]),
                ("enqueue_model", "enqueue", sizes["enqueue_bulk"]),
            ):
                log(f"ceiling: {mode} model")
                rows, err = run_json(
                    [
                        ceiling_py,
                        str(BENCH / "ceiling.py"),
                        json.dumps({"url": server.url, "n": n, "mode": mode}),
                    ],
                    timeout,
                    pidfile,
                )
                results["ceiling"][label] = rows[-1] if rows else {"error": err}
        if "ours" in wanted and (BENCH / "systems" / "ours.py").exists():
            # Its own private server: a million pending jobs should not share memory with the rest.
            log("ours: claim latency vs backlog")
            rows, err = run_json(
                [
                    sys.executable,
                    str(BENCH / "claim_latency.py"),
                    "--max",
                    str(sizes["claim_latency_max"]),
                    "--rounds",
                    "50" if opts.quick else "200",
                ],
                timeout,
                pidfile,
                ours_env,
            )
            results["claim_latency"] = rows if rows else [{"error": err}]
    for run in results["by_transport"].values():
        run["ratios"] = compute_ratios({**results, "systems": run["systems"]})
    # Top-level "systems"/"ratios" (read by chart.py) are the first transport's.
    results["systems"] = results["by_transport"][transports[0]]["systems"]
    results["ratios"] = compute_ratios(results)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stamp}.json"
    json_path.write_text(json.dumps(results, indent=1))
    (out / "latest.md").write_text(markdown(results))
    log(f"wrote {json_path} and {out / 'latest.md'}")
    try:
        chart = subprocess.run(
            [str(peers_py), str(BENCH / "chart.py"), str(json_path), opts.chart],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if chart.returncode == 0:
            log(f"wrote {opts.chart}")
        else:
            log(f"chart failed: {chart.stderr.strip().splitlines()[-1:]}")
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"chart failed: {exc}")
    log(f"total {time.monotonic() - t_start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
