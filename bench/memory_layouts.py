"""Bytes per pending and per finished job for the layout of the checkout (through the public
API) and for candidate layouts written by hand, on a private default-settings redis-server.

    python bench/memory_layouts.py [--n 10000] [--api-only]

Every row: FLUSHALL, write n jobs, (used_memory - mem_clients_normal) delta / n, plus MEMORY
USAGE of one job key (the spec record `spec:<id>` of a pending job, the hash `job:<id>` of a
finished one) and the due ZSET's share. Payloads: the bench payload (`common.payload`, 89 bytes
of JSON as our codec writes it) and a tiny one (`{"i":<i>}`). The "api" rows: pending
(enqueue_many), finished lean (claim + complete_many) and finished with keep_payload=True; the
"spec key" rows write the spec record by hand under shorter key families and ids, to show
where a tiny job's bytes go (docs/performance.md section 8), the "spec hash" row the records as
fields of one hash per queue (section 14).
Needs redis-py; the "api" rows need the scheduler package (PYTHONPATH may point at a snapshot).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common as c  # noqa: E402
from profile_drain import server  # noqa: E402

Q = "sched:{bench}:"
DUE = Q + "due"


def tiny(i: int) -> dict[str, Any]:
    return {"i": i}


def pjson(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def long_id(i: int) -> str:
    """Today's id shape: 12 hex ms + 6 hex sequence + 12 hex random (30 chars)."""
    return f"{time.time_ns() // 1_000_000:012x}{i % 0xFFFFFF:06x}{secrets.token_hex(6)}"


def short_id(i: int) -> str:
    """A per-queue counter (INCR in enqueue.lua) in base 36: 4-5 chars for 10^6..10^7 jobs."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    i += 1_000_000  # as if the queue had seen a million jobs
    while i:
        i, d = divmod(i, 36)
        out = digits[d] + out
    return out


def baseline(r: Any) -> int:
    return c.memory_baseline(r)


def finished_rows(
    url: str, n: int, payload: Callable[[int], Any], keep: bool = False
) -> dict[str, Any]:
    """n jobs enqueued, claimed and completed (result None) through the public API: what a
    finished job keeps until its result TTL. Returns the bytes and one finished job's fields."""
    from scheduler import JobSpec, Queue

    r = c.client(url)
    q = Queue.from_url(url, "bench")
    b0 = baseline(r)
    kw = {"keep_payload": True} if keep else {}
    q.enqueue_many([JobSpec("task", payload(i), **kw) for i in range(n)])
    while True:
        batch = q.claim("memory", limit=1000, lease_ms=60_000)
        if not batch.jobs:
            break
        q.complete_many([(j.id, j.token, None) for j in batch.jobs])
    per_job = (baseline(r) - b0) / n
    key = next(iter(r.scan_iter(match=Q + "job:*", count=1000)))
    fields = {k.decode(): len(v) for k, v in r.hgetall(key).items()}
    return {
        "layout": "finished job via the API (enqueue_many + claim + complete_many)"
        + (", keep_payload" if keep else ", lean"),
        "bytes_per_job": round(per_job, 1),
        "one_job_key": {
            "memory_usage": r.memory_usage(key, samples=0),
            "encoding": r.object("encoding", key).decode(),
            "ttl_ms": r.pttl(key),
            "value_bytes_per_field": fields,
        },
        "other_keys": sorted(k.decode() for k in r.keys("*") if b":job:" not in k),
    }


def finished_lean(r: Any, n: int, ids: Callable[[int], str]) -> float:
    """A finished job holding only what status/result need, with its TTL (hand-written)."""
    b0 = baseline(r)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        key = Q + "job:" + ids(i)
        pipe.hset(key, mapping={"state": "done", "result": "null", "finished_ms": str(NOW_MS),
                                "settled_token": "3-0123456789abcdef"})  # fmt: skip
        pipe.pexpire(key, 3_600_000)
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    return round((baseline(r) - b0) / n, 1)


def api_rows(url: str, n: int, payload: Callable[[int], Any]) -> None:
    from scheduler import JobSpec, Queue

    Queue.from_url(url, "bench").enqueue_many([JobSpec("task", payload(i)) for i in range(n)])


NOW_MS = 1_796_000_000_000


def today_fields(job_id: str, payload: str) -> dict[str, str]:
    """The fields enqueue.lua writes today (see `HGETALL` of a pending job)."""
    return {
        "task": "task",
        "state": "due",
        "backoff": "1000,2.0,3600000,0.25",
        "max_attempts": "5",
        "attempts": "0",
        "payload": payload,
        "run_at_ms": str(NOW_MS),
        "enqueued_ms": str(NOW_MS),
    }


def write(
    r: Any, n: int, payload: Callable[[int], Any], ids: Callable[[int], str], layout: str
) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        jid, data = ids(i), pjson(payload(i))
        if layout == "hash, today's fields":
            pipe.hset(Q + "job:" + jid, mapping=today_fields(jid, data))
        elif layout == "hash, no derivable fields":
            # state = ZSET membership, attempts absent = 0, backoff absent = the task's default,
            # enqueued_ms absent = run_at_ms.
            lean = {"task": "task", "max_attempts": "5", "run_at_ms": str(NOW_MS), "payload": data}
            pipe.hset(Q + "job:" + jid, mapping=lean)
        elif layout == "string record per job":
            # One immutable text record: version|task|max_attempts|run_at_ms|backoff|payload.
            pipe.set(Q + "job:" + jid, f"1|task|5|{NOW_MS}||{data}")
        elif layout == "one queue hash of records":
            pipe.hset(Q + "spec", jid, f"1|task|5|{NOW_MS}||{data}")
        else:
            raise ValueError(layout)
        pipe.zadd(DUE, {jid: NOW_MS})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


