"""What `jobs show` and `jobs list` print about one job: `job_json` (the one JSON shape of a job),
its readable table rows, and where the job is stored (`placement`)."""

from __future__ import annotations

import json
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from scheduler.cli.common import cell, console, decoded_payload, fmt_attempts, fmt_ms, fmt_time
from scheduler.client.queue import Queue
from scheduler.core.codec import MAX_TIME_MS, stored_int
from scheduler.core.models import Job
from scheduler.operations.dead_letters import dead_converted

_TIME_FIELDS = {
    "run_at_ms",
    "lease_until_ms",
    "enqueued_ms",
    "claimed_ms",
    "finished_ms",
    "dead_ms",
    "start_by_ms",
    "progress_ms",
}
_DURATION_FIELDS = {"run_in_ms", "lease_left_ms", "ttl_ms", "timeout_ms"}
UNREADABLE_LEASE = "unreadable (the stored lease score is not a time)"


def readable_lease_ms(lease_until_ms: int | None) -> int | None:
    """The lease end, or None when the leased-ZSET score was no time: codec clamps a
    hand-written score (inf, -inf, 1e300, negative) into [0, MAX_TIME_MS] as claim.lua does,
    and no lease a claim grants lies at either bound."""
    if lease_until_ms is None or not 0 < lease_until_ms < MAX_TIME_MS:
        return None
    return lease_until_ms


def _int(v: str | None) -> int | None:
    return stored_int(v)  # the one strict reader of stored numbers (scheduler/core/codec.py)


def job_json(job: Job, now_ms: int) -> dict[str, Any]:
    """Everything about one job, decoded, with times relative to the server's clock."""
    f = job.fields
    payload, payload_error = decoded_payload(f.get("payload"))
    if job.payload_dropped:  # a lean finished record: dropped on purpose, not damaged
        payload_error = None
    result, _ = decoded_payload(f.get("result")) if "result" in f else (None, None)
    run_at = job.run_at_ms
    state = job.state
    lease_until = readable_lease_ms(job.lease_until_ms)
    if state == "due" and run_at is not None and run_at > now_ms:
        state = "scheduled"
    token = job.token
    fence = _int(token.split("-", 1)[0]) if token else None
    return {
        "id": job.id,
        "state": state,
        "stored_state": job.stored_state,
        "task": job.task,
        "payload": payload,
        "payload_error": payload_error,
        "payload_dropped": job.payload_dropped,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        # Leases that lapsed (its worker died or stalled); 2+: a suspect, run alone
        # (docs/durability.md). Unset reads 0.
        "lapses": _int(f.get("lapses")) or 0,
        "run_at_ms": run_at,
        "run_in_ms": None if run_at is None else run_at - now_ms,
        "start_by_ms": job.start_by_ms,  # its start deadline (enqueue's start_within_ms)
        "token": token,
        "fence": fence,
        "worker": job.worker,
        "lease_until_ms": lease_until,
        "lease_left_ms": None if lease_until is None else lease_until - now_ms,
        "lease_unreadable": job.lease_until_ms is not None and lease_until is None,
        "enqueued_ms": _int(f.get("enqueued_ms")),
        "claimed_ms": _int(f.get("claimed_ms")),
        "finished_ms": _int(f.get("finished_ms")),
        "dead_ms": _int(f.get("dead_ms")),
        "dead_reason": job.dead_reason,
        "last_error_type": f.get("last_error_type"),
        "last_error": f.get("last_error"),
        "result": result,
        "progress": job.progress,  # ctx.set_progress (docs/guide/workers.md)
        "progress_ms": job.progress_ms,
        "errors": [e for e in job.errors if isinstance(e, dict)],  # hand-written: may be anything
        "timeout_ms": _int(f.get("timeout_ms")),
        "schedule": f.get("schedule"),
        # Flow control (docs/flow-control.md): why a held job is not running, and its settings.
        # A held job reads 'held' (get_job), whatever its run_at; earlier versions: 'due'.
        "flow": f.get("flow_reason") if state == "held" else None,
        # after=[...]: the parents it waits for, as its enqueue found them not done (flow says
        # how many still are); kept while it waits, and by a child parked for one of them.
        "parents": (f.get("parents") or "").split() or None,
        # As claim reads it (lua/lib/flow.lua): unset is 0; a hand-edited value out of 0..9
        # is claimed as 0 too, shown None (unreadable; its text is in `fields`).
        "priority": 0 if f.get("priority") is None else stored_int(f["priority"], 0, 9),
        "concurrency_key": f.get("ckey"),
        "concurrency_limit": _int(f.get("climit")),
        "rate_key": f.get("rkey"),
    }


