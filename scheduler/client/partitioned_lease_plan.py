"""The plan and the merges of a partitioned queue's manual lease API, shared by its sync
(partitioned_lease.py) and asyncio (partitioned_lease_aio.py) mixins: a claim's shares and its
merged batch, the calls by job id grouped by partition and their statuses put back in the
caller's order (module docstring of partitioned_lease.py)."""

from __future__ import annotations

import hashlib
import itertools
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from redis.exceptions import AskError

from scheduler.client.partitioned_merge import PartitionsNotReached, not_answering
from scheduler.core import codec
from scheduler.core.errors import BadArgument, slot_move_text
from scheduler.core.json_text import encode_json
from scheduler.core.limits import check_lease
from scheduler.core.models import ClaimBatch, ClaimedJob, _EncodedResult
from scheduler.core.partitions import Layout
from scheduler.operations.ops import Op

_TAG = re.compile(r"p(\d{1,4})\.")
Groups = dict[int, list[int]]  # partition -> the indices of the call's items routed there
Why = dict[int, tuple[str, str]]  # item not reached -> (its partition, the error)


@dataclass(frozen=True)
class PartitionedClaimBatch(ClaimBatch):
    """A partitioned queue's `claim`: a `ClaimBatch` of every partition that answered (`now_ms`
    the latest of their clocks, `next_ms` the earliest time on that clock, `jobs` in each
    partition's claim order, the partitions taking turns (`interleaved`), `suspect` the first
    partition's), plus `not_reached`: partition name -> why, for each
    partition whose node did not answer (or refused for now); {} when all answered."""

    not_reached: dict[str, str] = field(default_factory=dict)


def claim_start(n: int, nonce: str) -> int:
    """The first partition of a claim's rotation: random per call, fixed by its nonce."""
    return zlib.crc32(nonce.encode()) % n


def round_nonce(nonce: str) -> str:
    """The second round's nonce: derived, so a re-sent call replays that round too."""
    return hashlib.sha256(f"{nonce}:2".encode()).hexdigest()[:32]


def split(ks: Sequence[int], limit: int) -> dict[int, int]:
    """`limit` over the partitions `ks` (in turn order): even shares, the first get one more."""
    base, extra = divmod(limit, len(ks))
    return {k: base + (j < extra) for j, k in enumerate(ks)}


def turn_order(n: int, start: int) -> list[int]:
    return [(start + j) % n for j in range(n)]


def second_round(
    order: Sequence[int], shares: dict[int, int], got: dict[int, Any], limit: int
) -> dict[int, int]:
    """Shares of what the first round (`got`) left of `limit` over the partitions that
    answered, took their whole share and have more due now. None when a partition did not
    answer: what it took is unknown, so a re-sent nonce (that partition answering) would plan
    other shares than the replayed ones and return more than `limit`."""
    if any(isinstance(b, BaseException) for b in got.values()):
        return {}
    left = limit - sum(len(b.jobs) for b in got.values() if isinstance(b, ClaimBatch))
    more = [
        k
        for k in order
        if isinstance(b := got.get(k), ClaimBatch)
        and len(b.jobs) >= shares[k]
        and 0 <= b.next_ms <= b.now_ms
    ]
    return split(more, left) if more and left > 0 else {}


def alone(order: Sequence[int], got: dict[int, Any]) -> ClaimedJob | None:
    """The first round's last-attempt suspect: it runs alone (docs/durability.md), so no second
    round, and what the other partitions leased is given back (`besides`, then `without`)."""
    for k in order:
        if isinstance(b := got.get(k), ClaimBatch) and b.suspect is not None:
            for j in b.jobs:
                if j.id == b.suspect and j.attempts >= j.max_attempts:
                    return j
    return None


def besides(rounds: Sequence[dict[int, Any]], job: ClaimedJob) -> list[tuple[str, str]]:
    return [(j.id, j.token) for r in rounds for b in r.values() if isinstance(b, ClaimBatch)
            for j in b.jobs if j.id != job.id]  # fmt: skip


