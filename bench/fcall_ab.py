"""Redis 7 functions (FUNCTION LOAD once, FCALL per call) against EVALSHA, same scripts, same work.

    python bench/fcall_ab.py [--rounds 5] [--n 1000] [--calls100 20] [--preload-all] [--json]

Each of enqueue.lua, claim.lua and complete.lua, as scheduler.core.scripts `source` sends it
(expanded, pruned), is loaded twice into one private redis-server: as a script (SCRIPT LOAD) and
as a function library (FUNCTION LOAD) built from the same text: the libs' part at library level,
run once at load, and the transition's own body inside
`redis.register_function('<name>', function(KEYS, ARGV) ... end)`, named with a hash of the
library's text. The arguments are the ones the client sends: each call's Script request is taken
from the Queue's own operation (`q.ops.enqueue("task", payload)`, `q.ops.claim(worker,
limit=B)`, `q.ops.complete_many(...)` of what the claim returned), before it is sent.

Per round, each path on its own fresh queue, the same phases: --n one-job enqueues; --n claims
of 1 job, then their --n completes of 1; --calls100 claims of 100, then their completes (the
queues filled by enqueue_many first, not measured); then the one-job calls again, each sent to
its transition's libs alone (the body cut to `return 1`, as bench/script_prologue.py does):
the prologue an EVALSHA runs on every call and an FCALL ran once, at load. Within a phase the
two paths take turns in chunks (20 calls; 1 call of 100 jobs), EVALSHA first in even chunks,
FCALL in odd ones, so load on the shared machine falls on both alike. Per phase and path: INFO
commandstats' usec_per_call of evalsha / fcall after a CONFIG RESETSTAT (server time per call),
the server's main-thread CPU per call (INFO cpu around each chunk, less an empty INFO-to-INFO
interval) and the client's wall per call (both paths sent alike on one pooled connection).
Prints a table of medians over rounds (per call; at batch 100 divide by 100 for per job), and
JSON with --json.

Before timing, both paths run one scripted sequence with the test clock (lib/clock_test.lua:
the same fixed now) and the same arguments on the same queue, the keys deleted in between; the
replies, every key (DUMP, and its expiry time within a minute) and the count of each command
the scripts ran (INFO commandstats) must be identical.

What a function body cannot keep as a script has it, and how this bench adapts it (the libs'
text is not changed; lines are added around it):
- a lib's top-level `local` that a call assigns or fills (a per-call budget such as
  `dead_trim_left`, a per-call cache such as `FLOW_RATE_LOGS` or `flow_aging_of`) would keep its
  value from one FCALL to the next: each function first assigns it its initial value again,
  through one library-level function (assigned in the registered function itself, each would
  be one more upvalue of it: claim's body uses about 54 of Lua 5.1's 60 already, and 9 more
  refused the library, "function at line N has more than 60 upvalues").
- KEYS and ARGV are the function's arguments, not globals: a lib function that reads them (only
  lib/clock_test.lua's `now_ms`) sees library-level `local KEYS, ARGV`, set by each call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import common as c  # noqa: E402
import redis  # noqa: E402

from bench.redis_server import private_server  # noqa: E402
from scheduler import JobSpec, Queue  # noqa: E402
from scheduler.core.codec import parse_claim  # noqa: E402
from scheduler.core.scripts import TRANSITIONS, source  # noqa: E402
from scheduler.operations.requests import Op, Script  # noqa: E402

NAMES = ("enqueue", "claim", "complete")
# The first line of each transition's own body; everything before it is its libs.
BODY_START = "local newer = newer_storage_err"
WORKER = "fcall-ab"
Wire = tuple[str, ...]

_TOP_LOCAL = re.compile(r"^local ([A-Za-z_]\w*)\s*=\s*(.*)$")
_T = r"[A-Za-z_]\w*(?:\[[^\]\n]*\]|\.\w+)*"
# An assignment statement: at a line's start or after then / do / else / `;`, targets, `=`.
_ASSIGN = re.compile(
    rf"(?:^|\bthen\b|\bdo\b|\belse\b|;)[ \t]*({_T}(?:[ \t]*,[ \t]*{_T})*)[ \t]*=(?!=)", re.M
)


def _code(line: str) -> str:
    return line.split("--", 1)[0]


def _no_comments(text: str) -> str:
    """The code of `text`: block comments (a script's contract header) and line comments out."""
    text = re.sub(r"--\[(=*)\[.*?\]\1\]", "", text, flags=re.S)
    return "\n".join(_code(line) for line in text.split("\n"))


def lib_values(lib: str) -> dict[str, str]:
    """name -> initial value of each column-0 `local NAME = value` of the libs (the lua_prune
    layout: one name per declaration; a value may run on while its brackets are open)."""
    out: dict[str, str] = {}
    lines = lib.split("\n")
    for i, line in enumerate(lines):
        m = _TOP_LOCAL.match(_code(line).rstrip())
        if m is None:
            continue
        value, j = m.group(2), i
        while sum(value.count(o) - value.count(e) for o, e in ("{}", "()", "[]")) > 0:
            j += 1
            value += "\n" + _code(lines[j]).rstrip()
        out[m.group(1)] = value
    return out


def mutated(text: str, names: dict[str, str]) -> list[str]:
    """The lib locals an assignment statement sets, or whose table it fills (`T[k] = v`,
    `T.f = v`, `a, T = ...`), or that `table.insert` / `remove` / `sort` changes: their values
    would outlive one FCALL. A `local` declaration is no assignment of them."""
    code = _no_comments(text)
    hit: set[str] = set()
    for m in _ASSIGN.finditer(code):
        hit.update(re.findall(r"(?:^|,)\s*([A-Za-z_]\w*)", m.group(1)))
    for m in re.finditer(r"table\.(?:insert|remove|sort)\(\s*([A-Za-z_]\w*)", code):
        hit.add(m.group(1))
    return [n for n in names if n in hit]


def reads_keys_argv(lib: str) -> bool:
    return re.search(r"\b(KEYS|ARGV)\b", _no_comments(lib)) is not None


def function_library(name: str, text: str) -> tuple[str, str, dict[str, Any]]:
    """(library code for FUNCTION LOAD, the function's name, what was adapted)."""
    at = text.index(BODY_START)
    lib, body = text[:at], text[at:]
    values = lib_values(lib)
    reset = mutated(text, values)
    outer = "local KEYS, ARGV\n" if reads_keys_argv(lib) else ""
    params = "keys, argv" if outer else "KEYS, ARGV"
    head = "  KEYS, ARGV = keys, argv\n" if outer else ""
    # The resets in a library-level function: assigned in the registered function itself, each
    # would be one more upvalue of it, and claim's body uses 54 of Lua 5.1's 60 already.
    lib += "local function fcall_ab_reset()\n"
    lib += "".join(f"  {n} = {values[n]}\n" for n in reset) + "end\n"
    head += "  fcall_ab_reset()\n"
    digest = hashlib.sha1((outer + lib + head + body).encode()).hexdigest()[:12]
    fname = f"sched_{name}_{digest}"
    code = (
        f"#!lua name=schedlib_{name}_{digest}\n{outer}{lib}"
        f"redis.register_function('{fname}', function({params})\n{head}{body}\nend)\n"
    )
    adapted = {"reset_per_call": reset, "keys_argv_locals": bool(outer)}
    return code, fname, adapted


def script_request(op: Op[Any], name: str) -> list[str]:
    """The arguments of the first script call `op` would send (not sent)."""
    req = next(op)
    assert isinstance(req, Script) and req.name == name, req
    return list(req.args)


class Paths:
    """Each transition callable as EVALSHA and as FCALL, sent alike on one pooled connection."""

    def __init__(self, r: redis.Redis, clock: str) -> None:
        self.r = r
        self.conn: Any = r.connection_pool.get_connection()
        self.sha: dict[str, str] = {}
        self.fn: dict[str, str] = {}
        self.adapted: dict[str, dict[str, Any]] = {}
        self.load_ms: dict[str, float] = {}
        for name in NAMES:
            text = source(name, clock)
            self.sha[name] = r.script_load(text)
            code, fname, adapted = function_library(name, text)
            t0 = time.perf_counter()
            r.function_load(code, replace=True)
            self.load_ms[name] = round((time.perf_counter() - t0) * 1000, 2)
            self.fn[name] = fname
            self.adapted[name] = adapted
            # Its libs alone (the body cut to `return 1`, as bench/script_prologue.py does): the
            # prologue an EVALSHA runs and an FCALL does not.
            cut = text[: text.index(BODY_START)] + BODY_START + "\nreturn 1\n"
            self.sha[name + " libs"] = r.script_load(cut)
            code, fname, _ = function_library(name + "_libs", cut)
            r.function_load(code, replace=True)
            self.fn[name + " libs"] = fname

    def wire(self, path: str, name: str, keys: list[str], args: list[str]) -> Wire:
        cmd, target = ("EVALSHA", self.sha[name]) if path == "evalsha" else ("FCALL", self.fn[name])
        return (cmd, target, str(len(keys)), *keys, *args)

    def to_libs(self, path: str, name: str, wire: Wire) -> Wire:
        """`wire` sent to the transition's libs alone instead."""
        libs = self.sha if path == "evalsha" else self.fn
        return (wire[0], libs[name + " libs"], *wire[2:])

    def call(self, wire: Wire) -> Any:
        self.conn.send_command(*wire)
        return self.conn.read_response()

    def close(self) -> None:
        self.r.connection_pool.release(self.conn)


def queue_keys(r: redis.Redis, prefix: str) -> list[str]:
    return sorted(str(k) for k in r.scan_iter(match=prefix + "*", count=1000))


def snapshot(r: redis.Redis, raw: redis.Redis, prefix: str) -> dict[str, tuple[bytes, int]]:
    """Every key of the queue: its DUMP (on `raw`, a client that does not decode) and the
    absolute ms it expires at (-1: none)."""
    return {k: (raw.dump(k) or b"", int(raw.pexpiretime(k))) for k in queue_keys(r, prefix)}


def sequence(p: Paths, path: str, q: Queue, enq: list[list[str]]) -> list[Any]:
    """A fixed run on the test clock: one-job enqueues, claims of 1 and their completes, one
    claim of 100 and its complete. Returns every reply."""
    keys = list(q._script_keys)
    replies = [p.call(p.wire(path, "enqueue", keys, a)) for a in enq]
    for limit, calls in ((1, 20), (100, 1)):
        for i in range(calls):
            nonce = f"n{limit}x{i}"
            rep = p.call(p.wire(path, "claim", keys, script_request(
                q.ops.claim(WORKER, limit=limit, nonce=nonce), "claim")))  # fmt: skip
            replies.append(rep)
            items = [(j.id, j.token, {"ok": j.id}) for j in parse_claim(rep).jobs]
            args = script_request(q.ops.complete_many(items), "complete")
            replies.append(p.call(p.wire(path, "complete", keys, args)))
    return replies


def verify(r: redis.Redis, raw: redis.Redis, paths: Paths) -> dict[str, Any]:
    """Both paths on the same inputs, one after the other on the same queue: replies and keys
    must match exactly (expiry within a minute: each sets it from the server's clock)."""
    q = Queue(r, "fcall-verify")
    prefix = q.keys.prefix
    now_ms = int(time.time() * 1000)
    enq = [script_request(q.ops.enqueue("task", c.payload(i)), "enqueue") for i in range(120)]
    # Flow jobs too, so that the lib locals kept across calls are used by more than one call: a
    # rate key (lib/flow.lua FLOW_RATE_LOGS), priorities (flow_aging_of), a concurrency key.
    flows: list[dict[str, Any]] = [
        {"rate_limit": (2, 60_000), "rate_key": "r"},
        {"priority": 5},
        {"concurrency_key": "ck", "concurrency_limit": 3, "priority": 2},
    ]
    enq += [
        script_request(q.ops.enqueue("task", c.payload(i), **flows[i % 3]), "enqueue")
        for i in range(30)
    ]
    seen: dict[str, tuple[list[Any], dict[str, tuple[bytes, int]]]] = {}
    inner: dict[str, dict[str, int]] = {}
    for path in ("evalsha", "fcall"):
        for k in queue_keys(r, prefix):
            r.delete(k)
        r.set(prefix + "test:now_ms", now_ms)
        r.config_resetstat()
        replies = sequence(paths, path, q, enq)
        # The commands the scripts ran (Redis counts each redis.call()), less the call itself.
        stats = r.info("commandstats")
        inner[path] = {
            k: int(v["calls"]) for k, v in stats.items() if k not in (f"cmdstat_{path}",)
        }
        seen[path] = (replies, snapshot(r, raw, prefix))
    (rep_a, keys_a), (rep_b, keys_b) = seen["evalsha"], seen["fcall"]
    if inner["evalsha"] != inner["fcall"]:
        raise SystemExit(f"the scripts ran other commands: {inner}")
    if rep_a != rep_b:
        bad = next(i for i, (x, y) in enumerate(zip(rep_a, rep_b, strict=True)) if x != y)
        raise SystemExit(f"replies differ at call {bad}: {rep_a[bad]!r} != {rep_b[bad]!r}")
    if sorted(keys_a) != sorted(keys_b):
        raise SystemExit(f"key sets differ: {sorted(set(keys_a) ^ set(keys_b))}")
    for k, (dump, exp) in keys_a.items():
        dump_b, exp_b = keys_b[k]
        if dump != dump_b or (exp < 0) != (exp_b < 0) or abs(exp - exp_b) > 60_000:
            raise SystemExit(f"key {k} differs: {(dump, exp)!r} != {(dump_b, exp_b)!r}")
    for k in queue_keys(r, prefix):
        r.delete(k)
    ran = sum(n for k, n in inner["evalsha"].items() if k != "cmdstat_config")
    return {"calls": len(rep_a), "keys": len(keys_a), "commands_run": ran, "identical": True}


PATHS = ("evalsha", "fcall")
# Per phase and path: server us per call from INFO commandstats (usec_per_call: time inside the
# command, which on a loaded machine includes time the server was descheduled), the server's
# main-thread CPU us per call (INFO cpu around each chunk, less an empty INFO-to-INFO interval:
# CPU spent, which load on the machine hurts least), the client's mean wall per call (us).
# Not SLOWLOG: with its threshold at 0 it logs every redis.call() inside a script too, in the
# script's own time.
Figures = tuple[float, float, float]


def cpu_us(r: redis.Redis) -> float:
    st = r.info("cpu")
    return (float(st["used_cpu_user_main_thread"]) + float(st["used_cpu_sys_main_thread"])) * 1e6


def phase(
    r: redis.Redis, p: Paths, wires: dict[str, list[Wire]], chunk: int
) -> tuple[dict[str, Figures], dict[str, list[Any]]]:
    """Send both paths' calls in alternating chunks of `chunk` calls (EVALSHA first in even
    chunks, FCALL in odd ones), so load on the machine falls on both alike; INFO cpu around
    each chunk. Returns each path's figures and replies."""
    n = len(wires["evalsha"])
    empty = []
    for _ in range(7):
        c0 = cpu_us(r)
        empty.append(cpu_us(r) - c0)
    base = statistics.median(empty)
    r.config_resetstat()
    replies: dict[str, list[Any]] = {path: [] for path in PATHS}
    wall = dict.fromkeys(PATHS, 0.0)
    cpu = dict.fromkeys(PATHS, 0.0)
    for k, start in enumerate(range(0, n, chunk)):
        for path in PATHS if k % 2 == 0 else PATHS[::-1]:
            c0 = cpu_us(r)
            t0 = time.perf_counter()
            replies[path].extend(p.call(w) for w in wires[path][start : start + chunk])
            wall[path] += time.perf_counter() - t0
            cpu[path] += cpu_us(r) - c0 - base
    stats = r.info("commandstats")
    out = {}
    for path in PATHS:
        st = stats[f"cmdstat_{path}"]
        assert int(st["calls"]) == n, st
        out[path] = (float(st["usec_per_call"]), cpu[path] / n, wall[path] / n * 1e6)
    return out, replies


def one_round(r: redis.Redis, p: Paths, rnd: int, n: int, calls100: int) -> dict[str, Any]:
    """One round: each path on its own fresh queue, the same phases, interleaved call by call."""
    qs = {path: Queue(r, f"fab{rnd}{path}") for path in PATHS}
    keys = {path: list(q._script_keys) for path, q in qs.items()}
    out: dict[str, dict[str, Figures]] = {}

    def wire(path: str, name: str, op: Op[Any]) -> Wire:
        return p.wire(path, name, keys[path], script_request(op, name))

    def completes(path: str, replies: list[Any]) -> list[Wire]:
        items = ([(j.id, j.token, None) for j in parse_claim(rep).jobs] for rep in replies)
        return [wire(path, "complete", qs[path].ops.complete_many(it)) for it in items]

    enq = {
        path: [wire(path, "enqueue", q.ops.enqueue("task", c.payload(i))) for i in range(n)]
        for path, q in qs.items()
    }
    out["enqueue 1 job"], got = phase(r, p, enq, 20)
    assert got["evalsha"] == got["fcall"], "enqueue replies differ"  # fresh ids: all created
    sent = {"enqueue": enq}
    for limit, calls in ((1, n), (100, calls100)):
        if limit > 1:
            for q in qs.values():
                q.enqueue_many([JobSpec("task", c.payload(i)) for i in range(limit * calls)])
        claims = {
            path: [wire(path, "claim", q.ops.claim(WORKER, limit=limit)) for _ in range(calls)]
            for path, q in qs.items()
        }
        out[f"claim {limit}"], got = phase(r, p, claims, 20 // limit or 1)
        for path in PATHS:
            assert all(len(parse_claim(x).jobs) == limit for x in got[path]), "a short claim"
        todo = {pa: completes(pa, got[pa]) for pa in PATHS}
        out[f"complete {limit}"], done = phase(r, p, todo, 20 // limit or 1)
        assert all(st == "done" for v in done.values() for rep in v for st in rep), "refused"
        if limit == 1:
            sent.update(claim=claims, complete=todo)
    # The same one-job calls again, each to its libs alone (the body cut to `return 1`).
    for name, wires in sent.items():
        cut = {pa: [p.to_libs(pa, name, w) for w in ws] for pa, ws in wires.items()}
        out[f"{name} 1: libs alone"], _ = phase(r, p, cut, 20)
    sizes = {path: len(queue_keys(r, q.keys.prefix)) for path, q in qs.items()}
    assert sizes["evalsha"] == sizes["fcall"], sizes
    return out


def table(rows: dict[str, dict[str, list[Figures]]]) -> str:
    """Medians over rounds; per job at batch 100."""
    lines = [
        "| call | server CPU us/call, EVALSHA | FCALL | saved | commandstats us/call, EVALSHA "
        "| FCALL | saved | client wall us/call, EVALSHA | FCALL | saved |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_path in rows.items():
        e = [statistics.median(x[k] for x in by_path["evalsha"]) for k in range(3)]
        f = [statistics.median(x[k] for x in by_path["fcall"]) for k in range(3)]
        cells = "".join(f" {e[k]:.1f} | {f[k]:.1f} | {e[k] - f[k]:.1f} |" for k in (1, 0, 2))
        lines.append(f"| {name} |{cells}")
    return "\n".join(lines)


def preload_all(r: redis.Redis) -> list[str]:
    """Every transition loaded on both sides, as in production, where a worker's start loads
    them all (scheduler/worker/runtime.py): each Lua state (EVAL's and the functions') then
    holds them. Returns the ones with no function library (no usual body start)."""
    left = []
    for name in TRANSITIONS:
        text = source(name)
        r.script_load(text)
        if BODY_START in text and name not in NAMES:
            r.function_load(function_library(name, text)[0], replace=True)
        elif name not in NAMES:
            left.append(name)
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=1000, help="one-job calls per phase and round")
    ap.add_argument("--calls100", type=int, default=20, help="calls of 100 jobs per round")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument(
        "--preload-all",
        action="store_true",
        help="load every transition on both sides first, as a worker's start does (SCRIPT LOAD;"
        " as a function library each one with the usual body start)",
    )
    a = ap.parse_args()
    rows: dict[str, dict[str, list[Figures]]] = {}
    load = [os.getloadavg()[0]]
    with private_server() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        raw = redis.Redis.from_url(server.url)
        test_paths = Paths(r, "test")
        verified = verify(r, raw, test_paths)
        test_paths.close()
        raw.close()
        r.function_flush()
        r.script_flush()
        p = Paths(r, "server")
        if a.preload_all:
            preload_all(r)
        for rnd in range(a.rounds):
            for k, v in one_round(r, p, rnd, a.n, a.calls100).items():
                for path in PATHS:
                    rows.setdefault(k, {pa: [] for pa in PATHS})[path].append(v[path])
        version = r.info("server")["redis_version"]
        p.close()
    load.append(os.getloadavg()[0])
    print(f"rounds {a.rounds}, n {a.n}, calls of 100: {a.calls100}, preload-all {a.preload_all};"
          " medians over rounds")  # fmt: skip
    print(f"load average (1 min) at start / end: {load[0]:.2f} / {load[1]:.2f}")
    print(f"verified (test clock, same inputs): {verified}")
    print(f"redis {version}; FUNCTION LOAD ms: {p.load_ms}")
    for name, ad in p.adapted.items():
        print(f"{name}: reset per call: {', '.join(ad['reset_per_call']) or 'none'}")
    print(table(rows))
    if a.json:
        info = {"redis": version, "function_load_ms": p.load_ms, "adapted": p.adapted, "load": load}
        print(json.dumps({"args": vars(a), "info": info, "verified": verified, "rows": rows}))


if __name__ == "__main__":
    main()
