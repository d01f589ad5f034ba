"""/workers' reads of one page of queues in three pipelines per server (per node on a cluster,
grouped as a partitioned queue's calls are: partitioned_partial.nodes_of / by_node), whatever
the number of queues: 1. each workers set's size (ZCARD), and a partitioned queue's newest ids
of each partition, so that a worker beating on every partition counts once; 2. the ids of the
page's entries; 3. their presence hashes and stop requests. Before, each queue's ZCARD and
reads were round trips of their own: 200 queues, 200 to 400 round trips a page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from scheduler.admin.workers import worker_info
from scheduler.client.partitioned_merge import answered, not_answering
from scheduler.client.partitioned_partial import by_node, nodes_of
from scheduler.client.queue import Queue
from scheduler.core.errors import slot_move_text

if TYPE_CHECKING:
    from scheduler.dashboard.store import Store

Queued = Callable[[Any], int]  # adds its commands to a pipeline, says how many
Found = tuple[list[dict[str, Any]], int, bool, list[str]]  # rows, entries, cut, unread


@dataclass
class Part:
    """One workers set: a plain queue's, or one partition's."""

    q: Queue
    error: BaseException | None = None
    size: int = 0
    newest: list[tuple[str, float]] = field(default_factory=list)  # a partition's (id, score)


@dataclass
class Share:
    """One queue's part of a /workers page: its entries counted (a partitioned queue's
    partitions merged, each worker once, newest first) and those on the page."""

    name: str
    parts: list[Part] = field(default_factory=list)
    partitioned: bool = False
    error: BaseException | None = None
    size: int = 0  # its entries: at most WORKERS_LISTED
    cut: bool = False  # a workers set holds more than WORKERS_LISTED (or their merge does)
    merged: list[tuple[str, Part, float]] = field(default_factory=list)  # a partitioned queue's
    window: tuple[int, int] = (0, 0)  # its entries [lo, hi) on this page
    page: list[tuple[str, Part, float]] = field(default_factory=list)  # (id, its set, score)
    unread: list[str] = field(default_factory=list)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def found(self) -> Found:
        if self.error is not None:
            raise self.error
        return list(self.rows.values()), self.size, self.cut, self.unread

    def failed(self, part: Part, exc: BaseException) -> None:
        """A set not read: left out (named) while another of the queue answers, else the
        queue's error, as Store.live_workers and the other pages treat it."""
        if self.partitioned and not_answering(exc):
            self.unread.append(f"partition {part.q.name}: {slot_move_text(exc) or exc}")
        elif self.error is None:
            self.error = exc


def pipelined(client: redis.Redis, parts: Sequence[Part], queue: Sequence[Queued]) -> list[Any]:
    """The replies of the commands `queue[i]` adds for `parts[i]`, a list each: one pipeline a
    node (one on a single server). A node's pipeline that fails whole puts its error in place
    of each of its parts' lists; a command's own error is in its reply's place."""
    out: list[Any] = [[] for _ in parts]
    for idx in by_node(nodes_of(client, [p.q for p in parts])):
        pipe = client.pipeline(transaction=False)
        sizes = [queue[i](pipe) for i in idx]
        if not sum(sizes):
            continue
        try:
            got: list[Any] = pipe.execute(raise_on_error=False)
        except Exception as exc:  # its node does not answer, or refuses: each queue's error
            for i in idx:
                out[i] = exc
            continue
        at = 0
        for i, n in zip(idx, sizes, strict=True):
            out[i], at = got[at : at + n], at + n
    return out


def newest_ids(key: str, n: int, skip: int = 0) -> Queued:
    def add(pipe: Any) -> int:
        if n <= 0:
            return 0
        # BYSCORE REV: the ACL roles of docs/security.md allow ZRANGE, not ZREVRANGE.
        pipe.zrange(key, "+inf", "-inf", desc=True, byscore=True, offset=skip, num=n,
                    withscores=True)  # fmt: skip
        return 1

    return add


def _sized(part: Part, newest: int) -> Queued:
    def add(pipe: Any) -> int:
        pipe.zcard(part.q.keys.workers)
        return 1 + newest_ids(part.q.keys.workers, newest)(pipe)

    return add


def _presence(part: Part, ids: list[str]) -> Queued:
    def add(pipe: Any) -> int:
        for wid in ids:
            pipe.hgetall(part.q.keys.worker(wid))
            pipe.get(part.q.keys.worker_stop(wid))
        return 2 * len(ids)

    return add


def live_probe(part: Part, ids: list[str]) -> Queued:
    """An EXISTS (live) and an HGET of `stopping` (quiet or stopping: it claims no more) of
    each id's presence hash, for a job page's reasons (Store.live_workers)."""

    def add(pipe: Any) -> int:
        for wid in ids:
            pipe.exists(part.q.keys.worker(wid))
            pipe.hget(part.q.keys.worker(wid), "stopping")
        return 2 * len(ids)

    return add


def reply_of(got: Any) -> list[Any]:
    """A part's replies, or raise its (first) error."""
    if isinstance(got, BaseException):
        raise got
    for r in got:
        if isinstance(r, BaseException):
            raise r
    return list(got)


