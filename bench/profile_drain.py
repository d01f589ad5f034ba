"""Per-job CPU budget of a drain: worker CPU, Redis CPU and Redis command time per job.

    python bench/profile_drain.py drain --system ours|bullmq-node [--n 20000] [--transport unix|tcp]
        [--concurrency C] [--py-spy out.txt]
    python bench/profile_drain.py transitions [--n 20000] [--batch 100]
    python bench/profile_drain.py stacks out.txt [--cpu-us-per-job X]

drain: n pending jobs (the bench payload), then one worker process started as bench/run.py
starts it (the same handler: INCR through its own client). Between the first and the last
completion seen it reads the worker's CPU time (/proc/<pid>/stat, the whole process group for
node) and the server's (INFO cpu), and INFO commandstats, so every figure is per job. With
--py-spy (ours only) it samples the worker with `py-spy record --format raw --nonblocking`.

transitions (ours only, no worker): each transition alone on a fresh queue through the public
sync API -- enqueue one job per call (at most 5,000), enqueue_many, claim of --batch,
heartbeat of --batch leases, complete_many of --batch -- with the Redis time per job from INFO
commandstats (usec of EVALSHA / jobs).

stacks: rolls a py-spy raw file up into the budget's rows (phase of the worker, and library),
as % of samples and, given the measured CPU us/job, as us per job.

Starts its own private redis-server through scheduler/_spawn.py, the one spawner (loaded from
this checkout by path, so it works with PYTHONPATH on an old snapshot); never touches 6379.
Prints one JSON object. Needs redis-py; "ours" also needs the scheduler package (PYTHONPATH may
point at a snapshot: a `git archive` of the commit to profile).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common as c  # noqa: E402

TICKS_S = os.sysconf("SC_CLK_TCK")


def _load_spawner() -> Any:
    """scheduler/_spawn.py of THIS checkout, loaded by its path: the one Redis spawner, even when
    PYTHONPATH points the scheduler package at an older snapshot (which may lack _spawn)."""
    path = BENCH.parent / "scheduler" / "_spawn.py"
    spec = importlib.util.spec_from_file_location("_profile_drain_spawn", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # before exec: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_spawn = _load_spawner()


@contextlib.contextmanager
def server() -> Iterator[tuple[str, str]]:
    """(unix url, tcp url) of a throw-away redis-server (scheduler/_spawn.py: temp dir, unix
    socket + a free 127.0.0.1 port, no persistence); never 6379."""
    binary = _spawn.redis_server_binary()
    if binary is None:
        raise RuntimeError("profile_drain needs redis-server on PATH (apt-get install it)")
    with _spawn.RedisProcess(binary, tcp=True) as proc:
        yield proc.url, proc.tcp_url


def group_cpu_s(pgid: int) -> float:
    """utime + stime of every process in a process group (node has helper threads/processes)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 (pgrp), after pid and comm
                total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS_S


def redis_cpu_s(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def commandstats(r: Any) -> dict[str, dict[str, float]]:
    raw: dict[str, Any] = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): {"calls": v["calls"], "usec": v["usec"]}
            for k, v in raw.items()}  # fmt: skip


def per_job(before: dict[str, Any], after: dict[str, Any], jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cmd, a in after.items():
        b = before.get(cmd, {"calls": 0, "usec": 0})
        calls, usec = a["calls"] - b["calls"], a["usec"] - b["usec"]
        if calls <= 0:
            continue
        out[cmd] = {
            "calls_per_job": round(calls / jobs, 4),
            "usec_per_call": round(usec / calls, 2),
            "usec_per_job": round(usec / jobs, 3),
        }
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["usec_per_job"]))


# --------------------------------------------------------------------------- drain


