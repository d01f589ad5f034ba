"""The idempotency keys `scheduler queue move` carries into the destination
(scheduler/admin/queue_move.py): a keyed enqueue re-sent there finds the moved job."""

from __future__ import annotations

from collections.abc import Callable

import redis

from scheduler.admin.queue_move_check import text as _t
from scheduler.client.queue import Queue
from scheduler.core import connection

CARRY_PER_RENEWAL = 100  # idempotency keys carried between two renewals of the run lock


def carry_keys(
    client: redis.Redis,
    part: Queue,
    dst: list[Queue],
    moved_ids: set[str],
    renew: Callable[[], None],
) -> int:
    """Each idempotency key of `part` that names a job in `moved_ids` is written into each queue
    of `dst` (its text, its time left; NX: a key a queue took since is kept). A partitioned
    destination routes a key by its text, of which the source stores only the digest: so into
    every partition, where a re-sent keyed enqueue finds it whichever partition it routes to
    (the id it returns routes to the moved job). Returns how many keys were carried (into one
    partition at least). `renew` keeps the run lock: 3 round trips a key, far off or many.
    Only this run's jobs: a key's value names a job id and nothing else of it, so a job gone
    from the source and found in the destination may be another job under the same id (a
    caller's `job_id` used in both queues), whose id a re-sent keyed enqueue would get."""
    if not moved_ids:
        return 0
    prefix, carried = part.keys.prefix + "idem:", 0
    node = connection.node_for_key(client, part.keys.prefix)
    for n, key in enumerate(map(_t, node.scan_iter(match=prefix + "*", count=1000))):
        if n % CARRY_PER_RENEWAL == CARRY_PER_RENEWAL - 1:
            renew()
        value, ttl_ms = client.get(key), int(client.pttl(key))
        if value is not None and ttl_ms > 0 and _t(value).split(" ")[0] in moved_ids:
            digest = key[len(prefix) :]
            wrote = [client.set(q.keys.idem(digest), value, nx=True, px=ttl_ms) for q in dst]
            carried += any(wrote)
    return carried
