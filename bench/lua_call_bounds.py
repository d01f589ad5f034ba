"""The longest single script call at scale: Redis runs one script at a time, so a script whose
work grows with a queue's size holds every client of the server (other queues too) for its run.
Each scenario builds a large state on a private server (never 6379) and reads the server's own
time of every script call it makes from SLOWLOG (slowlog-log-slower-than 0), printing the
longest (ms) and how many calls were made.

    .venv/bin/python bench/lua_call_bounds.py [--n 100000] [--only dead,cancel,...]

Scenarios: reap (claims reaping 10,000 lapsed leases, reap_limit at its max), dead (dead_match,
requeue_dead, purge_dead over n dead letters), retention (claims trimming a dead backlog),
counts (counts / pause / resume over n due), cancel / complete / fail (a parent with n waiting
children), enqueue (enqueue_many of 10,000 at the default and the largest batch_size, sent as
calls of at most 1,000), plain (claims of 100 and 1,000), keylapse (10,000 leases of one key
lapsing together, 10,000 more of its jobs held), settle (heartbeat, release, complete_many of
every lease at once), held (claims behind one concurrency key holding n jobs), ratewide
(claims of 1,000 once the slots of 10,000 rate-held jobs have come), rate (a rate log of
100,000 starts stamped later than now: the server clock stepped back), finished (the finished
index at its 10,000 cap, all expired at once). Not a test: figures for commit messages and
docs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from redis_server import private_server  # noqa: E402

from scheduler.client.queue import Queue  # noqa: E402
from scheduler.core.job_spec import JobSpec  # noqa: E402

ERR = ("ValueError", "boom", "")


def script_calls(q: Queue, action: Callable[[], Any]) -> tuple[float, int]:
    """Run `action`; the longest script call it made (server ms, from SLOWLOG) and their number."""
    c = q.client
    c.slowlog_reset()
    action()
    entries = c.execute_command("SLOWLOG", "GET", "-1")

    def word(arg: Any) -> str:
        return (arg.decode() if isinstance(arg, bytes) else str(arg)).lower()

    times = [e[2] / 1000 for e in entries if word(e[3][0]).startswith(("eval", "fcall"))]
    return (max(times) if times else 0.0), len(times)


def enqueue(q: Queue, specs: list[JobSpec]) -> list[str]:
    ids: list[str] = []
    for i in range(0, len(specs), 10_000):
        ids += q.enqueue_many(specs[i : i + 10_000], batch_size=10_000)
    return ids


def make_dead(q: Queue, n: int) -> None:
    """n dead letters: claimed with a 1 ms lease and reaped with their one attempt used."""
    enqueue(q, [JobSpec(f"t{i % 4}", {"n": i}, max_attempts=1) for i in range(n)])
    while q.claim("w", limit=1000, lease_ms=1, reap_limit=0).jobs:
        pass
    time.sleep(0.01)
    while q.counts().leased:
        q.claim("w", limit=1, lease_ms=1, reap_limit=10_000)


def run(name: str, n: int, report: dict[str, Any], q: Queue) -> None:
    def measure(label: str, action: Callable[[], Any]) -> None:
        ms, calls = script_calls(q, action)
        report[f"{name}.{label}"] = {"max_ms": round(ms, 2), "calls": calls}
        print(json.dumps({f"{name}.{label}": report[f"{name}.{label}"]}), flush=True)

    if name == "reap":
        enqueue(q, [JobSpec("t", i, max_attempts=1) for i in range(n)])
        while q.claim("w", limit=1000, lease_ms=1, reap_limit=0).jobs:
            pass
        time.sleep(0.01)
        # reap_limit at its max: each claim reaps its bound (lua/claim.lua REAP_STEP), so
        # 10,000 lapsed leases take several claims; the longest of them.
        measure(
            "claims_reap_10000",
            lambda: [q.claim("w", limit=1, lease_ms=1, reap_limit=10_000) for _ in range(10)],
        )
    elif name == "dead":
        make_dead(q, n)
        measure("dead_ids_task", lambda: q.dead_ids(task="t1"))
        ids = q.dead_ids()
        measure("purge_dead_half", lambda: q.purge_dead(ids[: len(ids) // 2]))
        measure("requeue_dead_half", lambda: q.requeue_dead(ids[len(ids) // 2 :]))
    elif name == "retention":
        make_dead(q, n)
        q.set_dead_retention(max_count=0)
        measure("claim_trimming", lambda: q.claim("w", limit=1, reap_limit=0))
    elif name == "counts":
        enqueue(q, [JobSpec("t", i, delay_ms=i % 2 * 3_600_000) for i in range(n)])
        measure("counts", q.counts)
        measure("pause", q.pause)
        measure("resume", q.resume)
    elif name in ("cancel", "complete", "fail"):
        pid = q.enqueue("parent", None, max_attempts=1)
        enqueue(q, [JobSpec("child", i, after=[pid]) for i in range(n)])
        if name == "cancel":
            measure("cancel_parent", lambda: q.cancel(pid))
        else:
            job = q.claim("w", limit=1).jobs[0]
            if name == "complete":
                measure("complete_parent", lambda: q.complete(job.id, job.token))
            else:
                measure("fail_parent", lambda: q.fail(job.id, job.token, ERR, retryable=False))
        measure("claims_after", lambda: [q.claim("w", limit=1, reap_limit=0) for _ in range(5)])
    elif name in ("held", "heldwide"):
        # heldwide: a claim of the largest batch (1,000) behind the full key.
        spec = {"concurrency_key": "k", "concurrency_limit": 1}
        enqueue(q, [JobSpec("t", i, **spec) for i in range(n)])  # type: ignore[arg-type]
        batch = 100 if name == "held" else 1000
        measure("claims", lambda: [q.claim("w", limit=batch, reap_limit=0) for _ in range(5)])
    elif name == "enqueue":
        specs = [JobSpec("t", i) for i in range(10_000)]
        measure("enqueue_many_1000", lambda: q.enqueue_many(specs))
        measure("enqueue_many_10000", lambda: q.enqueue_many(specs, batch_size=10_000))
    elif name == "plain":
        enqueue(q, [JobSpec("t", i) for i in range(n)])
        measure("claim_100", lambda: q.claim("w", limit=100, reap_limit=0))
        measure("claim_1000", lambda: q.claim("w", limit=1000, reap_limit=0))
    elif name == "keylapse":
        # A fleet crash: 10,000 leases of one key (its largest limit) lapse at once, 10,000 more
        # of its jobs held behind them.
        spec = {"concurrency_key": "k", "concurrency_limit": 10_000}
        enqueue(q, [JobSpec("t", i, **spec) for i in range(20_000)])  # type: ignore[arg-type]
        t0 = time.monotonic()
        for _ in range(10):  # 10 claims lease 10,000, the next ones hold the rest
            q.claim("w", limit=1000, lease_ms=5_000, reap_limit=0)
        for _ in range(100):
            if not q.counts().due:
                break
            q.claim("w", limit=1000, lease_ms=5_000, reap_limit=0)
        time.sleep(max(5.1 - (time.monotonic() - t0), 0))
        measure("claim_reaping_100", lambda: q.claim("w", limit=1, reap_limit=100))
        measure("next_claim", lambda: q.claim("w", limit=1, reap_limit=100))
    elif name == "settle":
        # The manual API's batch calls, given every lease at once.
        enqueue(q, [JobSpec("t", i) for i in range(n)])
        leases: list[tuple[str, str]] = []
        while batch := q.claim("w", limit=1000, lease_ms=600_000, reap_limit=0).jobs:
            leases += [(j.id, j.token) for j in batch]
        half = len(leases) // 2
        measure("heartbeat_all", lambda: q.heartbeat(leases, lease_ms=600_000))
        measure("release_half", lambda: q.release(leases[:half]))
        measure(
            "complete_many_half", lambda: q.complete_many([(i, t, None) for i, t in leases[half:]])
        )
    elif name == "ratebacklog":
        spec = {"rate_limit": "10/200ms", "rate_key": "r"}
        enqueue(q, [JobSpec("t", i, **spec) for i in range(n)])  # type: ignore[arg-type]
        measure("claims_holding", lambda: [q.claim("w", limit=100) for _ in range(5)])
        time.sleep(1.0)
        measure("claims_after_slots", lambda: [q.claim("w", limit=100) for _ in range(5)])
    elif name == "ratewide":
        # Claims of the largest batch (1,000) once the slots of a rate-held backlog have come:
        # each claim brings back (or gives a new slot to) its bound's worth of them. A window
        # of 5 s: no slot comes while the backlog is set aside (a claim after another).
        spec = {"rate_limit": "10/5s", "rate_key": "r"}
        enqueue(q, [JobSpec("t", i, **spec) for i in range(min(n, 10_000))])  # type: ignore[arg-type]
        while q.client.zcard(q.keys.due):  # counts().due counts the held ones too
            q.claim("w", limit=1000, lease_ms=600_000, reap_limit=0)
        time.sleep(5.5)
        measure(
            "claims_after_slots",
            lambda: [q.claim("w", limit=1000, lease_ms=600_000, reap_limit=0) for _ in range(5)],
        )
    elif name == "rate":
        rk = q.keys.prefix + "flow:rate:r"
        future = int(time.time() * 1000) + 3_600_000
        pipe = q.client.pipeline(transaction=False)
        for i in range(0, 100_000, 5_000):
            pipe.zadd(rk, {f"86400000:100000:j{k}:1": future for k in range(i, i + 5_000)})
        pipe.execute()
        q.enqueue("t", None, rate_limit="100000/1d", rate_key="r")
        measure("claim_clamping_100000", lambda: q.claim("w", limit=1, reap_limit=0))
    elif name == "finished":
        enqueue(q, [JobSpec("t", i) for i in range(10_001)])
        while batch := q.claim("w", limit=1000, reap_limit=0).jobs:
            q.complete_many([(j.id, j.token, None) for j in batch[:-1]] if len(batch) > 1 else [])
            last = batch[-1]
        fk = q.keys.prefix + "finished"
        members = q.client.zrange(fk, 0, -1)
        for i in range(0, len(members), 5_000):
            q.client.zadd(fk, {m: 1 for m in members[i : i + 5_000]}, xx=True)
        measure("complete_trimming", lambda: q.complete(last.id, last.token))


SCENARIOS = (
    "enqueue",
    "plain",
    "keylapse",
    "reap",
    "dead",
    "retention",
    "counts",
    "cancel",
    "complete",
    "fail",
    "held",
    "heldwide",
    "settle",
    "ratebacklog",
    "ratewide",
    "rate",
    "finished",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    args = ap.parse_args()
    report: dict[str, Any] = {"n": args.n}
    with private_server() as server:
        server.cli("CONFIG", "SET", "slowlog-log-slower-than", "0")
        server.cli("CONFIG", "SET", "slowlog-max-len", "1000000")
        for name in args.only.split(","):
            q = Queue.from_url(server.url, name=f"b{name}")
            run(name, args.n, report, q)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