LAYOUTS = [
    "hash, today's fields",
    "hash, no derivable fields",
    "string record per job",
    "one queue hash of records",
]


def spec_rows(r: Any, n: int, payload: Callable[[int], Any]) -> list[dict[str, Any]]:
    """The spec record as enqueue.lua writes it (`2|task|||||||<payload>`, a STRING) plus the due
    entry, under key families and id lengths: what the key name and the id cost."""
    rows = []
    for family in ("spec:", "s:"):
        for id_len in (16, 12):
            r.flushall()
            b0 = baseline(r)
            pipe = r.pipeline(transaction=False)
            for i in range(n):
                jid = (f"{i:06d}" + secrets.token_hex(8))[:id_len]
                pipe.set(Q + family + jid, "2|task|||||||" + pjson(payload(i)))
                pipe.zadd(DUE, {jid: NOW_MS})
                if i % 1000 == 999:
                    pipe.execute()
            pipe.execute()
            per_job = round((baseline(r) - b0) / n, 1)
            rows.append({"layout": f"spec key by hand: {Q}{family}<{id_len}-char id>",
                         "key_len": len(Q + family) + id_len, "bytes_per_job": per_job,
                         **sample(r, n, family)})  # fmt: skip
    # One hash of records per queue instead of a key per job (no per-key overhead; 16-char ids).
    r.flushall()
    b0 = baseline(r)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        jid = (f"{i:06d}" + secrets.token_hex(8))[:16]
        pipe.hset(Q + "specs", jid, "2|task|||||||" + pjson(payload(i)))
        pipe.zadd(DUE, {jid: NOW_MS})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    rows.append({"layout": f"spec hash by hand: HSET {Q}specs <16-char id> <record>",
                 "bytes_per_job": round((baseline(r) - b0) / n, 1),
                 "encoding": r.object("encoding", Q + "specs").decode()})  # fmt: skip
    return rows


def sample(r: Any, n: int, family: str = "job:") -> dict[str, Any]:
    keys = [k for k in r.scan_iter(match=Q + family + "*", count=1000)][:1]
    if not keys and family == "job:":  # a pending job of the spec layout has no hash yet
        family = "spec:"
        keys = [k for k in r.scan_iter(match=Q + family + "*", count=1000)][:1]
    one = keys[0] if keys else None
    due = r.memory_usage(DUE, samples=0) or 0
    out: dict[str, Any] = {"due_zset_bytes_per_job": round(due / n, 1)}
    if one is not None:
        out["one_job_key"] = {
            "family": family,
            "memory_usage": r.memory_usage(one, samples=0),
            "encoding": r.object("encoding", one).decode(),
            "key_len": len(one),
        }
    if r.exists(Q + "spec"):
        out["queue_hash_bytes_per_job"] = round((r.memory_usage(Q + "spec", samples=0) or 0) / n, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--api-only", action="store_true", help="only the api and spec key rows")
    opts = ap.parse_args()
    n = opts.n
    rows: list[dict[str, Any]] = []
    with server() as (url, _):
        r = c.client(url)
        for pname, payload in (("bench (89 B)", c.payload), ("tiny", tiny)):
            for listpack_value in (64, 128):
                r.flushall()
                r.config_set("hash-max-listpack-value", listpack_value)
                b0 = baseline(r)
                try:
                    api_rows(url, n, payload)
                except ImportError as exc:
                    rows.append({"layout": "api", "error": str(exc)})
                    break
                rows.append({"layout": "pending via Queue.enqueue_many", "payload": pname,
                             "hash_max_listpack_value": listpack_value,
                             "bytes_per_job": round((baseline(r) - b0) / n, 1),
                             **sample(r, n)})  # fmt: skip
            r.config_set("hash-max-listpack-value", 64)
            for keep in (False, True):
                r.flushall()
                rows.append({"payload": pname, **finished_rows(url, n, payload, keep)})
            rows += [{"payload": pname, **row} for row in spec_rows(r, n, payload)]
            r.config_set("hash-max-listpack-value", 64)
            for layout in [] if opts.api_only else LAYOUTS:
                for id_name, ids in (("30-char id", long_id), ("short id", short_id)):
                    r.flushall()
                    b0 = baseline(r)
                    write(r, n, payload, ids, layout)
                    rows.append({"layout": layout, "payload": pname, "ids": id_name,
                                 "hash_max_listpack_value": 64,
                                 "bytes_per_job": round((baseline(r) - b0) / n, 1),
                                 **sample(r, n)})  # fmt: skip
        for id_name, ids in (
            () if opts.api_only else (("30-char id", long_id), ("short id", short_id))
        ):
            r.flushall()
            lean = finished_lean(r, n, ids)
            rows.append({"layout": "finished job, only state/result/finished_ms/settled_token + "
                         "TTL", "ids": id_name, "bytes_per_job": lean})  # fmt: skip
        info = r.info("server")
    print(json.dumps({"n": n, "redis": info["redis_version"], "pid": os.getpid(), "rows": rows},
                     indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