def without(rounds: Sequence[dict[int, Any]], leases: Any, statuses: Any) -> list[dict[int, Any]]:
    """The rounds less the jobs the release answered (a 'stale' one, say, after a replay)."""
    gone = {jid for (jid, _), st in zip(leases, statuses, strict=False) if st is not None}

    def less(b: ClaimBatch) -> ClaimBatch:
        out = [j for j in b.jobs if j.id not in gone]
        return replace(b, jobs=out, suspect=None if b.suspect in gone else b.suspect)

    return [{k: less(b) if isinstance(b, ClaimBatch) else b for k, b in r.items()} for r in rounds]


@dataclass(frozen=True)
class _Refused:
    error: Exception


def refusing(make: Callable[[Any], Op[ClaimBatch]]) -> Callable[[Any], Op[Any]]:
    """make(partition) of a claim round, whose refusal (CorruptKey, ...) is its result: other
    partitions' jobs are leased, so no partition's error may hide them (`kept`)."""

    def op(p: Any) -> Op[Any]:
        try:
            return (yield from make(p))
        except Exception as exc:
            if not_answering(exc) or isinstance(exc, AskError):  # run_answering's to handle
                raise
            return _Refused(exc)

    return op


def kept(got: Sequence[Any]) -> list[Any]:
    """A round's results, a refusal as its error (named in `not_reached`)."""
    return [r.error if isinstance(r, _Refused) else r for r in got]


def first_round(got: Sequence[Any]) -> dict[int, Any]:
    """The first round's results by partition (`kept`): a partition refusing it (a key edited
    by hand, a newer version's storage) is named in not_reached while the others' leased jobs
    are returned; none leased anything: the first refusal is raised, as Queue.claim's."""
    out = kept(got)
    if not any(isinstance(r, ClaimBatch) for r in out):
        raise next(r for r in out if isinstance(r, BaseException))
    return dict(enumerate(out))


def interleaved(order: Sequence[int], rounds: Sequence[dict[int, Any]]) -> list[ClaimedJob]:
    """The rounds' jobs, each partition's in its claim's order (its first round's, then its
    second's) and the partitions taking turns in `order`. Not re-sorted by run time: that put
    a partition's priority-9 job behind its older priority-0 one, the order Queue.claim and
    the worker follow (aged, then priority, then run_at: docs/flow-control.md "Priorities");
    partitions' priorities and clocks cannot be compared, so turns keep the batch fair."""
    each = [[j for r in rounds if isinstance(b := r.get(k), ClaimBatch) for j in b.jobs]
            for k in order]  # fmt: skip
    return [j for turn in itertools.zip_longest(*each) for j in turn if j is not None]


def merged_claim(
    parts: Sequence[Any], order: Sequence[int], rounds: Sequence[dict[int, Any]]
) -> PartitionedClaimBatch:
    """The batches of each round (partition -> batch or error) as one, jobs `interleaved`
    in the turn `order`; errors of every round named in not_reached (a second round's error
    keeps the first round's jobs)."""
    batches = [b for r in rounds for b in r.values() if isinstance(b, ClaimBatch)]
    last = {k: b for r in rounds for k, b in r.items() if isinstance(b, ClaimBatch)}
    now_ms = max(b.now_ms for b in batches)
    waits = [b.next_ms - b.now_ms for b in last.values() if b.next_ms >= 0]
    jobs = interleaved(order, rounds)
    missing = {
        parts[k].name: slot_move_text(b) or str(b)
        for r in rounds
        for k, b in r.items()
        if isinstance(b, BaseException)
    }
    return PartitionedClaimBatch(
        now_ms,
        now_ms + min(waits) if waits else -1,
        jobs,
        [u for b in batches for u in b.unreadable],
        next((b.suspect for b in batches if b.suspect is not None), None),
        not_reached=missing,
    )


def claimer(
    parts: Sequence[Any],
    worker_id: str,
    share: dict[int, int],
    lease_ms: int,
    reap: int,
    nonce: str,
) -> Callable[[Any], Op[ClaimBatch]]:
    """make(partition) of a claim round: each partition of `share` for its share."""
    at = {id(parts[k]): n for k, n in share.items()}
    return lambda p: p.ops.claim(
        worker_id, limit=at[id(p)], lease_ms=lease_ms, reap_limit=reap, nonce=nonce
    )


def for_items(
    parts: Sequence[Any],
    groups: Groups,
    items: Sequence[Any],
    make: Callable[[Any, list[Any]], Op[Any]],
) -> Callable[[Any], Op[Any]]:
    """make(partition) of a call by id: make(p, its items) for each partition of `groups`."""
    at = {id(parts[k]): [items[i] for i in g] for k, g in groups.items()}
    return lambda p: make(p, at[id(p)])


