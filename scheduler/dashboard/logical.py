"""A queue as the dashboard shows it: a plain queue, or a partitioned logical queue
(scheduler/client/partitioned.py) shown as ONE queue whose counts, jobs and dead letters are
its partitions' merged. A merged page reads the first `offset + limit` entries of each
partition (so its cost is O(N * (offset + limit)), capped by MAX_MERGED_WINDOW) and sorts them
the way one queue's index would; deeper pages are read one partition at a time."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import ResponseError

from scheduler.client.job_listing import listing_ops
from scheduler.client.partitioned import PartitionedQueue, read_layout, unread
from scheduler.client.partitioned_merge import (
    group_ids,
    jobs_in_order,
    merge_counts,
    merge_scored,
    not_answering,
)
from scheduler.client.partitioned_merge import unread as partition_errors
from scheduler.client.queue import Queue
from scheduler.core.errors import (
    BadArgument,
    JobNotFound,
    NewerStorage,
    UnreadableRecord,
    edited_by_hand,
    refused_for_now,
    slot_move_text,
)
from scheduler.core.models import Job, QueueCounts
from scheduler.core.partitions import Layout
from scheduler.operations import browsing
from scheduler.operations.requests import Op

MAX_MERGED_WINDOW = 2_000  # offset + limit of a merged page (each partition reads that many)
# The partition names core/partitions.py makes: <logical>.p<k> or <logical>.p<k>.<j>.
PARTITION_NAME = re.compile(r"^(.+)\.p\d{1,4}(?:\.\d{1,6})?$")


def unread_why(exc: Exception) -> str | None:
    """Why the overview could not read a queue: its slot on the move (the CLI's words), its node
    not answering or refusing for now, or stored by a newer version (its own words: the other
    queues are still shown); None for another ResponseError not refused for now (raised)."""
    if isinstance(exc, NewerStorage):
        return str(exc)
    if isinstance(exc, ResponseError) and not refused_for_now(exc):
        return None
    what = "refused for now" if isinstance(exc, ResponseError) else "did not answer"
    return slot_move_text(exc) or f"Redis {what} ({exc})"


def stored_layout(client: redis.Redis, name: str) -> Layout | None:
    """read_layout of queue `name`; a record edited by hand (unreadable, or of another type)
    is UnreadableRecord (a 400 on its own pages, one named row on the pages over queues)."""
    try:
        return read_layout(client, name)
    except UnreadableRecord as exc:
        raise UnreadableRecord(f"{exc}: edited by hand? see `scheduler doctor`") from None
    except ResponseError as exc:
        if not edited_by_hand(exc):
            raise
        raise UnreadableRecord(
            f"the partition record of queue {name!r} is of another type (edited by hand): see "
            "`scheduler doctor`"
        ) from None


def merge_found(
    state: str, found: Sequence[browsing.FilteredPage], offset: int, limit: int
) -> list[Job]:
    """The [offset, offset + limit) slice of the partitions' filtered pages, merged as their
    unfiltered page is (merged_page): by each job's index score, ties by id, as one ZSET."""
    per = [list(zip(f.scores, (j.id for j in f.jobs), strict=True)) for f in found]
    return jobs_in_order(merge_scored(state, per, offset, limit), [f.jobs for f in found])


def merged_window(offset: int, limit: int) -> int:
    """How many entries each partition reads for a merged page (BadArgument past the cap)."""
    if offset + limit > MAX_MERGED_WINDOW:
        raise BadArgument(
            f"a partitioned queue's merged pages reach {MAX_MERGED_WINDOW} entries: page "
            "further in one partition (its link on this page)"
        )
    return offset + limit


def once_per_partition(unread: list[str]) -> list[str]:
    """'partition <name>: <error>' entries (read_each's), the first of each partition only."""
    seen: dict[str, str] = {}
    for u in unread:
        seen.setdefault(u.split(": ", 1)[0], u)
    return list(seen.values())


class View:
    """One row of the overview: `parts` are the ordinary queues holding its jobs (one for a
    plain queue). `run_each` drives one operation per part (one driver call for all)."""

    def __init__(
        self,
        name: str,
        parts: list[Queue],
        drive: Callable[[Queue, Op[Any]], Any],
        pq: PartitionedQueue | None = None,
    ) -> None:
        self.name = name
        self.parts = parts
        self.pq = pq
        self._drive = drive

    @property
    def partitioned(self) -> bool:
        return self.pq is not None

    @property
    def part_names(self) -> list[str]:
        return [p.name for p in self.parts]

    def part_of(self, job_id: str) -> Queue:
        """The queue holding `job_id` (a partitioned queue's id names its partition)."""
        return self.parts[0] if self.pq is None else self.pq.part_of(job_id)

    def drive(self, q: Queue, op: Op[Any]) -> Any:
        """One operation on one of `parts`."""
        return self._drive(q, op)

    def holder(self, job_id: str) -> Queue:
        """The partition holding `job_id`: the one its id names, else (a job written into a
        partition directly, with an id of its own) the first that has it; at most N reads."""
        first = self.part_of(job_id)
        if self.pq is None:
            return first
        for q in [first, *(p for p in self.parts if p is not first)]:
            try:
                q.status(job_id)
            except JobNotFound:
                continue
            return q
        return first

    def merged_page(
        self,
        state: str,
        now_ms: int,
        offset: int,
        limit: int,
        max_dead_ms: int | None = None,
        *,
        unread: list[str],
    ) -> tuple[list[Job], bool]:
        """(one page of the partitions merged in index order, whether more follow): each
        partition's first offset + limit (score, id) pairs, then the page's records only.
        For a partitioned view (a plain queue pages its own index). The partitions that do
        not answer are left out and named into `unread` (read_each)."""
        window = merged_window(offset, limit)
        per: list[list[tuple[float, str]]] = self.read_each(
            lambda q: browsing.scored_ids(q.ops, state, now_ms, 0, window, max_dead_ms),
            [],
            unread,
        )
        chosen = merge_scored(state, per, offset, limit)  # ties by id, as one ZSET
        read: list[list[Job]] = []
        if chosen and self.pq is not None:
            # A partition that gave its ids may refuse its records (one-key reads follow a
            # moving slot's ASK, a script's many keys get TRYAGAIN): named, the others shown.
            groups = {self.parts[k].name: g for k, g in group_ids(chosen).items()}
            asked = [p for p in self.parts if p.name in groups]
            try:
                got = self.pq._answering(lambda p: listing_ops(p).get_jobs(groups[p.name]), asked)
            except Exception as exc:  # none of them answered
                if not not_answering(exc):
                    raise
                got = [exc] * len(asked)
            unread += partition_errors(asked, got)
            read = [r for r in got if not isinstance(r, BaseException)]
        more = sum(map(len, per)) > offset + limit or any(len(p) == window for p in per)
        return jobs_in_order(chosen, read), more

    def counts(self) -> QueueCounts:
        return self.parts[0].counts() if self.pq is None else self.pq.counts()

    def counts_and_paused(self) -> tuple[QueueCounts, list[str], list[str]]:
        """(counts(), the partitions that are paused: [] for a plain queue, the partitions that
        could not be read), from the same one driver call: merged, a partitioned queue is
        paused when ANY partition is. A partition whose node does not answer or refuses for now
        (its slot being moved) is left out of the counts and named, while another answers."""
        each = self.run_each(lambda q: q.ops.counts(), partial=True)
        if self.pq is None:
            return each[0], [], []
        pairs = list(zip(self.parts, each, strict=True))
        read = [(p, c) for p, c in pairs if not isinstance(c, BaseException)]
        failed = unread(self.parts, each)
        return merge_counts([c for _, c in read]), [p.name for p, c in read if c.paused], failed

    def run_each(self, make: Callable[[Queue], Op[Any]], *, partial: bool = False) -> list[Any]:
        """One result per part. `partial`: a part that does not answer, or refuses for now,
        gives its error in its place while another part answered (else the first error;
        PartitionedQueue.run_answering: a cluster node down fails its own partitions only)."""
        if self.pq is None:
            return [self._drive(self.parts[0], make(self.parts[0]))]
        if partial:
            return self.pq.run_answering(make)
        return self.pq._run_many([(p, make(p)) for p in self.parts])

    def read_each(self, make: Callable[[Queue], Op[Any]], empty: Any, into: list[str]) -> list[Any]:
        """run_each(partial=True) with `empty` in place of each part that did not answer, those
        named into `into` ('partition <name>: <error>'), so a page shows the others."""
        out = self.run_each(make, partial=True)
        into += unread(self.parts, out)
        return [empty if isinstance(r, BaseException) else r for r in out]

    def filtered_pages(
        self, unread: list[str], state: str, **args: Any
    ) -> list[browsing.FilteredPage]:
        """browsing.filtered_page(listing_ops(q), state, **args) of each part that answers
        (read_each: the others named into `unread`, an empty page in their place)."""
        return self.read_each(
            lambda q: browsing.filtered_page(listing_ops(q), state, **args),
            browsing.FilteredPage([], None, 0),
            unread,
        )

    def filtered(
        self, unread: list[str], state: str, offset: int, limit: int, **filters: Any
    ) -> tuple[list[Job], int, int | None, list[str]]:
        """A filtered page: (jobs, ids looked through, the next page's offset or None, the
        partitions whose scan stopped at browsing.MAX_SCAN short of the page: "more" cannot
        search further in them, their own page can). A plain queue's offset is its scan
        position; a partitioned queue's page is merged from each partition's first offset +
        limit matches, with "more" while they pass this page together."""
        if not self.partitioned:
            (f,) = self.filtered_pages(unread, state, offset=offset, limit=limit, **filters)
            return f.jobs, f.scanned, f.next_offset, []
        count = merged_window(offset, limit)
        found = self.filtered_pages(unread, state, offset=0, limit=count, **filters)
        full = [f.next_offset is not None and len(f.jobs) == count for f in found]
        more = any(full) or sum(len(f.jobs) for f in found) > offset + limit
        cut = [q.name for q, f, k in zip(self.parts, found, full, strict=True)
               if f.next_offset is not None and not k]  # fmt: skip
        jobs, scanned = merge_found(state, found, offset, limit), sum(f.scanned for f in found)
        return jobs, scanned, offset + limit if more else None, cut

    def requeue_dead(self, ids: Sequence[str]) -> int:
        return self.parts[0].requeue_dead(ids) if self.pq is None else self.pq.requeue_dead(ids)

    def purge_dead(self, ids: Sequence[str]) -> int:
        return self.parts[0].purge_dead(ids) if self.pq is None else self.pq.purge_dead(ids)

    def pause(self) -> str:
        """Queue.pause ('paused' | 'already'); a partitioned queue: every partition."""
        return self.parts[0].pause() if self.pq is None else self.pq.pause()

    def resume(self) -> str:
        """Queue.resume ('resumed' | 'active'); a partitioned queue: every partition."""
        return self.parts[0].resume() if self.pq is None else self.pq.resume()

    def dead_ids(self, **filters: Any) -> list[str]:
        if self.pq is None:
            return self.parts[0].dead_ids(**filters)
        return self.pq.dead_ids(**filters)
