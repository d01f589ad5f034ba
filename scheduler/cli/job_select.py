"""Which jobs `jobs cancel` (job_cancel.py) takes, and in what order. `waiting`: the ids of a
queue's jobs waiting in a state now (--state), read a page at a time from a (score, id) cursor
by ZRANGE BYSCORE, as scan_dead reads dead letters (operations/dead_letters.py); rank pages
against a count read once skipped or repeated ids, each job claimed (or enqueued due now)
between two pages shifting every later rank. `children_first`: each before the jobs it waits
for."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import redis

from scheduler.admin.inspection import server_now_ms
from scheduler.client.queue import Queue
from scheduler.core.keys import OCCURRENCE_PREFIX
from scheduler.operations.dead_letters import scored_pairs

_PAGE = 1_000  # ids read per round trip (a ZRANGE; children_first's SMEMBERS)
# How far before the cursor a page starts among the ids of the cursor's score (its ms): ids
# of that ms that leave between two pages (claimed, cancelled) move the cursor's rank down.
_SLACK = 64


def waiting(q: Queue, state: str, task: str | None) -> list[str]:
    """The ids of `q`'s jobs in `state` (due, scheduled, held) now, of `task` if given, each
    once, in run time order. A job there for the whole read is in it, whatever is claimed or
    enqueued meanwhile; one enqueued meanwhile is in it only if it sorts after the cursor."""
    key, lo, hi = q.keys.flow_held, "-inf", "+inf"
    if state != "held":  # the due set: scores are run times, due now up to the clock
        now_ms, key = server_now_ms(q.client, q.keys), q.keys.due
        lo, hi = ("-inf", str(now_ms)) if state == "due" else (f"({now_ms}", "+inf")
    out: list[str] = []
    seen: set[str] = set()  # an id whose score changed between pages comes again
    for page in _pages(q.client, key, lo, hi):
        # A schedule's pending run is left: cancelling it arms the next (pause the schedule).
        page = [i for i in page if i not in seen and not i.startswith(OCCURRENCE_PREFIX)]
        seen.update(page)
        if task is not None:
            page = [j.id for j in q._run(q.ops.get_jobs(page)) if j.task == task]
        out += page
    return out


def _pages(client: redis.Redis, key: str, lo: str, hi: str) -> Iterator[list[str]]:
    """The ids of ZSET `key` scored from `lo` to `hi`, a page at a time in (score, id) order.
    Each page reads from the cursor's score on: ids up to the cursor are dropped, and
    the ids of that score before the cursor are skipped by an offset that starts _SLACK
    early; when the page does not reach back to the cursor (more of them left), it is read
    again from that score's first id."""

    def read(low: str, offset: int, n: int) -> list[tuple[float, str]]:
        got = client.zrange(key, low, hi, byscore=True, offset=offset, num=n, withscores=True)
        return scored_pairs(got)

    top: float | None = None  # the cursor: the last (score, id) read
    last = ""
    ties = 0  # how many ids of score `top` the range held up to `last` (where a page starts)
    while True:
        if top is None:
            offset, n = 0, _PAGE
            raw = read(lo, 0, n)
        else:
            offset = max(0, ties - _SLACK)
            n = _PAGE + ties - offset
            raw = read(repr(top), offset, n)
            if offset and not (raw and raw[0][0] == top and raw[0][1] <= last):
                offset, n = 0, ties + _PAGE
                raw = read(repr(top), 0, n)
        yield [i for s, i in raw if top is None or s > top or i > last]
        if len(raw) < n:
            return
        s_end, i_end = raw[-1]
        if s_end == top:  # the page is all of the cursor's score (it starts there)
            ties, last = offset + len(raw), max(last, i_end)
        else:  # that score's first ids are in the page (it starts at the cursor's or offset 0)
            ties, last = sum(1 for s, _ in raw if s == s_end), i_end
        top = s_end


def children_first(q: Queue, ids: Sequence[str]) -> list[str]:
    """`ids` (once each) ordered so that each comes before every job it waits for, directly or
    through jobs left out of `ids`: cancelled first, none is parked by a later parent's cancel
    (lib/flow.lua parks a waiting child and its own). Otherwise in the order given. Reads each
    job's `flow:children:<id>` SET and those of their waiting descendants, a page per round
    trip; one not a SET (edited by hand) counts as no children."""
    kids: dict[str, list[str]] = {}
    frontier = list(dict.fromkeys(ids))
    while frontier:
        for at in range(0, len(frontier), _PAGE):
            page = frontier[at : at + _PAGE]
            pipe = q.client.pipeline(transaction=False)
            for i in page:
                pipe.smembers(f"{q.keys.prefix}flow:children:{i}")
            for i, got in zip(page, pipe.execute(raise_on_error=False), strict=True):
                kids[i] = [] if isinstance(got, Exception) else sorted(str(c) for c in got)
        frontier = list(dict.fromkeys(c for i in frontier for c in kids[i] if c not in kids))
    wanted, seen, out = set(ids), set[str](), list[str]()
    for root in dict.fromkeys(ids):  # depth first, a job after its descendants (no recursion)
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(kids[root]))]
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
