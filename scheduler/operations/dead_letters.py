"""Dead letters: find (dead_ids), requeue and purge the jobs that ran out of attempts.

The dead key is a ZSET id -> dead_ms (lua/lib/job.lua); a LIST left by an older version is
converted in bounded steps by whichever script touches it first. Readers that page the key here
drive the conversion to its end first (dead_migrate, at most 1,000 ids per call), so a page is
never read from a half-converted key.

A scan (dead_scored) pages newest first by a (dead_ms, id) cursor, not by offset: a job that
dies, or one requeued, while the scan runs moves every later offset, so offset pages could
return an id twice or skip one; a cursor resumes just below the last id it returned."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.operations.dead_filter import dead_window as dead_window  # for the clients
from scheduler.operations.dead_filter import matching, parents_first
from scheduler.operations.requests import Commands, Op, OpsBase, Script, ScriptPipeline


def dead_converted() -> Op[None]:
    """Finish converting an old dead LIST, one bounded script call at a time."""
    while int((yield Script("dead_migrate", []))) > 0:
        pass


def dead_page(keys: QueueKeys, offset: int, limit: int) -> Op[list[str]]:
    """Dead ids newest first (highest dead_ms), `limit` from `offset`."""
    yield from dead_converted()
    (ids,) = yield Commands([("ZRANGE", keys.dead, offset, offset + limit - 1, "REV")])
    return [codec.s(i) for i in ids]


def scored_pairs(reply: Any) -> list[tuple[float, str]]:
    """A ZRANGE ... WITHSCORES reply as (score, member): RESP2 sends member, score, ...;
    RESP3 (or a client callback) sends pairs."""
    flat: list[Any] = []
    for item in reply:
        flat += list(item) if isinstance(item, (list, tuple)) else [item]
    return [(float(flat[i + 1]), codec.s(flat[i])) for i in range(0, len(flat) - 1, 2)]


def _bound(score: float) -> str:
    return repr(score)  # 'inf' / '-inf' / '1700000000000.0': ZRANGE BYSCORE reads them all


def scan_dead(
    keys: QueueKeys,
    *,
    max_dead_ms: int | None = None,
    task: str | None = None,
    error_type: str | None = None,
    limit: int | None = None,
    page: int = 1000,
    each: Callable[[list[tuple[float, str]]], Op[None]] | None = None,
) -> Op[list[tuple[float, str]]]:
    """(dead_ms, id) of the dead letters that died at or before `max_dead_ms` (all: None) and
    match `task` / `error_type`, newest first, at most `limit` of them (all: None). With `each`,
    each page's go to it as they are read, none kept ([] returned: a scan of any length). The
    caller has converted an old dead LIST first (dead_converted). Each page is one ZRANGE
    BYSCORE REV from the cursor (plus one dead_match call per 1,000 ids when filtering by task
    or error, dead_filter.py): the age cut is the score, no job record is read for it. Never
    returns an id twice."""
    codec._int(page, "page", minimum=1)
    if limit is not None:  # PartitionedQueue.dead_ids takes it from the caller
        codec._int(limit, "limit", minimum=0)
    out: list[tuple[float, str]] = []
    top: float | None = None  # the cursor: the last (score, id) returned, and how many
    last = ""  #               entries of that score the range holds down to `last`
    ties = 0
    floor = ""  # the lowest id of the cursor's ms returned or passed over
    by_record = task is not None or error_type is not None
    while limit is None or len(out) < limit:
        step = page if limit is None else _step(limit - len(out), by_record, page)
        hi = ("+inf" if max_dead_ms is None else max_dead_ms) if top is None else _bound(top)

        def page_cmd(offset: int, n: int, hi: Any = hi) -> tuple[Any, ...]:
            return ("ZRANGE", keys.dead, hi, "-inf", "BYSCORE", "REV", "LIMIT", offset, n,
                    "WITHSCORES")  # fmt: skip

        margin = 0
        if top is None:
            (reply,) = yield Commands([page_cmd(0, step)])
        else:
            # Ids of the cursor's ms requeued or purged since the last page move `last` up:
            # the page starts _SLACK entries early (the filter below drops what this scan
            # returned or passed over), and where `last` stands now comes in the same
            # pipeline; only when more than _SLACK left does a second call read from there.
            margin = _SLACK
            offset = max(0, ties - margin)
            score, rank, above, reply = yield Commands(
                [("ZSCORE", keys.dead, last), ("ZREVRANK", keys.dead, last),
                 ("ZCOUNT", keys.dead, f"({_bound(top)}", "+inf"), page_cmd(offset, step + margin)]
            )  # fmt: skip
            here = 0  # `last` gone (or died again at another ms): from the top of its ms
            if score is not None and rank is not None and float(score) == top:
                here = int(rank) - int(above) + 1
            if here < offset:
                offset = max(0, here - margin)
                (reply,) = yield Commands([page_cmd(offset, step + margin)])
            ties = offset  # what the range holds of the cursor's ms before this page
        raw = scored_pairs(reply)
        if not raw:
            return out
        # An id that died at the cursor's very ms after the last page (sorting above `last`)
        # is one this scan passed over or returned: skipped, so nothing comes back twice.
        fresh = [(s, i) for s, i in raw if top is None or s != top or i < floor]
        s_end, last = raw[-1]
        run = sum(1 for s, _ in raw if s == s_end)
        ties = ties + len(raw) if top is not None and s_end == top else run
        # Ids that died at the cursor's ms above `last` since the last page push it down, so
        # a page may end above it: `last` then moves back up, `floor` (what was returned) not.
        floor = min(floor, last) if top is not None and s_end == top else last
        top = s_end
        if by_record:
            fresh = yield from matching(keys, fresh, task, error_type)
        if each is None:
            out.extend(fresh)
        else:  # the caller acts on the page, or counts it (dead_bulk.py)
            yield from each(fresh)
        if len(raw) < step + margin:
            break
    return out if limit is None else out[:limit]


# How far before the cursor a page starts: ids of the cursor's ms that may leave between pages.
_SLACK = 64


def _step(wanted: int, by_record: bool, page: int) -> int:
    """A page for `wanted` more matches: exactly that many without a record filter; with
    one, a few times more (a filter keeps some of them), at most `page`."""
    return min(page, max(wanted * 4, 100) if by_record else wanted)


def dead_cut(older_than_ms: int | None) -> Op[int | None]:
    """Convert an old dead LIST first (once), and the highest dead_ms `older_than_ms` keeps
    (None: no age filter): the clock comes in the conversion's round trip."""
    if older_than_ms is None:
        yield from dead_converted()
        return None
    codec._int(older_than_ms, "older_than_ms", minimum=0)
    left, raw = yield ScriptPipeline([Script("dead_migrate", []), Script("counts", [])])
    if int(left) > 0:
        yield from dead_converted()
    return codec.parse_counts(raw).now_ms - older_than_ms


