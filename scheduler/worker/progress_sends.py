"""Sending runs' latest `ctx.set_progress` (lua/progress.lua): with each heartbeat, and once more
ahead of a run's complete, fail or release, while its lease is still held, so the value set last
before the handler returned (or was stopped) is the one kept. A value is marked carried when a
call takes it and given back when that call failed, so the next call carries it again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
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


def ahead(by_name: Mapping[str, _QueueCalls], rs: Iterable[Running]) -> tuple[Carried, list[Any]]:
    """For a call that ends the runs `rs` (complete, fail, release): their progress no call
    carries yet, marked carried, and the calls that send it, to go first in the same round trip
    (none when nothing is unsent). Token-fenced like the call they precede: a stale run's is
    refused."""
    carried = take(rs, finished_too=True)
    return carried, calls(by_name, carried)


async def sent_ahead(
    by_name: Mapping[str, _QueueCalls],
    rs: Iterable[Running],
    items: Sequence[tuple[list[str], Any]],
    run: Callable[[Sequence[tuple[list[str], Any]]], Awaitable[list[Any]]],
) -> list[Any]:
    """`items` sent by `run` in one round trip behind the unsent progress of the runs `rs`
    (ahead); their replies. For a release at a stop: a run that set progress counts as started
    (a debounced enqueue keeps its job, lua/enqueue.lua), so it must land while the lease holds.
    A queue's progress whose call failed is carried again by the next try."""
    carried, first = ahead(by_name, rs)
    try:
        replies = await run([*first, *items])
    except BaseException:
        give_back(carried)
        raise
    queues = list(dict.fromkeys(r.queue for r, _, _ in carried))  # calls' order
    failed = {
        qn for qn, got in zip(queues, replies, strict=False) if isinstance(got, BaseException)
    }
    give_back([c for c in carried if c[0].queue in failed])
    return replies[len(first) :]
