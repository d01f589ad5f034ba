"""What the sync and asyncio partitioned clients share (client/partitioned.py,
partitioned_aio.py), sans-I/O but for the layout reads: reading the stored layout, expanding a
worker's queue list, and merging the partitions' counts, dead lists and job pages into one
queue's; placing the jobs of an enqueue_many and putting their ids back in call order; the
partial reads' rules (run_answering: a partition whose node does not answer is left out)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import redis

from scheduler.core.client_kind import check_client
from scheduler.core.connection import UNREACHABLE
from scheduler.core.errors import (
    BadArgument,
    NotDurable,
    SchedulerError,
    refused_for_now,
    slot_move_text,
)
from scheduler.core.models import Job, JobSpec, QueueCounts
from scheduler.core.partitions import Layout, meta_key

# A job of a partitioned enqueue_many: its partition, and its spec with its id filled in.
Placed = tuple[int, JobSpec]
# What opens a partitioned queue from a URL (a refused URL's hint).
_FROM_URL, _FROM_URL_ASYNC = "scheduler.open_queue(url, name)", "await open_queue_async(url, name)"


def read_layout(client: redis.Redis, queue: str, owner: str | None = None) -> Layout | None:
    """The stored layout of `queue`, or None for a queue that is not partitioned. `owner`: the
    public call reading it, which refuses a URL or an asyncio client first (as Queue does)."""
    if owner is not None:
        twin = "open_queue_async" if owner == "open_queue" else "AsyncPartitionedQueue"
        check_client(client, owner, is_async=False, twin=twin, from_url=_FROM_URL)
    raw = client.get(meta_key(queue))
    return None if raw is None else Layout.parse(queue, _text(raw))


async def read_layout_async(client: Any, queue: str, owner: str | None = None) -> Layout | None:
    """read_layout for a redis.asyncio client."""
    if owner is not None:
        check_client(client, owner, is_async=True, from_url=_FROM_URL_ASYNC)
    raw = await client.get(meta_key(queue))
    return None if raw is None else Layout.parse(queue, _text(raw))


def _text(raw: Any) -> str:
    """The record as text whatever the client's decode_responses (bytes by redis-py's default);
    bytes that are not UTF-8 read as escapes, which Layout.parse then refuses."""
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


def expand_queues(client: redis.Redis, queues: Sequence[str]) -> list[str]:
    """The worker's queue list with each partitioned queue replaced by its partitions."""
    out: list[str] = []
    for name in queues:
        layout = read_layout(client, name)
        out.extend(layout.names if layout else [name])
    return list(dict.fromkeys(out))


async def expand_queues_async(client: Any, queues: Sequence[str]) -> tuple[str, ...]:
    """expand_queues for a redis.asyncio client."""
    return (await expand_labelled_async(client, queues))[0]


