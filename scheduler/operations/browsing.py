"""Paged, bounded reads for browsing a queue (the web dashboard): every function costs O(its
page), never a scan of all jobs. Built on the index ZSETs (due, dead) and the per-minute stats
hashes; job records are read only through `InspectingOps.get_jobs`, so a change of the job
record's layout stays in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.core.models import Job, QueueCounts
from scheduler.core.vocabulary import STAT_FIELDS, stat_field
from scheduler.operations.dead_letters import dead_converted, scored_pairs
from scheduler.operations.inspecting import LISTABLE, check_page, wrong_type
from scheduler.operations.ops import Ops
from scheduler.operations.requests import Commands, Op

MAX_PAGE = 500  # the largest page a browser may ask for
MAX_SCAN = 1_000  # ids a filtered page looks through per request (find by task, dead filters)
MAX_FILTERED = 2_000  # matches of one filtered page: dashboard/logical.py MAX_MERGED_WINDOW
# The start-lateness fields claim adds to each stats minute (lua/lib/lateness.lua).
LATENESS_BOUNDS_MS = (10, 100, 1_000, 10_000, 60_000, 600_000)
LATENESS_FIELDS = (
    "late_n",
    "late_sum_ms",
    "late_max_ms",
    *(f"late_le_{b}" for b in LATENESS_BOUNDS_MS),
    "late_gt_600000",
)


@dataclass(frozen=True)
class FilteredPage:
    """One page of a filtered listing. `next_offset` is where the next request resumes the
    scan (None at the end); `scanned` says how many ids this request looked through."""

    jobs: list[Job]
    next_offset: int | None
    scanned: int
    # Each job's score in the index `state` pages by (scored_ids): a partitioned queue's
    # filtered pages merge by it, as its unfiltered pages do (partitioned_merge.merge_scored).
    scores: list[float] = field(default_factory=list)


def _page_args(offset: int, limit: int) -> None:
    codec._int(offset, "offset", minimum=0)
    if codec._int(limit, "limit", minimum=1) > MAX_PAGE:
        raise BadArgument(f"limit must be <= {MAX_PAGE}, got {limit}")


def dead_ids_before(keys: QueueKeys, max_dead_ms: int, offset: int, limit: int) -> Op[list[str]]:
    """Dead ids that died at or before `max_dead_ms`, newest first (the dead ZSET's score is
    dead_ms, so an age filter is one BYSCORE range: O(log N + page))."""
    _page_args(offset, limit)
    yield from dead_converted()
    (ids,) = yield Commands(
        [("ZRANGE", keys.dead, max_dead_ms, "-inf", "BYSCORE", "REV", "LIMIT", offset, limit)]
    )
    return [codec.s(i) for i in ids]


def dead_count_before(keys: QueueKeys, max_dead_ms: int) -> Op[int]:
    """How many dead letters died at or before `max_dead_ms` (ZCOUNT: O(log N))."""
    yield from dead_converted()
    (n,) = yield Commands([("ZCOUNT", keys.dead, "-inf", max_dead_ms)])
    return int(n)


def _matches(job: Job, task: str | None, error_type: str | None) -> bool:
    if task is not None and job.task != task:
        return False
    return error_type is None or job.fields.get("last_error_type") == error_type


def filtered_page(
    ops: Ops,
    state: str,
    *,
    task: str | None = None,
    error_type: str | None = None,
    max_dead_ms: int | None = None,
    offset: int = 0,
    limit: int = 50,
    max_scan: int = MAX_SCAN,
) -> Op[FilteredPage]:
    """Up to `limit` jobs of `state` matching the filters, scanning at most `max_scan` ids
    from `offset` (a filter over a huge set is resumed page by page, never run to its end in
    one request). `max_dead_ms` applies to dead letters only. `limit` up to MAX_FILTERED: a
    partitioned queue's merged page asks each partition for offset + limit matches."""
    codec._int(offset, "offset", minimum=0)
    if codec._int(limit, "limit", minimum=1) > MAX_FILTERED:
        raise BadArgument(f"limit must be <= {MAX_FILTERED}, got {limit}")
    found: list[Job] = []
    scores: list[float] = []
    scanned = 0
    pos = offset
    clocked = state in ("due", "scheduled", "finished")
    now_ms = (yield from ops.counts()).now_ms if clocked else 0  # the server's clock
    cut = max_dead_ms if state == "dead" else None
    while scanned < max_scan and len(found) < limit:
        step = min(limit * 4, max_scan - scanned, MAX_PAGE)
        try:
            pairs = yield from scored_ids(ops, state, now_ms, pos, step, cut)
        except ResponseError as exc:
            raise wrong_type(exc, state, ops.keys.queue) from None
        if not pairs:
            return FilteredPage(found, None, scanned, scores)
        jobs = yield from ops.get_jobs([i for _, i in pairs])
        by_id = {j.id: j for j in jobs}
        for n, (score, job_id) in enumerate(pairs):
            job = by_id.get(job_id)
            if job is not None and _matches(job, task, error_type):
                found.append(job)
                scores.append(score)
                if len(found) == limit:
                    return FilteredPage(found, pos + n + 1, scanned + n + 1, scores)
        scanned += len(pairs)
        pos += len(pairs)
        if len(pairs) < step:
            return FilteredPage(found, None, scanned, scores)
    return FilteredPage(found, pos, scanned, scores)