def _settle(share: Share, listed: int) -> None:
    """Step 1 read: the sets not read named or raised (answered), the entries counted."""
    try:
        answered([p.error or p for p in share.parts])
    except Exception as exc:
        share.error = exc
        return
    for p in share.parts:
        if p.error is not None:
            share.failed(p, p.error)
    read = [p for p in share.parts if p.error is None]
    share.cut = any(p.size > listed for p in read)
    if not share.partitioned:
        share.size = min(read[0].size, listed)
        return
    best: dict[str, tuple[float, Part]] = {}  # each id at its newest score: its last beat
    for p in read:
        for wid, score in p.newest:
            if wid not in best or score > best[wid][0]:
                best[wid] = (score, p)
    order = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))
    share.cut = share.cut or len(order) > listed
    share.merged = [(wid, p, score) for wid, (score, p) in order[:listed]]
    share.size = len(share.merged)


def _row(wid: str, part: Part, seen: float, h: dict[str, Any], asked: Any) -> dict[str, Any]:
    """The row admin/workers.live_workers makes of a live worker's presence hash."""
    return worker_info(wid, part.q.name, seen, h, asked).to_json()


def read_page(
    store: Store, names: list[str], start: int, room: int, listed: int
) -> dict[str, Share]:
    """Each of `names`' share of the /workers page of entries `start` to `start + room`
    (queue by name, each queue's newest first): its rows are the live workers among them."""
    shares: list[Share] = []
    store.views_ahead([n for n in names if store.failed_recently(n) is None])
    for name in names:
        if store.failed_recently(name) is not None:
            continue  # named by Pages._each, not asked
        share = Share(name)
        shares.append(share)
        try:
            view = store.view(name)
        except Exception as exc:  # its layout record edited by hand, its node down: its row
            share.error = exc
            continue
        share.parts, share.partitioned = [Part(q) for q in view.parts], view.partitioned
    parts = [(s, p) for s in shares for p in s.parts]
    got = pipelined(
        store.client,
        [p for _, p in parts],
        [_sized(p, listed if s.partitioned else 0) for s, p in parts],
    )
    for (_, p), reply in zip(parts, got, strict=True):
        try:
            replies = reply_of(reply)
        except Exception as exc:
            p.error = exc
            continue
        p.size = int(replies[0])
        p.newest = [(str(w), float(s)) for w, s in (replies[1] if len(replies) > 1 else [])]
    for s in shares:
        if s.error is None:
            _settle(s, listed)
    skip, left = start, room  # of the entries, queue by queue
    for s in (s for s in shares if s.error is None):
        take = max(0, min(skip + left, s.size) - skip)
        s.window = (skip, skip + take) if take else (0, 0)
        left, skip = left - take, max(0, skip - s.size)
    _page_ids(store.client, shares)
    _page_rows(store.client, shares)
    return {s.name: s for s in shares}


def _page_ids(client: redis.Redis, shares: list[Share]) -> None:
    """Step 2: the ids of each share's window (a partitioned queue's are known already)."""
    plain = [s for s in shares if s.error is None and s.window[1] and not s.partitioned]
    got = pipelined(
        client,
        [s.parts[0] for s in plain],
        [
            newest_ids(s.parts[0].q.keys.workers, s.window[1] - s.window[0], s.window[0])
            for s in plain
        ],
    )
    for s, reply in zip(plain, got, strict=True):
        try:
            s.page = [(str(w), s.parts[0], float(sc)) for w, sc in reply_of(reply)[0]]
        except Exception as exc:
            s.failed(s.parts[0], exc)
    for s in shares:
        if s.partitioned and s.error is None:
            s.page = s.merged[s.window[0] : s.window[1]]


def _page_rows(client: redis.Redis, shares: list[Share]) -> None:
    """Step 3: the presence hash and stop request of each entry of the page, grouped by set."""
    sets: list[tuple[Share, Part, list[str]]] = []
    for s in shares:
        by_set: dict[int, tuple[Part, list[str]]] = {}
        for wid, p, _ in s.page:
            by_set.setdefault(id(p), (p, []))[1].append(wid)
        sets += [(s, p, ids) for p, ids in by_set.values()]
    got = pipelined(client, [p for _, p, _ in sets], [_presence(p, ids) for _, p, ids in sets])
    seen = {(id(p), wid): score for s in shares for wid, p, score in s.page}
    for (s, p, ids), reply in zip(sets, got, strict=True):
        if isinstance(reply, BaseException):
            s.failed(p, reply)
            continue
        for wid, h, asked in zip(ids, reply[0::2], reply[1::2], strict=True):
            if isinstance(h, BaseException):  # a presence hash of another type: as before
                s.failed(p, h)
                break
            if h:  # expired: the worker stopped beating
                s.rows.setdefault(wid, _row(wid, p, seen.get((id(p), wid), 0), h, asked))
    for s in shares:  # in the page's order: each queue's newest first
        order = {wid: i for i, (wid, _, _) in enumerate(s.page)}
        s.rows = dict(sorted(s.rows.items(), key=lambda kv: order[kv[0]]))