def drain(opts: argparse.Namespace) -> dict[str, Any]:
    with server() as (unix_url, tcp_url):
        url = tcp_url if opts.transport == "tcp" else unix_url
        os.environ[c.ENV_URL] = url
        r = c.client(url)
        if opts.system == "ours":
            from systems import ours as mod

            conc = opts.concurrency or mod.CONCURRENCY
            cmd = mod._worker_cmd(url, conc)
        else:
            from systems import bullmq_node as mod  # type: ignore[no-redef]

            conc = opts.concurrency or mod.CONCURRENCY
            cmd = mod._worker_cmd(url, conc)
        mod.pending(url, opts.n)
        r.config_resetstat()
        spy: subprocess.Popen[bytes] | None = None
        with c.running(f"profile-{opts.system}", cmd, url) as proc:
            # As c.wait_count, plus CPU and command counters at the first completion seen.
            deadline = time.monotonic() + 60 + opts.n / 100
            t0 = cpu0 = rcpu0 = 0.0
            c0 = 0
            stats0: dict[str, Any] = {}
            done = 0
            while time.monotonic() < deadline:
                done = c.count(r)
                if done and not t0:
                    t0, c0 = time.perf_counter(), done
                    cpu0, rcpu0, stats0 = group_cpu_s(proc.pid), redis_cpu_s(r), commandstats(r)
                    if opts.py_spy:  # from the first completion: no import-time samples
                        spy = subprocess.Popen(
                            [shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
                             "record", "--pid", str(proc.pid), "--rate", str(opts.rate),
                             "--format", "raw", "--nonblocking", "-o", opts.py_spy],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        )  # fmt: skip
                if done >= opts.n or proc.poll() is not None:
                    break
                time.sleep(0.002)
            t1 = time.perf_counter()
            cpu1, rcpu1, stats1 = group_cpu_s(proc.pid), redis_cpu_s(r), commandstats(r)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                _, err = spy.communicate(timeout=60)
                if spy.returncode not in (0, -signal.SIGINT):
                    print(err.decode(errors="replace")[-500:], file=sys.stderr)
        if done < opts.n:
            raise RuntimeError(f"only {done}/{opts.n} done: {c.log_tail(f'profile-{opts.system}')}")
        jobs = done - c0
        return {
            "system": opts.system,
            "transport": opts.transport,
            "n": opts.n,
            "concurrency": conc,
            "measured_jobs": jobs,
            "jobs_per_s": round(jobs / (t1 - t0), 1),
            "worker_cpu_us_per_job": round((cpu1 - cpu0) / jobs * 1e6, 1),
            "worker_cpu_utilisation": round((cpu1 - cpu0) / (t1 - t0), 3),
            "redis_cpu_us_per_job": round((rcpu1 - rcpu0) / jobs * 1e6, 1),
            "redis_commands": per_job(stats0, stats1, jobs),
            "py_spy": opts.py_spy or None,
        }


# --------------------------------------------------------------------------- transitions


def transitions(opts: argparse.Namespace) -> dict[str, Any]:
    from scheduler import JobSpec, Queue

    n, batch = opts.n, opts.batch
    out: dict[str, Any] = {"n": n, "batch": batch, "per_job": {}}
    with server() as (url, _):
        r = c.client(url)
        q = Queue.from_url(url, c.QUEUE)

        def measure(label: str, fn: Any, jobs: int) -> Any:
            s0, cpu0, t0 = commandstats(r), redis_cpu_s(r), time.perf_counter()
            res = fn()
            t1, cpu1, s1 = time.perf_counter(), redis_cpu_s(r), commandstats(r)
            cmds = per_job(s0, s1, jobs)
            cmds.pop("info", None)
            out["per_job"][label] = {
                "client_wall_us_per_job": round((t1 - t0) / jobs * 1e6, 2),
                "redis_cpu_us_per_job": round((cpu1 - cpu0) / jobs * 1e6, 2),
                "redis_usec_per_job": round(sum(v["usec_per_job"] for v in cmds.values()), 3),
                "commands": cmds,
            }
            return res

        single = min(n, 5000)
        measure(
            "enqueue (one call per job)",
            lambda: [q.enqueue("task", c.payload(i)) for i in range(single)],
            single,
        )
        measure(
            "enqueue_many (batches of 1000)",
            lambda: q.enqueue_many([JobSpec("task", c.payload(i)) for i in range(n)]),
            n,
        )

        def claim_all() -> list[Any]:
            got: list[Any] = []
            while True:
                b = q.claim("profile", limit=batch, lease_ms=60_000)
                if not b.jobs:
                    return got
                got.extend(b.jobs)

        jobs = measure(f"claim (limit {batch})", claim_all, n + single)
        leases = [(j.id, j.token) for j in jobs]
        chunks = [leases[i : i + batch] for i in range(0, len(leases), batch)]
        measure(
            f"heartbeat ({batch} leases per call)",
            lambda: [q.heartbeat(ch, lease_ms=60_000) for ch in chunks],
            len(leases),
        )
        measure(
            f"complete_many ({batch} per call)",
            lambda: [q.complete_many([(i, t, None) for i, t in ch]) for ch in chunks],
            len(leases),
        )
    return out