async def expand_labelled_async(
    client: Any, queues: Sequence[str]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The worker's start: its queue list expanded (expand_queues), and each partition's
    logical queue name (its metrics label)."""
    out: list[str] = []
    logical: dict[str, str] = {}
    for name in queues:
        layout = await read_layout_async(client, name)
        out.extend(layout.names if layout else [name])
        logical.update(dict.fromkeys(layout.names if layout else [], name))
    return tuple(dict.fromkeys(out)), logical


def merge_counts(each: Sequence[QueueCounts]) -> QueueCounts:
    """The partitions' counts as one queue's: sums, the latest clock, the oldest due time;
    paused since the earliest pause when any partition is (a pause cut short part-way shows,
    and pausing again completes it)."""
    oldest = [c.oldest_due_ms for c in each if c.oldest_due_ms is not None]
    paused = [c.paused_ms for c in each if c.paused_ms is not None]
    return QueueCounts(
        now_ms=max(c.now_ms for c in each),
        due=sum(c.due for c in each),
        scheduled=sum(c.scheduled for c in each),
        leased=sum(c.leased for c in each),
        dead=sum(c.dead for c in each),
        oldest_due_ms=min(oldest) if oldest else None,
        lapsed=sum(c.lapsed for c in each),
        held_key_limit=sum(c.held_key_limit for c in each),
        held_rate_window=sum(c.held_rate_window for c in each),
        held_waiting=sum(c.held_waiting for c in each),
        paused_ms=min(paused) if paused else None,
        moving=sum(c.moving for c in each),
    )


def pause_word(each: Sequence[str]) -> str:
    """The partitions' queue_pause replies as one queue's."""
    return "paused" if "paused" in each else "already"


def resume_word(each: Sequence[str]) -> str:
    """The partitions' queue_resume replies as one queue's."""
    return "resumed" if "resumed" in each else "active"


def changed_if_lost(word: Any) -> Any:
    """A partition's pause / resume reply asked again after its first reply was lost (that
    attempt may have run): 'already' / 'active' may be that attempt's own change, so it counts
    as made ('paused' / 'resumed'): the queue is so either way, and the other word would tell
    the caller this call changed nothing when it may have (docs/cluster.md)."""
    return {"already": "paused", "active": "resumed"}.get(word, word)


def merge_dead(per: Sequence[Sequence[tuple[float, str]]]) -> list[str]:
    """Each partition's (dead_ms, id) pairs (newest first, `Ops.dead_scored`) -> one list of
    ids, newest first by the time each job died (ties: the larger id first, as one ZSET)."""
    return [i for _, i in heapq.merge(*per, reverse=True)]


def merge_scored(
    state: str, per: Sequence[Sequence[tuple[float, str]]], offset: int, limit: int
) -> list[tuple[int, str]]:
    """(partition, id) of the [offset, offset + limit) slice of the partitions' first
    offset + limit (score, id) pairs (browsing.listed_scored), merged by the index score each
    partition pages by, ties by id, as one ZSET orders them (dead, finished: highest first)."""
    tagged = [(score, i, k) for k, page in enumerate(per) for score, i in page]
    tagged.sort(key=lambda t: (t[0], t[1]), reverse=state in ("dead", "finished"))
    return [(k, i) for _, i, k in tagged[offset : offset + limit]]


def group_ids(chosen: Sequence[tuple[int, str]]) -> dict[int, list[str]]:
    """The ids of `chosen` by partition, for one get_jobs per partition."""
    by_part: dict[int, list[str]] = {}
    for k, i in chosen:
        by_part.setdefault(k, []).append(i)
    return by_part


def jobs_in_order(chosen: Sequence[tuple[int, str]], read: Sequence[Sequence[Job]]) -> list[Job]:
    """The jobs read for `chosen`, in its order (a job gone between the two reads left out)."""
    found = {j.id: j for jobs in read for j in jobs}
    return [found[i] for _, i in chosen if i in found]


def place(layout: Layout, specs: Iterable[JobSpec], spread: Iterator[int]) -> list[Placed]:
    """Each job's partition and id (Layout.route: by key, id or parents, else round robin)."""
    if isinstance(specs, str | bytes | dict) or not isinstance(specs, Iterable):  # as Queue's
        raise BadArgument(f"specs must be an iterable of JobSpec, got {specs!r:.80}")
    placed = []
    for spec in specs:
        if not isinstance(spec, JobSpec):
            raise BadArgument(f"expected JobSpec, got {spec!r}")
        k, job_id = layout.route(spec.key, spec.job_id, next(spread), spec.after)
        placed.append((k, replace(spec, job_id=job_id)))
    return placed


def by_partition(placed: Sequence[Placed]) -> dict[int, list[JobSpec]]:
    out: dict[int, list[JobSpec]] = {}
    for k, spec in placed:
        out.setdefault(k, []).append(spec)
    return out


def ids_in_call_order(placed: Sequence[Placed], got: dict[int, Any]) -> list[str]:
    """The ids of a partitioned enqueue_many in the order of its specs, from each partition's
    outcome (its ids, or the error it raised). A refused partition's error is raised (its
    batch wrote nothing; the others are written, as the batches of one plain call: README
    'Partitioned queues'), with `written_ids`: the ids written, in call order, and
    `unknown_ids`: those sent to a node that did not answer (a connection lost midway: written
    or not, unknown; re-sent with the same ids, one written is found, not written twice). NotDurable
    from some partitions is raised once, with every id of the call (the ids to re-send with)
    and the fewest acknowledgements."""
    short = [e for e in got.values() if isinstance(e, NotDurable)]
    each = {k: (e.job_ids if isinstance(e, NotDurable) else e) for k, e in got.items()}
    refusing = {k for k, e in each.items() if isinstance(e, BaseException)}
    pos = dict.fromkeys(each, 0)
    out = []
    for k, _ in placed:  # a refused partition's other batches are written: its partial_ids
        ids = getattr(each[k], "partial_ids", ()) if k in refusing else each[k]
        out.append(ids[pos[k]] if pos[k] < len(ids) else "")
        pos[k] += 1
    refused = [e for e in each.values() if isinstance(e, BaseException)]
    if refused:
        # The caller needs the ids written elsewhere: re-sending the whole call would enqueue
        # those jobs a second time under new ids.
        written = [i for i in out if i]
        unknown = [s.job_id or "" for k, s in placed if isinstance(each[k], UNREACHABLE)]
        err = refused[0]  # its own partition's count of written jobs: the whole call's here
        err.__notes__ = [n for n in getattr(err, "__notes__", []) if "written_ids" not in n]
        if written:
            err.add_note(
                f"{len(written)} job(s) of this call were written: the error's written_ids"
            )
        if unknown:
            err.add_note(
                f"{len(unknown)} job(s) went to partitions whose node did not answer: written or "
                "not, unknown (their ids: the error's unknown_ids); re-send them with those ids "
                "(job_id=): one already written is found, not written twice"
            )
        setattr(err, "written_ids", written)  # noqa: B010 - an attribute of any exception
        setattr(err, "unknown_ids", unknown)  # noqa: B010
        raise err
    if short:
        raise NotDurable(out, min(e.acked for e in short), short[0].wanted)
    return out


