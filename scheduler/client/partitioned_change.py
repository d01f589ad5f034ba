"""A change of every partition of a partitioned queue, each checked first: checked_change_sync /
checked_change_async, the path of pause and resume (change_sync / change_async here:
PartitionedQueue.pause / resume and the asyncio pair) and of set_dead_retention and
set_priority_aging (partitioned_lease.py, partitioned_lease_aio.py). Every partition's check
runs first (plain commands, nothing written: PausingOps.check_pause, ConfigOps.check_*), so a
partition that refuses (its config of another type, a newer version's storage) refuses the
whole change with nothing written, and its error names it (its config key), rather than the
others being changed under an error that says 'nothing written'. A partition whose node does
not answer its check is left out of the change: PartitionsNotReached names it and says the
others took it (docs/cluster.md). The check and the change apart race only a hand edit or
another operator's upgrade."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.client.partitioned_merge import (
    changed_if_lost,
    pause_word,
    reached_every,
    resume_word,
)
from scheduler.client.partitioned_partial import Lost, Make, answering_async, answering_sync

# The partitions' replies as one queue's.
_WORD = {"pause": pause_word, "resume": resume_word}


def checked_change_sync(
    q: Any, what: str, check: Make, change: Make, lost: Lost = None
) -> list[Any]:
    """check(p) of every partition of q, then change(p) of those whose check answered
    (run_answering; `lost`: a result asked again after its first reply was lost, its_retry).
    One check refusing: its error, nothing written; none answering: the first error. The
    changes' results, one per partition, or PartitionsNotReached (`what` names the change)
    naming the partitions that did not answer the check or the change."""
    checked = answering_sync(q, check, q.parts)
    each = answering_sync(q, change, _answered(q.parts, checked), lost)
    return reached_every(what, q.parts, _placed(checked, each))


async def checked_change_async(
    q: Any, what: str, check: Make, change: Make, lost: Lost = None
) -> list[Any]:
    """checked_change_sync for asyncio."""
    checked = await answering_async(q, check, q.parts)
    each = await answering_async(q, change, _answered(q.parts, checked), lost)
    return reached_every(what, q.parts, _placed(checked, each))


def change_sync(q: Any, what: str) -> str:
    """PartitionedQueue.pause / resume (`what`): checked_change_sync of check_pause, then the
    change; a reply lost and asked again counts as made (changed_if_lost)."""
    each = checked_change_sync(
        q, what, lambda p: p.ops.check_pause(), lambda p: getattr(p.ops, what)(), changed_if_lost
    )
    return _WORD[what](each)


async def change_async(q: Any, what: str) -> str:
    """change_sync for asyncio."""
    each = await checked_change_async(
        q, what, lambda p: p.ops.check_pause(), lambda p: getattr(p.ops, what)(), changed_if_lost
    )
    return _WORD[what](each)


def _answered(parts: Sequence[Any], checked: Sequence[Any]) -> list[Any]:
    """The partitions whose check answered (answering_sync raised if none did)."""
    return [p for p, r in zip(parts, checked, strict=True) if not isinstance(r, BaseException)]


def _placed(checked: Sequence[Any], changed: Sequence[Any]) -> list[Any]:
    """One result per partition: its change's, or its check's error where it did not answer."""
    it = iter(changed)
    return [r if isinstance(r, BaseException) else next(it) for r in checked]
