"""Run one workload (or several, comma-separated) of one system; print one JSON line each.

    python bench/driver.py <system> <workload[,workload...]> '<json args>'

json args: {"url": "unix:///.../r.sock", "tcp_url": "redis://127.0.0.1:PORT/0", "n": 1000,
            "sizes": {"<workload>": n, ...}, "delay_s": 2.0, "concurrency": null}
("sizes" overrides "n" per workload; optional "transport": "unix" | "tcp" picks the URL.)

Workloads: meta, enqueue_single, enqueue_bulk, drain, simultaneous, memory.
Each output line is {"system", "workload", "ok", "result" | "error", "elapsed_s"}.
See bench/README.md for the functions a ``systems/<name>.py`` module provides.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c

WORKLOADS = ("meta", "enqueue_single", "enqueue_bulk", "drain", "simultaneous", "memory")


class Unsupported(Exception):
    """A system cannot run this workload (reported with the reason, not as a failure)."""


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    out = fn(*args)
    if inspect.isawaitable(out):
        return asyncio.run(_await(out))
    return out


async def _await(aw: Any) -> Any:
    return await aw


def _fn(mod: ModuleType, name: str) -> Callable[..., Any]:
    fn = getattr(mod, name, None)
    if fn is None:
        reason = getattr(mod, "UNSUPPORTED", {}).get(name, f"{name}() not provided by driver")
        raise Unsupported(reason)
    return fn  # type: ignore[no-any-return]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def run_workload(mod: ModuleType, workload: str, url: str, args: dict[str, Any]) -> dict[str, Any]:
    n = int(args.get("sizes", {}).get(workload, args.get("n", 1000)))
    if workload == "meta":
        info = dict(_call(_fn(mod, "meta")))
        info.setdefault("transport", args.get("_transport", getattr(mod, "TRANSPORT", "unix")))
        info.setdefault("python", sys.version.split()[0])
        return info
    c.reset(url)
    if workload in ("enqueue_single", "enqueue_bulk"):
        seconds = float(_call(_fn(mod, workload), url, n))
        r = c.client(url)
        return {
            "n": n,
            "seconds": seconds,
            "jobs_per_s": n / seconds,
            "queued_keys": int(r.dbsize()),
        }
    if workload == "drain":
        conc = args.get("concurrency")
        rate = float(_call(_fn(mod, "drain"), url, n, conc))
        return {"n": n, "jobs_per_s": rate, "concurrency": conc}
    if workload == "simultaneous":
        delay = float(args.get("delay_s", 2.0))
        late = [float(x) for x in _call(_fn(mod, "simultaneous"), url, n, delay)]
        return {
            "n": n,
            "delay_s": delay,
            "started": len(late),
            "first_ms": min(late),
            "p50_ms": statistics.median(late),
            "p99_ms": percentile(late, 0.99),
            "max_ms": max(late),
            "early": sum(1 for x in late if x < 0),
        }
    if workload == "memory":
        if hasattr(mod, "memory_per_job"):
            per_job = float(_call(mod.memory_per_job, url, n))
        else:
            r = c.client(url)
            before = c.memory_baseline(r)
            _call(_fn(mod, "pending"), url, n)
            after = c.memory_baseline(r)
            per_job = (after - before) / n
        return {"n": n, "bytes_per_job": per_job}
    raise Unsupported(f"unknown workload {workload!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    system, workloads, raw = argv[1], argv[2].split(","), argv[3]
    args: dict[str, Any] = json.loads(raw)
    # Modules that configure their library at import time read the URL from the environment.
    os.environ[c.ENV_URL] = args["url"]
    try:
        # System names may hold dashes (bullmq-node); module names use underscores.
        mod = importlib.import_module(f"systems.{system.replace('-', '_')}")
        import_error = ""
    except ModuleNotFoundError as exc:
        missing = exc.name == f"systems.{system.replace('-', '_')}"
        import_error = "driver missing" if missing else f"import failed: {exc}"
    except Exception as exc:
        import_error = f"import failed: {type(exc).__name__}: {exc}"
    for workload in workloads:
        out: dict[str, Any] = {"system": system, "workload": workload}
        t0 = time.perf_counter()
        if import_error:
            out.update(ok=False, error=import_error)
        else:
            # run.py's --transport picks the URL; a module may still force tcp (TRANSPORT = "tcp").
            transport = args.get("transport") or getattr(mod, "TRANSPORT", "unix")
            if getattr(mod, "TRANSPORT", "") == "tcp":
                transport = "tcp"
            url = args["tcp_url"] if transport == "tcp" else args["url"]
            args["_transport"] = transport
            os.environ[c.ENV_URL] = url
            try:
                out.update(ok=True, result=run_workload(mod, workload, url, args))
            except Unsupported as exc:
                out.update(ok=False, unsupported=True, error=str(exc))
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                out.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
        out["elapsed_s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