class PartitionsNotReached(redis.ConnectionError, SchedulerError):
    """A call over every partition reached only some: the nodes of `missing` did not answer, or
    refused for now (a slot being moved); `done` are the others. A change (pause, resume,
    set_dead_retention, set_priority_aging): those took it, `partial` is None; it is idempotent, so
    calling it again once they answer finishes it. A read (counts, list_jobs, dead_ids, dead_scored,
    list_schedules): `partial` is what it returns, of `done` only. A ConnectionError: what retries
    an unreachable Redis retries this (the CLI: exit 3; the dashboard: 503)."""

    def __init__(
        self, what: str, done: list[str], missing: list[str], errors: list[str], partial: Any = None
    ):
        self.done, self.missing, self.partial = done, missing, partial
        verb, then = ("reached", "") if partial is None else ("read", "its .partial is theirs; ")
        super().__init__(
            f"{what} {verb} {len(done)} of {len(done) + len(missing)} partitions; not "
            f"{', '.join(missing)} ({'; '.join(errors)}): {then}call it again once they answer"
        )


def not_answering(exc: BaseException) -> bool:
    """A partition's error that leaves it out of a reading while others answer: its node does
    not answer, or refuses for now (its slot being moved, maxmemory, ...)."""
    return isinstance(exc, UNREACHABLE) or (
        isinstance(exc, redis.ResponseError) and refused_for_now(exc)
    )


def answered(out: list[Any]) -> list[Any]:
    """run_answering's results as they are, unless an error is not not_answering or none
    answered: then the first such error is raised."""
    errors = [r for r in out if isinstance(r, BaseException)]
    for r in errors:
        if not not_answering(r) or len(errors) == len(out):
            raise r
    return out


def unread(parts: Sequence[Any], results: Sequence[Any]) -> list[str]:
    """'partition <name>: <error>' of each of run_answering's partitions that did not answer
    (a slot on the move in the CLI's words: 'its hash slot is being migrated ...')."""
    return [
        f"partition {p.name}: {slot_move_text(r) or r}"
        for p, r in zip(parts, results, strict=True)
        if isinstance(r, BaseException)
    ]


def reached_every(what: str, parts: Sequence[Any], each: list[Any]) -> list[Any]:
    """run_answering's results of a change of every partition (`what`: pause, resume, a setter),
    or PartitionsNotReached naming the partitions that did not answer."""
    pairs = list(zip((p.name for p in parts), each, strict=True))
    failed = [(n, slot_move_text(r) or str(r)) for n, r in pairs if isinstance(r, BaseException)]
    if failed:
        done = [n for n, r in pairs if not isinstance(r, BaseException)]
        errors = list(dict.fromkeys(e for _, e in failed))
        raise PartitionsNotReached(what, done, [n for n, _ in failed], errors)
    return each


def held_whole(
    before: Sequence[str], out: Sequence[Any], whole: set[int], again: Sequence[int]
) -> dict[str, list[int]]:
    """The partitions of each node (by name) whose call failed whole, not on a timeout, and
    none of which is asked again (no slot of theirs moved): their node down, or an ASK it
    answered for a slot being migrated sent to a node that is (docs/cluster.md)."""
    groups: dict[str, list[int]] = {}
    for i in sorted(whole.difference(again)):
        if not isinstance(out[i], redis.TimeoutError | TimeoutError):  # a hung node: no probe
            groups.setdefault(before[i], []).append(i)
    return groups


def not_migrating(slots: Sequence[int], idx: Sequence[int], reply: Any) -> list[int]:
    """Of `idx` (their hash `slots`), those whose slot the node that answered CLUSTER NODES
    (`reply`: redis-py's parse, by node) is not migrating away; a reply not parsed: none."""
    if not isinstance(reply, dict):
        return []
    mine = [n for n in reply.values() if "myself" in str(n.get("flags"))]
    away = {int(m["slot"]) for n in mine for m in n["migrations"] if m["state"] == "migrating"}
    return [i for i in idx if slots[i] not in away]
