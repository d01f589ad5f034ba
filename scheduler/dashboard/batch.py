"""The overview's and /health's reads of a page of queues as one driver call a node (grouped
as a partitioned queue's calls are: partitioned_partial.nodes_of / by_node), whatever the
number of queues: every queue's counts script at once, then (the overview) every queue's
per-minute stats at once. Each queue's were driver calls of its own: 200 queues, 400 round
trips an overview, polled every 3 s. A queue any of whose reads failed in the batch is left
to the page's own read of it alone (View.counts_and_paused, queue_summary), which names or
raises its error as before; the batch only saves the round trips of those that answered."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import redis

from scheduler.client.partitioned_merge import merge_counts
from scheduler.client.partitioned_partial import by_node, nodes_of
from scheduler.client.queue import Queue
from scheduler.core.models import QueueCounts
from scheduler.core.scripts import Scripts, run_sync
from scheduler.dashboard.logical import View
from scheduler.dashboard.summary import SERIES_FIELDS, summary_row
from scheduler.operations import browsing
from scheduler.operations.requests import Op, Request

if TYPE_CHECKING:
    from scheduler.dashboard.store import Store

Counted = tuple[View, QueueCounts, list[str]]  # a view, its counts, its paused partitions


# This request's reads made at once (kind, queue) -> its value, taken by the Store's per-queue
# reads (Store.counts, Store.queue_summary), which stay the pages' one way to a queue's figures.
_AHEAD: ContextVar[dict[tuple[str, str], Any] | None] = ContextVar("read_ahead", default=None)


def ahead(
    kind: str, at_once: Callable[[Store, list[str]], dict[str, Any]], store: Store
) -> Callable[[list[str]], None]:
    """Pages._paged's `prepare`: at_once(store, the page's names), handed to take()."""

    def prepare(names: list[str]) -> None:
        _AHEAD.set(None)  # a worker thread's last request's, were it left: never taken
        _AHEAD.set({(kind, name): v for name, v in at_once(store, names).items()})

    return prepare


def take(kind: str, name: str) -> Any | None:
    """The value of queue `name` this request read at once, once; None: read it alone."""
    found = _AHEAD.get()
    return None if found is None else found.pop((kind, name), None)


def run_ops(client: redis.Redis, ops: Sequence[tuple[Queue, Op[Any]]]) -> list[Any]:
    """Each operation's result, or its error in its place: each round of their requests one
    driver call a node (one on a single server); a node that fails whole fails its own."""
    out: list[Any] = [None] * len(ops)
    for idx in by_node(nodes_of(client, [q for q, _ in ops])):
        try:
            got = _drive(client, ops[idx[0]][0]._scripts, [ops[i] for i in idx])
        except Exception as exc:  # its node does not answer: each queue read alone (named)
            got = [exc] * len(idx)
        for i, r in zip(idx, got, strict=True):
            out[i] = r
    return out


def _drive(
    client: redis.Redis, scripts: Scripts, ops: Sequence[tuple[Queue, Op[Any]]]
) -> list[Any]:
    # PartitionedQueue._run_many's loop, over queues that are not one queue's partitions.
    results: list[Any] = [None] * len(ops)
    pending: dict[int, Request] = {i: next(op) for i, (_, op) in enumerate(ops)}
    while pending:
        order = list(pending)
        items = [(ops[i][0].keys.script_keys(), pending[i]) for i in order]
        replies = run_sync(client, scripts.drive(items))
        pending = {}
        for i, reply in zip(order, replies, strict=True):
            op = ops[i][1]
            try:
                pending[i] = op.throw(reply) if isinstance(reply, BaseException) else op.send(reply)
            except StopIteration as done:
                results[i] = done.value
            except Exception as exc:
                results[i] = exc
    return results


def views(store: Store, names: Sequence[str]) -> list[View]:
    """The views of `names` a batch reads (not one that failed a moment ago, nor one whose
    view cannot be had: each is read alone, and named)."""
    out = []
    store.views_ahead([n for n in names if store.failed_recently(n) is None])
    for name in names:
        if store.failed_recently(name) is not None:
            continue  # named by Pages._each, not asked
        try:
            out.append(store.view(name))
        except Exception:  # its partition record edited by hand, ...: read alone, named
            continue
    return out


def counted(store: Store, names: Sequence[str]) -> dict[str, Counted]:
    """The counts of each of `names` every part of which answered, in one driver call a node:
    as View.counts_and_paused has them (merged; the paused partitions)."""
    views_ = views(store, names)
    parts = [(v, q) for v in views_ for q in v.parts]
    got = run_ops(store.client, [(q, q.ops.counts()) for _, q in parts])
    each: dict[str, list[Any]] = {}
    for (v, _), r in zip(parts, got, strict=True):
        each.setdefault(v.name, []).append(r)
    out: dict[str, Counted] = {}
    for v in views_:
        cs = each.get(v.name, [])
        if cs and not any(isinstance(c, BaseException) for c in cs):
            paused = [q.name for q, c in zip(v.parts, cs, strict=True) if c.paused and v.pq]
            out[v.name] = (v, cs[0] if len(cs) == 1 else merge_counts(cs), paused)
    return out


def counts(store: Store, names: Sequence[str]) -> dict[str, tuple[QueueCounts, list[str]]]:
    """Store.counts of each of `names` that answered whole, read at once."""
    return {name: (c, []) for name, (_, c, _) in counted(store, names).items()}


def summaries(store: Store, names: Sequence[str], minutes: int = 60) -> dict[str, dict[str, Any]]:
    """Store.queue_summary of each of `names` that answered whole: the counts of all at once,
    then all their minutes at once."""
    found = counted(store, names)
    parts = [(name, q, c.now_ms) for name, (v, c, _) in found.items() for q in v.parts]
    ops = [(q, browsing.minute_series(q.keys, now_ms, minutes, SERIES_FIELDS))
           for _, q, now_ms in parts]  # fmt: skip
    got = run_ops(store.client, ops)
    each: dict[str, list[Any]] = {}
    for (name, _, _), r in zip(parts, got, strict=True):
        each.setdefault(name, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, (v, c, paused) in found.items():
        series = each.get(name, [])
        if series and not any(isinstance(s, BaseException) for s in series):
            out[name] = summary_row(v, c, paused, [], browsing.sum_series(series))
    return out
