"""`scheduler dead requeue | purge` by filter and the dashboard's "all matching", a page at a
time: the selection is never held whole (it was: 160 bytes a dead job for a purge, 500 for a
requeue with its reads of `parents`).

`dead_plan` fixes the selection before the operator is asked: its cutoff, the highest dead_ms
it takes (the age filter's, else the server's ms at the count, waited out so that a job dying
afterwards sorts above it, as the dashboard's "all matching" `upto_ms`), and its count
(`dead_count`, which the dashboard calls with its own cutoff: one ZCOUNT; with a task /
error-type filter, a scan that counts). `dead_act` then requeues or purges the matches at or
below the cutoff, newest first: scan_dead's pages of 1,000, in script calls of BATCH ids. A
call's ids read calls ago (all but a page's first call) are checked again first, by their score
alone: one still dead at or below the cutoff is the death that matched, one requeued since and
dead again sorts above it. A requeue's call takes first the dead parents its ids list
(`parents`, kept by a park) that the selection holds, and theirs: they died before their
children and would come in a later call, while requeued together each child waits for its
parent again (lib/flow.lua flow_rewait) instead of running beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from scheduler.core import codec
from scheduler.core.keys import QueueKeys
from scheduler.operations.dead_filter import listed_parents
from scheduler.operations.dead_letters import (
    DeadLetterOps,
    dead_among,
    dead_converted,
    scan_dead,
)
from scheduler.operations.requests import Commands, Op, Script, ScriptPipeline

BATCH = 100  # ids per script call (a progress step of the CLI)
_TURNS = 1_000  # clock reads at most while the server's ms passes (a clock set back: go on)
Page = list[tuple[float, str]]


def dead_cutoff(older_than_ms: int | None) -> Op[int]:
    """The highest dead_ms of the selection: the age filter's (in the past: no job dies at it
    any more), else the server's now once its ms is over (a job dying within it after the
    read would be acted on, not counted). The old dead LIST converted first."""
    if older_than_ms is not None:
        codec._int(older_than_ms, "older_than_ms", minimum=0)
    left, raw = yield ScriptPipeline([Script("dead_migrate", []), Script("counts", [])])
    if int(left) > 0:
        yield from dead_converted()
    now_ms = codec.parse_counts(raw).now_ms
    if older_than_ms:
        return now_ms - older_than_ms
    for _ in range(_TURNS):  # about 1 ms of round trips
        if codec.parse_counts((yield Script("counts", []))).now_ms > now_ms:
            break
    return now_ms


def dead_plan(
    keys: QueueKeys, older_than_ms: int | None, task: str | None, error_type: str | None
) -> Op[tuple[int, int]]:
    """(cutoff, how many dead letters match at or below it) of one queue (a partition)."""
    cutoff = yield from dead_cutoff(older_than_ms)
    return cutoff, (yield from dead_count(keys, cutoff, task, error_type))


def dead_count(keys: QueueKeys, cutoff: int, task: str | None, error_type: str | None) -> Op[int]:
    """How many dead letters match at or below a cutoff already fixed (dead_plan's, or the
    dashboard's `upto_ms`): one ZCOUNT, or a scan that counts. The caller has converted an old
    dead LIST first (dead_cutoff does, else dead_converted)."""
    if task is None and error_type is None:
        (n,) = yield Commands([("ZCOUNT", keys.dead, "-inf", cutoff)])
        return int(n)
    found = 0

    def tally(page: Page) -> Op[None]:
        nonlocal found
        found += len(page)
        yield from ()

    yield from scan_dead(keys, max_dead_ms=cutoff, task=task, error_type=error_type, each=tally)
    return found


def dead_act(
    ops: DeadLetterOps,
    verb: Literal["requeue", "purge"],
    cutoff: int,
    task: str | None,
    error_type: str | None,
    advance: Callable[[int], None],
) -> Op[int]:
    """Requeue or purge the dead letters matching at or below `cutoff` (dead_plan's, or one
    dead_count counted with, the old dead LIST converted), a page at a time, and return how
    many were (as requeue_dead / purge_dead count them). `advance(n)`: n more of the selection
    met, acted on or skipped."""
    flt: dict[str, Any] = {"max_dead_ms": cutoff, "task": task, "error_type": error_type}
    done = 0

    def act(page: Page) -> Op[None]:
        nonlocal done
        ids = [i for _, i in page]
        for n in range(0, len(ids), BATCH):
            chunk = ids[n : n + BATCH]
            ready = (yield from dead_among(ops.keys, chunk, max_dead_ms=cutoff)) if n else chunk
            if verb == "purge":
                done += yield from ops.purge_dead(ready)
                advance(len(chunk))
                continue
            sent = yield from _after_parents(ops.keys, ready, flt)
            done += yield from ops.requeue_dead(sent)
            advance(len(chunk) + len(sent) - len(ready))  # parents of later pages: met now

    yield from scan_dead(ops.keys, **flt, each=act)
    return done


def _after_parents(keys: QueueKeys, ids: list[str], flt: dict[str, Any]) -> Op[list[str]]:
    """`ids` after the dead parents the selection holds (dead_among) of each, and theirs: one
    read of `parents` and one dead_among a generation. A parent already requeued is no longer
    dead (the child waits for it); one left out by the filter is not requeued, as before."""
    out, seen, level = list(ids), set(ids), list(ids)
    while level:
        listed = yield from listed_parents(keys, level)
        new = list(dict.fromkeys(p for ps in listed.values() for p in ps if p not in seen))
        seen.update(new)
        level = (yield from dead_among(keys, new, **flt)) if new else []
        out = level + out
    return out