def routed_items(layout: Layout, ids: Sequence[str]) -> Groups:
    groups: Groups = {}
    for i, job_id in enumerate(ids):
        groups.setdefault(layout.partition_of_id(job_id), []).append(i)
    return groups


def tagged(layout: Layout, job_id: str) -> bool:
    """The id names its partition (`p<k>.`, k < n): made by the partitioned queue, so the job
    is in no other partition."""
    m = _TAG.match(job_id)
    return m is not None and int(m.group(1)) < layout.n


def strays(layout: Layout, ids: Sequence[str], out: Sequence[Any]) -> Groups:
    """For each partition, the items answered 'missing' whose untagged id routes elsewhere."""
    lost = [i for i, st in enumerate(out) if st == "missing" and not tagged(layout, ids[i])]
    groups: Groups = {}
    for k in range(layout.n) if lost else ():
        there = [i for i in lost if layout.partition_of_id(ids[i]) != k]
        if there:
            groups[k] = there
    return groups


def place(
    parts: Sequence[Any], groups: Groups, each: Sequence[Any], out: list[Any], why: Why, first: bool
) -> None:
    """Each group's statuses into `out`, the first pass's as they are (an error: None, and its
    partition's name in `why`); a stray pass's only where it found the job, or an error where
    none has yet (the job may be in that partition: not 'missing', None)."""
    for k, r in zip(groups, each, strict=True):
        for j, i in enumerate(groups[k]):
            if isinstance(r, BaseException):
                if first or out[i] == "missing":
                    out[i], why[i] = None, (parts[k].name, slot_move_text(r) or str(r))
            elif first or r[j] != "missing":
                out[i] = r[j]
                why.pop(i, None)


def settled(what: str, parts: Sequence[Any], why: Why, out: Any) -> None:
    """PartitionsNotReached carrying `out` (None for the items not reached), if any was not."""
    if why:
        failed = dict(why.values())
        done = [p.name for p in parts if p.name not in failed]
        errors = list(dict.fromkeys(failed.values()))
        raise PartitionsNotReached(what, done, list(failed), errors, partial=out)


def completions(
    items: Sequence[tuple[str, str, Any]], max_bytes: int
) -> list[tuple[str, str, Any]]:
    """complete_many's items checked and their results encoded once, before any is sent."""
    if isinstance(items, str) or not isinstance(items, Sequence):
        raise BadArgument(f"items must be a list of (job_id, token, result), got {items!r:.80}")
    out: list[tuple[str, str, Any]] = []
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 3:
            raise BadArgument(f"a completion is (job_id, token, result), got {item!r:.80}")
        job_id, token, result = item
        check_lease(job_id, token)
        text = "null" if result is None else encode_json(result, "result", max_bytes)
        out.append((job_id, token, _EncodedResult(text)))
    return out


def claim_checked(worker_id: str, limit: int, lease_ms: int, reap: int, nonce: str | None) -> str:
    """The call's nonce (a fresh one unless given) once every argument is checked."""
    nonce = codec.new_nonce() if nonce is None else nonce
    codec.claim_args(worker_id, limit, lease_ms, nonce, reap)
    return nonce


def beat(p: Any, sub: list[tuple[str, str]], lease_ms: int, untils: list[int]) -> Op[list[str]]:
    """One partition's heartbeat as statuses in `sub`'s order; its lease end into `untils`."""
    until, st = yield from p.ops.heartbeat(sub, lease_ms=lease_ms)
    untils.append(until)
    return [st[job_id] for job_id, _ in sub]


def beats(
    leases: Sequence[tuple[str, str]], got: list[Any], untils: list[int]
) -> tuple[int, dict[str, str]]:
    """heartbeat's answer: (the earliest lease end, {job_id: status} of the leases reached)."""
    statuses = {job_id: st for (job_id, _), st in zip(leases, got, strict=True) if st is not None}
    return min(untils, default=-1), statuses


def progressed(p: Any, sub: list[tuple[str, str, Any]]) -> Op[list[str]]:
    got = yield from p.ops.progress(sub)
    return [got[job_id] for job_id, _, _ in sub]