def dead_among(
    keys: QueueKeys,
    ids: Sequence[str],
    *,
    max_dead_ms: int | None = None,
    task: str | None = None,
    error_type: str | None = None,
) -> Op[list[str]]:
    """Those of `ids` that are dead letters matching the filters (scan_dead's), in the order
    given: one ZMSCORE (plus dead_match over the dead ones with a record filter), not a scan."""
    if not ids:
        return []
    (scores,) = yield Commands([("ZMSCORE", keys.dead, *ids)])
    dead = [
        (float(sc), i)
        for i, sc in zip(ids, scores, strict=True)
        if sc is not None and (max_dead_ms is None or float(sc) <= max_dead_ms)
    ]
    if task is not None or error_type is not None:
        dead = yield from matching(keys, dead, task, error_type)
    return [i for _, i in dead]


def dead_listing(
    keys: QueueKeys,
    *,
    task: str | None = None,
    error_type: str | None = None,
    older_than_ms: int | None = None,
    limit: int,
) -> Op[tuple[list[tuple[float, str]], int | None]]:
    """The newest `limit` matches (scan_dead), and how many match in all when the dead ZSET
    alone tells (no task / error filter: a ZCOUNT of the age range), else None."""
    max_dead_ms = yield from dead_cut(older_than_ms)
    found = yield from scan_dead(
        keys, max_dead_ms=max_dead_ms, task=task, error_type=error_type, limit=limit
    )
    if task is not None or error_type is not None:
        return found, None
    top = "+inf" if max_dead_ms is None else max_dead_ms
    (n,) = yield Commands([("ZCOUNT", keys.dead, "-inf", top)])
    return found, int(n)