def handler(opts: argparse.Namespace) -> dict[str, Any]:
    """CPU per job of the bench handler alone (one INCR through redis.asyncio, --concurrency
    tasks at a time on the worker's event loop): the part of a drain's worker CPU that is the
    handler's, not the scheduler's."""
    import asyncio

    import redis.asyncio as aredis

    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    out: dict[str, Any] = {"n": opts.n, "concurrency": opts.concurrency, "rows": {}}
    with server() as (unix_url, tcp_url):
        url = tcp_url if opts.transport == "tcp" else unix_url
        for label, kw in (("redis-py default (socket_timeout as shipped)", {}),
                          ("socket_timeout=None", {"socket_timeout": None})):  # fmt: skip

            async def main(kw: dict[str, Any] = kw) -> tuple[float, float]:
                # As bench/systems/ours.py: redis-py 8's pool cap of 100 follows the concurrency.
                r = aredis.Redis.from_url(url, max_connections=max(100, 2 * opts.concurrency), **kw)
                await r.incr(c.COUNTER)
                left = opts.n

                async def one() -> None:
                    nonlocal left
                    while left > 0:
                        left -= 1
                        await c.handle_async(r, c.payload(0))

                cpu0, t0 = time.process_time(), time.perf_counter()
                await asyncio.gather(*(one() for _ in range(opts.concurrency)))
                cpu1, t1 = time.process_time(), time.perf_counter()
                await r.aclose()
                return cpu1 - cpu0, t1 - t0

            cpu_s, wall_s = run(main())
            out["rows"][label] = {
                "cpu_us_per_job": round(cpu_s / opts.n * 1e6, 1),
                "jobs_per_s": round(opts.n / wall_s, 1),
            }
        if shutil.which("node"):
            from systems import bullmq_node

            got = bullmq_node._call(
                "handler", {"url": url, "n": opts.n, "concurrency": opts.concurrency}
            )
            out["rows"]["node: ioredis (bullmq-node's handler)"] = {
                k: round(float(v), 1) for k, v in got.items()
            }
    return out


def enqueue(opts: argparse.Namespace) -> dict[str, Any]:
    """Client CPU and Redis time per single enqueue (Queue.enqueue), with cProfile's top rows."""
    import cProfile
    import pstats

    from scheduler import Queue

    n = opts.n
    with server() as (unix_url, tcp_url):
        url = tcp_url if opts.transport == "tcp" else unix_url
        r = c.client(url)
        q = Queue.from_url(url, c.QUEUE)
        q.enqueue("task", c.payload(-1))  # connect, load the script
        r.config_resetstat()
        s0, cpu0, t0 = commandstats(r), time.process_time(), time.perf_counter()
        for i in range(n):
            q.enqueue("task", c.payload(i))
        t1, cpu1, s1 = time.perf_counter(), time.process_time(), commandstats(r)
        cmds = per_job(s0, s1, n)
        cmds.pop("info", None)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(n):
            q.enqueue("task", c.payload(i))
        prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]  # type: ignore[attr-defined]
    return {
        "n": n,
        "transport": opts.transport,
        "calls_per_s": round(n / (t1 - t0), 1),
        "wall_us_per_call": round((t1 - t0) / n * 1e6, 1),
        "client_cpu_us_per_call": round((cpu1 - cpu0) / n * 1e6, 1),
        "redis_script_usec_per_call": cmds.get("evalsha", {}).get("usec_per_call"),
        "redis_commands": cmds,
        "cprofile_top_by_self_time": [
            {
                "function": f"{Path(fn[0]).name}:{fn[1]}:{fn[2]}",
                "calls_per_enqueue": round(v[1] / n, 2),
                "self_us_per_enqueue": round(v[2] / n * 1e6, 2),
            }
            for fn, v in rows
        ],
    }


# --------------------------------------------------------------------------- stacks

