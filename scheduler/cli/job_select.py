"""Which jobs `jobs cancel` (job_cancel.py) takes, and in what order. A `Selection`: a queue's
jobs waiting in a state now (--state), of a task, read a page at a time from a (score, id)
cursor; `batches` hands each page over to be cancelled as it is read, so the command's memory
does not grow with the state (held jobs that others wait for are kept back to the end).
`children_first`: each before the jobs it waits for, found by walking up from each id.

The cursor resumes each page by rank: the rank of the last id read (ZRANK), or of the last
page's highest id still there, or where that page was, and the page is read from a little
before it, kept only when it reaches back to the cursor (else the rank is searched for). A
ZRANGE BYSCORE ... LIMIT <offset> steps over its offset one entry at a time, so resuming inside
a run time shared by 200,000 jobs (a campaign at 09:00) made each page slower than the last;
a rank is reached in log time. Rank pages against a count read once skipped or repeated ids,
each job claimed (or enqueued due now) between two pages shifting every later rank: this rank
is read again from the cursor for each page."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import redis

from scheduler.admin.inspection import server_now_ms
from scheduler.client.queue import Queue
from scheduler.core.connection import node_for_key
from scheduler.core.keys import OCCURRENCE_PREFIX
from scheduler.operations.dead_filter import matching
from scheduler.operations.dead_letters import scored_pairs

_PAGE = 1_000  # ids read per round trip (a ZRANGE; a pipeline of children_first's reads)
# How far before the cursor's rank a page starts: ids before it that leave between reading
# the rank and the page (claimed, cancelled) move the cursor's rank down.
_SLACK = 64
Scored = tuple[float, str]


@dataclass
class Selection:
    """One queue's (or partition's) jobs of `state` and `task` for `jobs cancel --state`: the
    ZSET `key` from `lo` to `hi`, fixed when made. `counted` / `end`: how many `count` found
    and the last (score, id) it read; `batches` then goes no further than that."""

    q: Queue
    state: str
    task: str | None
    key: str
    lo: str
    hi: str
    counted: int | None = None
    end: Scored | None = None


def select(q: Queue, state: str, task: str | None) -> Selection:
    """`q`'s jobs in `state` (due, scheduled, held) now, of `task` if given. Reads the server's
    clock for every state: a partition that does not answer stops the command before any
    cancel."""
    now_ms = server_now_ms(q.client, q.keys)
    if state == "held":
        return Selection(q, state, task, q.keys.flow_held, "-inf", "+inf")
    # The due set: scores are run times, due now up to the clock.
    lo, hi = ("-inf", str(now_ms)) if state == "due" else (f"({now_ms}", "+inf")
    return Selection(q, state, task, q.keys.due, lo, hi)


def count(sel: Selection) -> int:
    """How many jobs `sel` holds now (each page read, none kept), remembering the last read."""
    n = 0
    for page in _scored_pages(sel.q.client, sel.key, sel.lo, sel.hi):
        n += len(_chosen(sel, [i for _, i in page]))
        sel.end = page[-1]
    sel.counted = n
    return n


def batches(sel: Selection) -> Iterator[list[str]]:
    """The ids of `sel`, a page at a time in run time order, each to be cancelled before the
    next page is read (after `count`: up to the last id it read, none when it found none). A
    job there for the whole read is in it, whatever is claimed or enqueued meanwhile; one
    enqueued meanwhile is in it only if it sorts after the cursor. Held: a job with waiting
    children (its `flow:children` SET not empty) comes at the end, children first, so it is
    cancelled after every selected job waiting on it, wherever that one's page is; the others
    wait for nothing of the selection to be cancelled first."""
    if sel.counted == 0:
        return
    later: list[str] = []  # held jobs others wait for: the only ids kept across pages
    for page in _scored_pages(sel.q.client, sel.key, sel.lo, sel.hi, sel.end):
        ids = _chosen(sel, [i for _, i in page])
        if sel.state == "held" and ids:
            awaited = _awaited(sel.q, ids)
            later += [i for i in ids if i in awaited]
            ids = [i for i in ids if i not in awaited]
        if ids:
            yield ids
    ordered = children_first(sel.q, later)
    for at in range(0, len(ordered), _PAGE):
        yield ordered[at : at + _PAGE]


def _chosen(sel: Selection, page: list[str]) -> list[str]:
    # A schedule's pending run is left: cancelling it arms the next (pause the schedule).
    page = [i for i in page if not i.startswith(OCCURRENCE_PREFIX)]
    if sel.task is None or not page:
        return page
    # Decided on the server from each job's task field (its hash's, else the head of its spec
    # record), as the dead-letter filter is: reading whole jobs cost 100 us a job (200,000
    # jobs of another task: 21 s).
    matched = sel.q._run(matching(sel.q.keys, [(0.0, i) for i in page], sel.task, None))
    return [i for _, i in matched]


def _awaited(q: Queue, ids: Sequence[str]) -> set[str]:
    """The ids whose `flow:children` SET is not empty; one not a SET (edited by hand) counts
    as none."""
    pipe = q.client.pipeline(transaction=False)
    for i in ids:
        pipe.scard(f"{q.keys.prefix}flow:children:{i}")
    got = pipe.execute(raise_on_error=False)
    return {i for i, n in zip(ids, got, strict=True) if isinstance(n, int) and n > 0}


def _pages(
    client: redis.Redis, key: str, lo: str, hi: str, end: Scored | None = None
) -> Iterator[list[str]]:
    """The ids of ZSET `key` scored from `lo` to `hi` (and up to `end`), a page at a time in
    (score, id) order (_scored_pages)."""
    for page in _scored_pages(client, key, lo, hi, end):
        yield [i for _, i in page]


def _scored_pages(
    client: redis.Redis, key: str, lo: str, hi: str, end: Scored | None = None
) -> Iterator[list[Scored]]:
    """The entries of ZSET `key` scored from `lo` to `hi`, and at or before `end` if given, a
    page at a time in (score, id) order, each past the last one read: the first page by score,
    the next ones by rank (the module's docstring). No call reads more than _PAGE + _SLACK."""
    top = float(hi)
    start = 0 if lo == "-inf" else int(client.zcount(key, "-inf", _below(lo)))  # a hint
    raw = scored_pairs(client.zrange(key, lo, hi, byscore=True, offset=0, num=_PAGE,
                                     withscores=True))  # fmt: skip
    want, new = _PAGE, raw
    while True:
        kept = [p for p in new if p[0] <= top and (end is None or p <= end)]
        if kept:
            yield kept
        if len(kept) < len(new) or len(raw) < want:  # past the range, or the set's end
            return
        if new:
            cursor, page = new[-1], new
        # Where the next entry is: after the cursor's id or the page's last id still there,
        # else where the page was (all of it cancelled or claimed since).
        first = _anchor(client, key, cursor, page)
        first = start + len(raw) - len(new) if first is None else first
        while True:
            start = max(0, first - _SLACK)
            want = first + _PAGE - start
            raw = scored_pairs(client.zrange(key, start, first + _PAGE - 1, withscores=True))
            if start == 0 or (raw and raw[0] <= cursor):  # it reaches back: none skipped
                break
            first = _rank_after(client, key, cursor)
        new = [p for p in raw if p > cursor]


def _anchor(client: redis.Redis, key: str, cursor: Scored, page: list[Scored]) -> int | None:
    """The rank right after `cursor`: after its id, else after the highest id of the last
    `page` still there with its score (each read with its score, atomically); None when none
    of the page is there."""
    node = node_for_key(client, key)
    found = _rank_of(node, key, cursor)
    if found is None:
        scores = client.zmscore(key, [i for _, i in page])
        there = [
            p for p, now in zip(page, scores, strict=True) if now is not None and float(now) == p[0]
        ]
        found = _rank_of(node, key, there[-1]) if there else None
    return None if found is None else found + 1


def _rank_of(node: redis.Redis, key: str, entry: Scored) -> int | None:
    """The rank of `entry`'s id, None unless it is there with `entry`'s score."""
    pipe = node.pipeline(transaction=True)
    pipe.zscore(key, entry[1])
    pipe.zrank(key, entry[1])
    score, rank = pipe.execute()
    return int(rank) if score is not None and float(score) == entry[0] else None


def _rank_after(client: redis.Redis, key: str, cursor: Scored) -> int:
    """How many entries sort at or before `cursor`: those of lower scores counted (ZCOUNT),
    then the ids of its score searched by rank, one entry a probe."""
    pipe = node_for_key(client, key).pipeline(transaction=True)
    pipe.zcount(key, "-inf", f"({cursor[0]!r}")
    pipe.zcount(key, "-inf", repr(cursor[0]))
    low, high = (int(n) for n in pipe.execute())
    while low < high:  # the ids of the cursor's score are at ranks low .. high - 1
        mid = (low + high) // 2
        got = scored_pairs(client.zrange(key, mid, mid, withscores=True))
        if got and got[0] <= cursor:
            low = mid + 1
        else:
            high = mid
    return low


def _below(lo: str) -> str:
    """The ZCOUNT bound of the scores below `lo` (a ZRANGE BYSCORE lower bound)."""
    return lo[1:] if lo.startswith("(") else f"({lo}"


def children_first(q: Queue, ids: Sequence[str]) -> list[str]:
    """`ids` (once each) ordered so that each comes before every job it waits for, directly or
    through jobs left out of `ids`: cancelled first, none is parked by a later parent's cancel
    (lib/flow.lua parks a waiting child, and its own waiting children in turn). Otherwise in
    the order given. Walks up from each id: a job in `flow:waiting` and its `parents` field,
    a page of ids per round trip, as far as the waiting jobs go (at most 100 parents a job),
    never down a parent's children, however many; a single id reads nothing. A child of a
    version before the `parents` field (none listed) counts as waiting for none."""
    ids = list(dict.fromkeys(ids))
    if len(ids) < 2:
        return ids
    kids: dict[str, list[str]] = {}  # a parent -> its waiting children met on the way up
    met, frontier = set(ids), ids
    while frontier:
        up: list[str] = []
        for at in range(0, len(frontier), _PAGE):
            page = frontier[at : at + _PAGE]
            pipe = q.client.pipeline(transaction=False)
            for i in page:
                pipe.zscore(q.keys.flow_waiting, i)
                pipe.hget(q.keys.job(i), "parents")
            got = pipe.execute(raise_on_error=False)
            for i, waits, listed in zip(page, got[::2], got[1::2], strict=True):
                # Not waiting (or a key edited by hand into another type): no cancel parks it.
                if waits is None or isinstance(waits, Exception) or not isinstance(listed, str):
                    continue
                for p in dict.fromkeys(listed.split()):
                    kids.setdefault(p, []).append(i)
                    if p not in met:
                        met.add(p)
                        up.append(p)
        frontier = up
    wanted, seen, out = set(ids), set[str](), list[str]()
    for root in ids:  # depth first, a job after the jobs waiting on it (no recursion)
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(kids.get(root, ())))]
        while stack:
            node, rest = stack[-1]
            nxt = next((c for c in rest if c not in seen), None)
            if nxt is None:
                stack.pop()
                if node in wanted:
                    out.append(node)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(kids.get(nxt, ()))))
    return out
