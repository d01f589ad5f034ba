"""One queue's row as the overview, the queue page and their JSON show it: its counts (one
counts script per partition) and the last `minutes` per-minute outcomes and start lateness (one
pipeline of small stats hashes per partition)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from scheduler.core.errors import edited_by_hand
from scheduler.core.models import QueueCounts
from scheduler.core.vocabulary import STAT_FIELDS
from scheduler.dashboard.history import lateness_max, lateness_mean, lateness_quantile
from scheduler.dashboard.logical import View
from scheduler.operations import browsing

SERIES_FIELDS = (*STAT_FIELDS, *browsing.LATENESS_FIELDS)


def minutes_read(view: View, now_ms: int, minutes: int, unread: list[str]) -> list[dict[str, int]]:
    """The queue's per-minute stats, its partitions' summed. A stats hash edited by hand into
    another type (WRONGTYPE) leaves them all out, named into `unread`: they are figures beside
    the counts, which are still shown."""
    try:
        each = view.run_each(
            lambda q: browsing.minute_series(q.keys, now_ms, minutes, SERIES_FIELDS),
            partial=True,
        )
    except ResponseError as exc:
        if not edited_by_hand(exc):
            raise
        unread.append(f"per-minute stats: a stats key edited by hand ({exc}): not shown")
        first = (now_ms // 60_000 - minutes + 1) * 60_000
        return [dict.fromkeys(SERIES_FIELDS, 0) | {"minute_ms": first + i * 60_000}
                for i in range(minutes)]  # fmt: skip
    return browsing.sum_series([s for s in each if not isinstance(s, BaseException)])


def queue_summary(view: View, minutes: int = 60) -> dict[str, Any]:
    """Counts, per-minute outcomes and start lateness of the queue."""
    c, paused_parts, unread = view.counts_and_paused()
    series = minutes_read(view, c.now_ms, minutes, unread)
    return summary_row(view, c, paused_parts, unread, series)


def summary_row(
    view: View,
    c: QueueCounts,
    paused_parts: list[str],
    unread: list[str],
    series: list[dict[str, int]],
) -> dict[str, Any]:
    """The row of the queue's counts (View.counts_and_paused) and minutes (minutes_read)."""
    last = series[-2] if len(series) > 1 else series[-1]  # the last whole minute
    return {
        "queue": view.name,
        "partitions": view.part_names if view.partitioned else [],
        "now_ms": c.now_ms,
        "due": c.due,
        # Of `due`, set aside by flow control, by reason (held_key_limit, ...).
        "held": sum(c.held.values()),
        **{f"held_{reason}": n for reason, n in c.held.items()},
        "scheduled": c.scheduled,
        "leased": c.leased,
        "dead": c.dead,
        "lapsed": c.lapsed,
        "moving": c.moving,  # taken out of due by `scheduler queue move`, not yet moved
        "oldest_overdue_ms": c.oldest_overdue_ms,
        # Since when its claims lease nothing (Queue.pause); None while it is not paused.
        # Merged: the earliest pause when any partition is paused; which ones are, here.
        "paused_ms": c.paused_ms,
        "paused_partitions": paused_parts,
        # A partitioned queue's partitions left out (node down, slot being moved): the
        # counts are the others' (the overview names these under "not read").
        "unread_partitions": unread,
        "done_per_min": last.get("done", 0),
        "failed_per_min": last.get("fail", 0),
        "minutes": [r["minute_ms"] for r in series],
        "done": [r.get("done", 0) for r in series],
        "failed": [r.get("fail", 0) for r in series],
        "dead_per_min": [r.get("dead", 0) for r in series],
        "late_p99_last_ms": lateness_quantile(last),
        "late_p99_ms": [lateness_quantile(r) for r in series],
        "late_max_ms": [lateness_max(r) for r in series],
        "late_mean_ms": [lateness_mean(r) for r in series],
    }
