"""The lateness history behind the overview chart, read from Redis: the claim transition adds
each minute's start lateness (how long after its run time each job was leased) to the
minute's stats hash (lua/lib/lateness.lua: count, sum, max and a histogram), so the last hour
is the 60 stats hashes the per-minute outcomes already read (O(60), no sampling thread, the
same history in every dashboard process and after a restart)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.operations.browsing import LATENESS_BOUNDS_MS

BUCKET_MS = 60_000  # one point per stats minute


def lateness_quantile(row: dict[str, int], q: float = 0.99) -> int | None:
    """The q-quantile of a minute's start lateness from its histogram: the upper bound of the
    bucket holding it (capped by the minute's max); None for a minute with no claim."""
    n = row.get("late_n", 0)
    if n <= 0:
        return None
    need, seen = math.ceil(q * n), 0
    top = row.get("late_max_ms", 0)
    for bound in LATENESS_BOUNDS_MS:
        seen += row.get(f"late_le_{bound}", 0)
        if seen >= need:
            return min(bound, top)
    return top


def lateness_max(row: dict[str, int]) -> int | None:
    return row.get("late_max_ms", 0) if row.get("late_n", 0) > 0 else None


def lateness_mean(row: dict[str, int]) -> int | None:
    n = row.get("late_n", 0)
    return row.get("late_sum_ms", 0) // n if n > 0 else None


def merge_max(rows: Sequence[list[int | None]]) -> list[int | None]:
    """Bucket-wise maximum over several queues' series (the 'all queues' line)."""
    if not rows:
        return []
    out: list[int | None] = []
    for column in zip(*rows, strict=True):
        present = [v for v in column if v is not None]
        out.append(max(present) if present else None)
    return out