def dead_selected(
    keys: QueueKeys,
    ids: Sequence[str],
    *,
    task: str | None = None,
    error_type: str | None = None,
    older_than_ms: int | None = None,
) -> Op[list[str]]:
    """dead_among with the age as dead_ids takes it (the old-LIST conversion first)."""
    max_dead_ms = yield from dead_cut(older_than_ms)
    return (
        yield from dead_among(keys, ids, max_dead_ms=max_dead_ms, task=task, error_type=error_type)
    )


def check_id_list(ids: Sequence[str]) -> Sequence[str]:
    """The ids of a requeue or purge, as given: a str would be read character by character, each
    a dead id nobody named. Any str is an id (the dead list may hold ids no API would make)."""
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise BadArgument(f"ids must be a list of job ids, got {ids!r:.80}")
    for i in ids:
        if not isinstance(i, str):
            raise BadArgument(f"a job id is a str, got {i!r:.80}")
        if not i.isascii():
            try:
                i.encode()
            except UnicodeEncodeError as exc:  # a lone surrogate cannot be sent
                raise BadArgument(f"job id {i!r:.80} is not valid Unicode: {exc.reason}") from None
    return ids


class DeadLetterOps(OpsBase):
    """Dead letters; documented for users on Queue.dead_ids, requeue_dead, purge_dead (their
    retention setting: ConfigOps, queue_config.py)."""

    def dead_ids(
        self, *, offset: int = 0, limit: int | None = None, **filters: Any
    ) -> Op[list[str]]:
        """Dead ids (newest first) matching every filter given (all when none is; dead_scored
        takes them), `limit` of them (None: all) after the first `offset`."""
        offset, end = dead_window(offset, limit)
        found = yield from self.dead_scored(limit=end, **filters)
        return [i for _, i in found[offset:]]

    def dead_scored(
        self,
        *,
        task: str | None = None,
        error_type: str | None = None,
        older_than_ms: int | None = None,
        limit: int | None = None,
        page: int = 1000,
    ) -> Op[list[tuple[float, str]]]:
        """(dead_ms, id) of the dead ids matching every filter, newest first, at most `limit`
        (scan_dead). The old-LIST check runs once, with the clock read in the same round trip
        when an age filter needs it."""
        max_dead_ms = yield from dead_cut(older_than_ms)
        return (
            yield from scan_dead(
                self.keys,
                max_dead_ms=max_dead_ms,
                task=task,
                error_type=error_type,
                limit=limit,
                page=page,
            )
        )

    def requeue_dead(self, ids: Sequence[str], batch_size: int = 500) -> Op[int]:
        """Move these dead jobs back to due with a fresh attempt budget; returns how many."""
        ids = check_id_list(ids)
        if len(ids) > batch_size:  # several script calls: each parent in one before its children
            ids = yield from parents_first(self.keys, ids)
        moved, i = 0, 0
        while i < len(ids):
            sent = list(ids[i : i + batch_size])
            reply = yield Script("requeue_dead", sent)
            # [requeued, handled]: the call's parent links (lua/requeue_dead.lua, at most
            # REQUEUE_LINKS_PER_CALL) stopped it before the end; the rest go in the next call.
            done, handled = (reply[0], reply[1]) if isinstance(reply, list) else (reply, len(sent))
            moved += int(done)
            i += max(int(handled), 1)
        return moved

    def purge_dead(self, ids: Sequence[str], batch_size: int = 500) -> Op[int]:
        """Delete these dead jobs for good (an id whose job keys are gone just leaves the dead
        list); returns how many ids left it."""
        ids = check_id_list(ids)
        purged = 0
        for i in range(0, len(ids), batch_size):
            purged += int((yield Script("purge_dead", list(ids[i : i + batch_size]))))
        return purged
