"""Pages of jobs for the listings that show no payload (`jobs list`, `dead list`, the
dashboard's queue and dead pages): each job's spec record read up to its payload
(InspectingOps.heads), where get_jobs read it whole: a page of 50 jobs of 512 KiB held 50 MB in
the client, 500 of them 500 MB. What they print with --json (the payload too) is read whole."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_merge import group_ids, jobs_in_order
from scheduler.client.partitioned_partial import chosen_page
from scheduler.client.queue import Queue
from scheduler.core.models import Job
from scheduler.operations.browsing import listed_scored
from scheduler.operations.inspecting import check_page
from scheduler.operations.ops import Ops

Listed = tuple[int, Job]  # (the partition that listed it: 0 for a plain queue, the job)


def heads_readable(client: redis.Redis) -> bool:
    """A head is read from the record's first bytes, which may end inside one of the payload's
    characters: a client that decodes replies strictly (decode_responses=True, the default
    'strict' errors: a client given to the dashboard) would fail the page on it, so it reads
    whole records. The CLI's and connect()'s clients decode with 'backslashreplace'."""
    try:
        enc = client.get_encoder()
        return not enc.decode_responses or enc.encoding_errors != "strict"
    except AttributeError:  # a client of another kind: as the strict one
        return False


def listing_ops(q: Queue, payload: bool = False) -> Ops:
    """q.ops, whose get_jobs / list_jobs read heads unless `payload` is wanted or the client
    cannot (heads_readable)."""
    return q.ops.heads() if not payload and heads_readable(q.client) else q.ops


def page(
    q: Queue | PartitionedQueue,
    state: str,
    offset: int,
    limit: int,
    left_out: dict[str, str],
    *,
    payload: bool = False,
) -> list[Listed]:
    """A `list_jobs` page, each job with its partition, read up to their payloads unless
    `payload`. A partitioned queue's merged from the partitions that answer, as
    partitioned.list_answering (`left_out`: partition name -> why it was not read, in and out:
    one named there is not asked)."""
    if isinstance(q, Queue):
        jobs = q._run(listing_ops(q, payload).list_jobs(state, offset=offset, limit=limit))
        return [(0, j) for j in jobs]
    check_page(state, offset, limit)
    asked = [p for p in q.parts if p.name not in left_out]
    each = q._answering(lambda p: listed_scored(p.ops, state, 0, offset + limit), asked)
    chosen = chosen_page(q, asked, each, (state, offset, limit), left_out)
    reads = [
        (q.parts[k], listing_ops(q.parts[k], payload).get_jobs(g))
        for k, g in group_ids(chosen).items()
    ]
    where = {i: k for k, i in chosen}
    return [(where[j.id], j) for j in jobs_in_order(chosen, q._run_many(reads))]


def whole(q: Queue | PartitionedQueue, listed: Sequence[Listed]) -> list[Job]:
    """The jobs of `listed` read again whole, payload included, in its order, each from the
    partition that listed it (a job gone meanwhile is left out)."""
    chosen = [(k, j.id) for k, j in listed]
    if isinstance(q, Queue):
        return q._run(q.ops.get_jobs([i for _, i in chosen]))
    reads = [(q.parts[k], q.parts[k].ops.get_jobs(g)) for k, g in group_ids(chosen).items()]
    return jobs_in_order(chosen, q._run_many(reads))
