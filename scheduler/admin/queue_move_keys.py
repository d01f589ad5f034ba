"""The idempotency keys `scheduler queue move` carries into the destination
(scheduler/admin/queue_move.py): a keyed enqueue re-sent there finds the moved job."""

from __future__ import annotations

from collections.abc import Callable

import redis

from scheduler.admin.queue_move_check import text as _t
from scheduler.client.queue import Queue
from scheduler.core import connection
from scheduler.core.partitions import Layout

CARRY_PER_RENEWAL = 100  # idempotency keys carried between two renewals of the run lock


def carry_keys(
    client: redis.Redis,
    part: Queue,
    dst: list[Queue],
    layout: Layout | None,
    moved_ids: set[str],
    renew: Callable[[], None],
) -> int:
    """Each idempotency key of `part` that names a moved job (`moved`) is written into each
    queue of `dst` (its text, its time left; NX: a key a queue took since is kept). A
    partitioned destination (`layout`) routes a key by its text, of which the source stores
    only the digest: so into every partition, where a re-sent keyed enqueue finds it whichever
    partition it routes to (the id it returns routes to the moved job). Returns how many keys
    were carried (into one partition at least). `renew` keeps the run lock: 3 round trips a key."""
    prefix, carried = part.keys.prefix + "idem:", 0
    node = connection.node_for_key(client, part.keys.prefix)
    for n, key in enumerate(map(_t, node.scan_iter(match=prefix + "*", count=1000))):
        if n % CARRY_PER_RENEWAL == CARRY_PER_RENEWAL - 1:
            renew()
        value, ttl_ms = client.get(key), int(client.pttl(key))
        if value is None or ttl_ms <= 0:
            continue
        if moved(client, part, dst, layout, moved_ids, _t(value).split(" ")[0]):
            digest = key[len(prefix) :]
            wrote = [client.set(q.keys.idem(digest), value, nx=True, px=ttl_ms) for q in dst]
            carried += any(wrote)
    return carried


def moved(
    client: redis.Redis,
    part: Queue,
    dst: list[Queue],
    layout: Layout | None,
    moved_ids: set[str],
    jid: str,
) -> bool:
    """`jid` moved from `part`: by this run (`moved_ids`), or by a stopped one that finished it
    before it carried its key (a rerun has no other trace of it): gone from `part`, and in the
    destination partition the id routes to."""
    if jid in moved_ids:
        return True
    there = dst[0 if layout is None else layout.partition_of_id(jid)].keys
    gone = not client.exists(part.keys.job(jid), part.keys.spec(jid))
    return gone and bool(client.exists(there.job(jid), there.spec(jid)))