def scored_ids(
    ops: Ops, state: str, now_ms: int, offset: int, count: int, max_dead_ms: int | None = None
) -> Op[list[tuple[float, str]]]:
    """(score, id) of `count` entries of `state` from `offset`, in list_ids' order (due,
    scheduled and held by run_at, leased by lease end, dead newest first, `max_dead_ms` an age cut,
    finished by its record's expiry, latest first, `now_ms` leaving out the expired):
    one ZRANGE, no job record read (a partitioned queue's merged page reads the records of
    the merged page only)."""
    if state not in LISTABLE:
        raise BadArgument(f"state must be one of {', '.join(LISTABLE)}, got {state!r}")
    codec._int(offset, "offset", minimum=0)
    codec._int(count, "count", minimum=1)
    k = ops.keys
    cmd: tuple[Any, ...]
    if state == "dead":
        yield from dead_converted()
        top = "+inf" if max_dead_ms is None else max_dead_ms
        cmd = ("ZRANGE", k.dead, top, "-inf", "BYSCORE", "REV", "LIMIT", offset, count)
    elif state in ("leased", "held"):
        cmd = ("ZRANGE", k.leased if state == "leased" else k.flow_held, offset, offset + count - 1)
    elif state == "finished":
        cmd = ("ZRANGE", k.finished, "+inf", f"({now_ms}", "BYSCORE", "REV", "LIMIT", offset, count)
    else:
        lo, hi = ("-inf", now_ms) if state == "due" else (f"({now_ms}", "+inf")
        cmd = ("ZRANGE", k.due, lo, hi, "BYSCORE", "LIMIT", offset, count)
    (reply,) = yield Commands([(*cmd, "WITHSCORES")])
    return scored_pairs(reply)


def minute_series(
    keys: QueueKeys, now_ms: int, minutes: int = 60, fields: Sequence[str] = STAT_FIELDS
) -> Op[list[dict[str, int]]]:
    """The per-minute outcome counters (lua/lib/util.lua bump_stat) for the last `minutes`
    minutes, oldest first, the current partial minute last: one pipelined read of `minutes`
    small hashes. Each entry has `minute_ms` (the minute's start) and every field."""
    if not 1 <= codec._int(minutes, "minutes") <= 120:  # stats minutes are kept 2 h
        raise BadArgument(f"minutes must be in [1, 120], got {minutes}")
    minute = now_ms // 60_000
    wanted = list(range(minute - minutes + 1, minute + 1))
    replies: list[Any] = yield Commands([("HGETALL", keys.stats(m)) for m in wanted])
    out: list[dict[str, int]] = []
    for m, raw in zip(wanted, replies, strict=True):
        row = dict.fromkeys(fields, 0)
        row["minute_ms"] = m * 60_000
        for name, value in (raw or {}).items():
            field = stat_field(codec.s(name))
            n = codec.stored_int(value)
            if field in row and n is not None:
                row[field] += n
        out.append(row)
    return out


def queue_row(
    ops: Ops, minutes: int
) -> Op[tuple[QueueCounts, list[tuple[float, str]], list[dict[str, int]]]]:
    """(counts, the due head as (score, id), the last `minutes` of minute_series): a queue's
    row of `scheduler stats` in two round trips, the counts (held and the clock too), then
    the head and the minutes in one pipeline."""
    counts = yield from ops.counts()
    series = minute_series(ops.keys, counts.now_ms, minutes)
    reads = next(series)
    assert isinstance(reads, Commands)
    head, *buckets = yield Commands([("ZRANGE", ops.keys.due, 0, 0, "WITHSCORES"), *reads.cmds])
    try:
        series.send(buckets)
    except StopIteration as done:
        return counts, scored_pairs(head), done.value
    raise AssertionError("minute_series reads once")


def window_totals(
    series: Sequence[dict[str, int]], windows_min: Sequence[int]
) -> dict[str, dict[str, int]]:
    """A minute_series (oldest first) as totals over its last N minutes, for each N:
    keyed '1m', '5m', '60m' (admin.inspection.window_counts' shape)."""
    return {
        f"{n}m": {f: sum(row.get(f, 0) for row in series[-n:]) for f in STAT_FIELDS}
        for n in windows_min
    }


def sum_series(per_part: Sequence[list[dict[str, int]]]) -> list[dict[str, int]]:
    """Several queues' minute_series (a partitioned queue's partitions, same minutes) as one:
    counters summed; a `*_max_ms` field is the largest."""
    if len(per_part) == 1:
        return per_part[0]
    out: list[dict[str, int]] = []
    for rows in zip(*per_part, strict=True):
        row = dict(rows[0])
        for other in rows[1:]:
            for name, n in other.items():
                if name == "minute_ms":
                    continue
                row[name] = (
                    max(row.get(name, 0), n) if name.endswith("_max_ms") else (row.get(name, 0) + n)
                )
        out.append(row)
    return out


def listed_scored(ops: Ops, state: str, offset: int, limit: int) -> Op[list[tuple[float, str]]]:
    """`list_ids` with each id's index score (scored_ids), due / scheduled split at this
    queue's own server clock, as list_ids splits them: a partitioned queue's merged
    `list_jobs` orders the partitions' pages by these scores, the order each one pages in."""
    check_page(state, offset, limit)
    clocked = state in ("due", "scheduled", "finished")
    now_ms = (yield from ops.counts()).now_ms if clocked else 0
    return (yield from scored_ids(ops, state, now_ms, offset, limit))
