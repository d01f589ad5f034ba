"""The task / error-type filter of the dead-letter readers (dead_ids, requeue and purge by
filter): a dead job's task is its hash's, else its spec record's. A job parked before its first
claim (a child whose parent ended dead or cancelled) has no task in its hash.

One lua/dead_match.lua call per MATCH_STEP ids decides the clean cases on the server (the
hash's fields equal the filter byte for byte, or not); the ids it leaves undecided (no task in
the hash, a field that is not UTF-8, a job key of another type) are read here as before, one
HMGET each, then their spec records. 100,000 dead letters: docs/performance.md section 30.

`matching` reads no dead-letter place: `jobs cancel --state --task` filters waiting ids with
it too (cli/job_select.py).

parents_first orders the ids of a requeue that takes several script calls: parents first
(listed_parents reads them); dead_window checks a dead_ids page (offset / limit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys
from scheduler.core.spec_record import spec_fields
from scheduler.operations.requests import Commands, Op, Script, ScriptPipeline

MATCH_STEP = 1000  # ids per dead_match call (its MATCH_MAX)


def matching(
    keys: QueueKeys, pairs: list[tuple[float, str]], task: str | None, error_type: str | None
) -> Op[list[tuple[float, str]]]:
    """The (dead_ms, id) pairs whose job matches every filter given."""
    for name, value in (("task", task), ("error_type", error_type)):
        if value is not None and not isinstance(value, str):
            raise BadArgument(f"{name} must be a str or None, got {value!r:.80}")
    if not pairs:
        return []
    want = [_wanted(task), _wanted(error_type)]
    if None in want:  # a filter that is no UTF-8 text: compared as the client decodes, here
        return (yield from _read_matching(keys, pairs, task, error_type))
    args = [w for w in want if w is not None]
    replies = yield ScriptPipeline(
        [
            Script("dead_match", [*args, *(i for _, i in pairs[n : n + MATCH_STEP])])
            for n in range(0, len(pairs), MATCH_STEP)
        ]
    )
    codes = "".join(codec.s(r) for r in replies)
    unsure = [p for p, c in zip(pairs, codes, strict=True) if c == "?"]
    sure = set((yield from _read_matching(keys, unsure, task, error_type)) if unsure else [])
    return [p for p, c in zip(pairs, codes, strict=True) if c == "1" or (c == "?" and p in sure)]


def _wanted(value: str | None) -> str | None:
    """A filter as dead_match takes it: '' for none, '=' + the text; None when it cannot be
    sent as UTF-8 (a lone surrogate)."""
    if value is None:
        return ""
    try:
        value.encode()
    except UnicodeEncodeError:
        return None
    return "=" + value


def _read_each(reads: list[tuple[Any, ...]], failed: Any) -> Op[list[Any]]:
    """The replies of `reads`, in one pipeline; when one fails (a key of another type), one
    by one, `failed` in the place of each that fails."""
    try:
        return list((yield Commands(reads)))
    except ResponseError:
        out: list[Any] = []
        for cmd in reads:
            try:
                out += yield Commands([cmd])
            except ResponseError:
                out.append(failed)
        return out


def _read_matching(
    keys: QueueKeys, pairs: list[tuple[float, str]], task: str | None, error_type: str | None
) -> Op[list[tuple[float, str]]]:
    """matching by reading each job's fields here: one HMGET per id, then the spec records of
    those whose hash has no task."""
    # A job key of another type (claim parks it by its id alone): no fields.
    reads = [("HMGET", keys.job(i), "task", "last_error_type") for _, i in pairs]
    fields = yield from _read_each(reads, [None, None])
    tasks = [None if t is None else codec.s(t) for t, _ in fields]
    bare = [k for k, t in enumerate(tasks) if t is None] if task is not None else []
    if bare:
        # One edited by hand into another type: no task.
        specs = yield from _read_each([("GET", keys.spec(pairs[k][1])) for k in bare], None)
        for k, text in zip(bare, specs, strict=True):
            read = None if text is None else spec_fields(codec.s(text), None)
            tasks[k] = None if read is None else read["task"]
    kept = []
    for pair, t, (_, et) in zip(pairs, tasks, fields, strict=True):
        if task is not None and t != task:
            continue
        if error_type is not None and (et is None or codec.s(et) != error_type):
            continue
        kept.append(pair)
    return kept


def listed_parents(keys: QueueKeys, ids: Sequence[str]) -> Op[dict[str, list[str]]]:
    """Each of `ids` whose hash lists parents (`parents`, kept by a park) -> those ids: a
    pipeline of HGETs per MATCH_STEP ids, so a long list's replies are not all held at once."""
    out: dict[str, list[str]] = {}
    for n in range(0, len(ids), MATCH_STEP):
        page = ids[n : n + MATCH_STEP]
        listed = yield from _read_each([("HGET", keys.job(i), "parents") for i in page], None)
        out.update((i, codec.s(v).split()) for i, v in zip(page, listed, strict=True) if v)
    return out


def parents_first(keys: QueueKeys, ids: Sequence[str]) -> Op[list[str]]:
    """`ids` (each once) with every parent a parked child lists (`parents`) before that child,
    else in the order given: requeued in several script calls, a child whose parent comes in a
    later call finds it still dead and runs at once (lua/lib/flow.lua flow_rewait) beside its
    parent, while one call with both makes it wait again (docs/flow-control.md)."""
    ids = list(dict.fromkeys(ids))
    among = set(ids)
    listed = yield from listed_parents(keys, ids)
    parents = {i: [p for p in ps if p in among] for i, ps in listed.items()}
    out: list[str] = []
    placed: set[str] = set()

    def place(i: str) -> None:  # depth first, iteratively: a subtree may be deep
        stack = [(i, iter(parents.get(i, ())))]
        placed.add(i)
        while stack:
            node, todo = stack[-1]
            nxt = next((p for p in todo if p not in placed), None)
            if nxt is None:
                stack.pop()
                out.append(node)
            else:
                placed.add(nxt)
                stack.append((nxt, iter(parents.get(nxt, ()))))

    for i in ids:
        if i not in placed:
            place(i)
    return out


def dead_window(offset: Any, limit: Any) -> tuple[int, int | None]:
    """A dead_ids page as the slice [offset:end] of the newest matches (end None: every match
    after `offset`; the scan stops at `end`), checked as list_jobs' page is, before anything is
    read. A `limit` of 0 answers [] (PartitionedQueue.dead_ids took it so first)."""
    codec._int(offset, "offset", minimum=0)
    if limit is None:
        return offset, None
    return offset, min(offset + codec._int(limit, "limit", minimum=0), codec.MAX_SAFE_INT)
