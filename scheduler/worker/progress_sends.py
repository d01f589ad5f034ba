"""Sending runs' latest `ctx.set_progress` (lua/progress.lua): with each heartbeat, and once more
ahead of a run's complete or fail, while its lease is still held, so the value set last before
the handler returned is the one kept. A value is marked carried when a call takes it and given
back when that call failed, so the next call carries it again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from scheduler.core.progress import ProgressText
from scheduler.worker.execution import Running

Carried = list[tuple[Running, ProgressText, ProgressText | None]]


class _QueueCalls(Protocol):
    script_keys: list[str]
    ops: Any


def take(rs: Iterable[Running], *, finished_too: bool) -> Carried:
    """The runs whose latest progress no call carries yet (a finished run's only when
    `finished_too`: its report follows), marked carried."""
    out: Carried = []
    for r in rs:
        ctx = r.ctx
        text = ctx._progress
        if text is not None and text is not ctx._progress_sent and (finished_too or not r.finished):
            out.append((r, text, ctx._progress_sent))
            ctx._progress_sent = text
    return out


def give_back(carried: Carried) -> None:
    """The call that took these failed: the next one carries them again (unless the handler
    set a newer value meanwhile, which goes anyway)."""
    for r, text, before in carried:
        if r.ctx._progress_sent is text:
            r.ctx._progress_sent = before


def calls(by_name: Mapping[str, _QueueCalls], carried: Carried) -> list[tuple[list[str], Any]]:
    """One `progress` call per queue for what `take` returned."""
    by_queue: dict[str, list[tuple[str, str, Any]]] = {}
    for r, text, _ in carried:
        by_queue.setdefault(r.queue, []).append((r.job.id, r.job.token, text))
    return [
        (by_name[qn].script_keys, by_name[qn].ops.progress(items)) for qn, items in by_queue.items()
    ]
