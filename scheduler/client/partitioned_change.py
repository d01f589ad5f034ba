"""A partitioned queue's pause and resume (PartitionedQueue.pause / resume and the asyncio
pair): every partition is checked first (PausingOps.check_pause, plain commands, nothing
written), so a partition that refuses (its config of another type, a newer version's storage)
refuses the whole change with nothing written, and its error names it (its config key), rather
than the others being paused under an error that says 'nothing written'. A partition whose node
does not answer the check is left out of the change: PartitionsNotReached names it and says the
others took it (docs/cluster.md). The check and the change apart race only a hand edit or
another operator's upgrade, as set_priority_aging's do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.client.partitioned_merge import (
    changed_if_lost,
    pause_word,
    reached_every,
    resume_word,
)
from scheduler.client.partitioned_partial import answering_async, answering_sync

# The partitions' replies as one queue's.
_WORD = {"pause": pause_word, "resume": resume_word}


def change_sync(q: Any, what: str) -> str:
    """PartitionedQueue.pause / resume (`what`): check_pause of every partition, then the change
    of those that answered it (run_answering, then changed_if_lost)."""
    checked = answering_sync(q, lambda p: p.ops.check_pause(), q.parts)
    asked = _answered(q.parts, checked)
    each = answering_sync(q, lambda p: getattr(p.ops, what)(), asked, changed_if_lost)
    return _WORD[what](reached_every(what, q.parts, _placed(checked, each)))


async def change_async(q: Any, what: str) -> str:
    """change_sync for asyncio."""
    checked = await answering_async(q, lambda p: p.ops.check_pause(), q.parts)
    asked = _answered(q.parts, checked)
    each = await answering_async(q, lambda p: getattr(p.ops, what)(), asked, changed_if_lost)
    return _WORD[what](reached_every(what, q.parts, _placed(checked, each)))


def _answered(parts: Sequence[Any], checked: Sequence[Any]) -> list[Any]:
    """The partitions whose check answered (answering_sync raised if none did)."""
    return [p for p, r in zip(parts, checked, strict=True) if not isinstance(r, BaseException)]


def _placed(checked: Sequence[Any], changed: Sequence[Any]) -> list[Any]:
    """One result per partition: its change's, or its check's error where it did not answer."""
    it = iter(changed)
    return [r if isinstance(r, BaseException) else next(it) for r in checked]