# Worker phase: the first key of this list found anywhere in a stack names its phase (so a
# json.loads inside _start counts as "job start", the handler's INCR as "handler body").
# With uvloop, a coroutine resumed from C shows only its own frames: redis-py's
# `_send_packed_command` run inside asyncio.wait_for (a Task of its own per command when the
# client has a socket_timeout) has no caller frames, hence its own row.
# Qualified names as py-spy prints them: the worker is mixins (scheduler/worker/*.py), so a
# method's frame names its module's class (Dispatch, Claiming, Reporting), not Worker.
PHASES: list[tuple[str, str]] = [
    ("_heartbeat_loop", "heartbeat (+ counts, worker_beat)"),
    ("_waker_loop", "waker (BLPOP)"),
    ("parse_claim", "claim: reply parse (codec.parse_claim -> ClaimedJob)"),
    ("Dispatch._start ", "job start (_start: JobContext, Running, json.loads, metrics)"),
    ("Reporting._completed ", "complete: bookkeeping per job (_completed: metrics)"),
    ("Reporting._send_reports ", "complete: encode, send, parse (_send_reports)"),
    ("Dispatch._finish ", "finish (_finish/_end: metrics, next job from backlog)"),
    ("handle_async ", "handler body (bench: INCR via redis.asyncio)"),
    ("task (systems/ours.py", "handler body (bench: INCR via redis.asyncio)"),
    ("Dispatch._run_async ", "handler dispatch (_run_async)"),
    ("Dispatch._run ", "handler dispatch (_run: create_task)"),
    ("Claiming._claim_loop ", "claim: request, send, receive (_claim_loop)"),
    ("Reporting._reporter_loop ", "complete: reporter loop"),
    ("wait_for (", "redis-py send inside asyncio.wait_for (socket_timeout; any client)"),
    ("_send_packed_command ", "redis-py send inside asyncio.wait_for (socket_timeout; any client)"),
    ("Runner.run ", "event loop (uvloop C code: epoll, reads, callbacks, task steps)"),
]
# Library of the innermost frame.
LIBS: list[tuple[str, str]] = [
    ("prometheus_client", "metrics (prometheus_client)"),
    ("scheduler/worker/metrics.py", "metrics (plain counts)"),
    ("logging/", "logging"),
    ("scheduler/worker/logs.py", "logging"),
    ("json/", "json"),
    ("hiredis", "redis-py (parser)"),
    ("redis/_parsers", "redis-py (parser)"),
    ("redis/", "redis-py (commands, connection, pipeline)"),
    ("asyncio/", "asyncio (python part)"),
    ("uvloop", "event loop (uvloop)"),
    ("scheduler/", "scheduler package"),
    ("systems/", "bench handler"),
    ("common.py", "bench handler"),
]


def stacks(opts: argparse.Namespace) -> dict[str, Any]:
    phases: Counter[str] = Counter()
    libs: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in Path(opts.file).read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        k = int(count_s)
        total += k
        frames = stack.split(";")
        phase = next(
            (name for key, name in PHASES if any(key in f for f in frames)),
            "other (callbacks without a worker frame)",
        )
        phases[phase] += k
        leaf = frames[-1]
        libs[next((name for key, name in LIBS if key in leaf), "other")] += k
        leaves[leaf] += k
    cpu = opts.cpu_us_per_job

    def table(cnt: Counter[str]) -> list[dict[str, Any]]:
        return [
            {
                "row": name,
                "pct": round(100 * v / total, 1),
                **({"us_per_job": round(cpu * v / total, 1)} if cpu else {}),
            }
            for name, v in cnt.most_common()
        ]

    return {
        "samples": total,
        "by_phase": table(phases),
        "by_library": table(libs),
        "top_leaves": table(Counter(dict(leaves.most_common(25)))),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drain")
    d.add_argument("--system", choices=["ours", "bullmq-node"], default="ours")
    d.add_argument("--n", type=int, default=20000)
    d.add_argument("--transport", choices=["unix", "tcp"], default="unix")
    d.add_argument("--concurrency", type=int, default=None)
    d.add_argument("--py-spy", default="", help="write py-spy raw stacks here (ours only)")
    d.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    t = sub.add_parser("transitions")
    t.add_argument("--n", type=int, default=20000)
    t.add_argument("--batch", type=int, default=100)
    h = sub.add_parser("handler")
    h.add_argument("--n", type=int, default=20000)
    h.add_argument("--concurrency", type=int, default=16)
    h.add_argument("--transport", choices=["unix", "tcp"], default="unix")
    e = sub.add_parser("enqueue")
    e.add_argument("--n", type=int, default=5000)
    e.add_argument("--transport", choices=["unix", "tcp"], default="unix")
    s = sub.add_parser("stacks")
    s.add_argument("file")
    s.add_argument("--cpu-us-per-job", type=float, default=0.0)
    opts = ap.parse_args()
    fn = {"drain": drain, "transitions": transitions, "handler": handler, "enqueue": enqueue,
          "stacks": stacks}[opts.cmd]  # fmt: skip
    print(json.dumps(fn(opts), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