def print_job(data: dict[str, Any], job_id: str, queue: str) -> None:
    """`jobs show` as a table: the readable fields, the payload and result as JSON, then the
    error history and the last traceback."""
    t = Table(title=cell(f"job {job_id} in {queue!r}"), show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    skip = {"fields", "errors", "payload", "result", "progress", "lease_unreadable"}
    skip.add("payload_dropped")
    if data.get("lease_unreadable"):
        t.add_row("lease until", UNREADABLE_LEASE)
    for name, value in data.items():
        if name in skip or value is None:
            continue
        for label, shown in _readable(name, value, data["state"]):
            t.add_row(label, cell(shown))
    # json.dumps escapes control characters inside strings; a raw (non-JSON) payload is
    # printed as a JSON string for the same reason.
    if data.get("payload_dropped"):
        t.add_row("payload", "dropped (finished; keep_payload=True keeps it)")
    else:
        t.add_row("payload", cell(json.dumps(data["payload"], indent=2), keep_newlines=True))
    for name in ("progress", "result"):
        if data[name] is not None:
            t.add_row(name, cell(json.dumps(data[name], indent=2), keep_newlines=True))
    out = console()
    out.print(t)
    if data["errors"]:
        e = Table(title="error history (oldest first)")
        for col in ("attempt", "at", "type", "message"):
            e.add_column(col, overflow="fold")
        for err in data["errors"]:
            e.add_row(
                cell(err.get("attempt", "")),
                fmt_time(_int(str(err.get("at_ms")))),
                cell(err.get("type", "")),
                cell(err.get("message", "")),
            )
        out.print(e)
        last_tb = data["errors"][-1].get("traceback")
        if last_tb:
            out.print("[bold]last traceback[/]")
            # The one intentionally multi-line text: newlines kept, every other control escaped.
            out.print(cell(last_tb, keep_newlines=True), highlight=False, soft_wrap=True)


def _readable(name: str, value: Any, state: str) -> list[tuple[str, object]]:
    """`jobs show` rows for one field: a time as `run_at` (ISO) plus `run_at_ms` (the stored
    number); a duration without the `_ms` suffix it no longer is; relative times only where
    they mean something (run in / late by for a waiting job, lease left for a leased one)."""
    if name in _TIME_FIELDS:
        return [(name.removesuffix("_ms"), fmt_time(value)), (name, value)]
    if name == "run_in_ms":
        if state not in ("due", "scheduled", "held"):
            return []
        return [("run in", fmt_ms(value))] if value > 0 else [("late by", fmt_ms(-value))]
    if name == "lease_left_ms":
        return [("lease left", fmt_ms(value))] if state == "leased" else []
    if name == "timeout_ms" and value == 0:
        return [("timeout", "task's timeout_s, else none")]  # 0: none of the job's own
    if name in _DURATION_FIELDS:
        return [(name.removesuffix("_ms"), fmt_ms(value))]
    if name == "parents":
        return [("parents", " ".join(value))]
    if name == "flow":
        return [("flow", flow_words(value))]
    return [(name, value)]


def flow_words(reason: str) -> str:
    """A held job's reason as printed. lib/flow.lua stores 'waiting for N jobs' for any N (the
    stored words: --json's `flow`, docs/flow-control.md); one parent reads 'waiting for 1 job'."""
    return "waiting for 1 job" if reason == "waiting for 1 jobs" else reason


def placement(client: redis.Redis, q: Queue, job_id: str) -> dict[str, Any]:
    k = q.keys
    q._run(dead_converted())  # a dead LIST from an older version becomes the ZSET first
    pipe = client.pipeline(transaction=True)
    pipe.zscore(k.due, job_id)
    pipe.zscore(k.leased, job_id)
    pipe.zscore(k.dead, job_id)
    pipe.pttl(k.job(job_id))
    pipe.zscore(k.flow_held, job_id)
    pipe.zscore(k.prefix + "moving", job_id)  # a queue move's (admin/queue_move.py)
    replies = pipe.execute(raise_on_error=False)
    if isinstance(replies[5], redis.ResponseError):  # of another type: empty, as for get_job
        replies[5] = None
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    due, leased, dead_pos, pttl, held, moving = replies
    found = (("due", due), ("leased", leased), ("dead", dead_pos), ("flow:held", held))
    places = [p for p, v in (*found, ("moving", moving)) if v is not None]
    return {"places": places, "ttl_ms": int(pttl) if int(pttl) >= 0 else None}


# -- `jobs list`'s text -------------------------------------------------------------------
# Narrower than this, six columns fold task names and worker ids by character: one block per
# job instead (as `dead list` prints), which wraps by word at any width and greps well.
TABLE_MIN_WIDTH = 120


def when_text(r: dict[str, Any], state: str) -> str:
    if state == "leased":
        if r["lease_unreadable"]:
            return "lease " + UNREADABLE_LEASE
        left = r["lease_left_ms"] or 0
        return f"lease left {fmt_ms(left)}" if left >= 0 else f"lease lapsed {fmt_ms(-left)} ago"
    if state == "dead":
        return f"dead {fmt_time(r['dead_ms'])}: {r['dead_reason'] or '?'}"
    if state == "held":
        return f"held: {flow_words(r['flow']) if r['flow'] else 'flow control'}"
    if state == "finished":
        return f"{r['state']} {fmt_time(r['finished_ms'])}"
    if (r["run_in_ms"] or 0) > 0:
        return f"run in {fmt_ms(r['run_in_ms'])}"
    return f"late {fmt_ms(-(r['run_in_ms'] or 0))}"


def error_text(r: dict[str, Any]) -> str:
    return f"{r['last_error_type']}: {r['last_error']}" if r["last_error_type"] else "-"


def print_blocks(out: Console, title: str, rows: list[dict[str, Any]], state: str) -> None:
    out.print(cell(f"{title}: {len(rows)} shown"))
    for r in rows:
        head = f"{r['id']}  {r['task']}  {fmt_attempts(r)}"
        out.print(cell(f"{head}  {when_text(r, state)}"), style="bold")
        if r["worker"]:
            out.print(cell(f"  worker: {r['worker']}"))
        if r["last_error_type"]:
            out.print(cell(f"  last error: {error_text(r)}"))
