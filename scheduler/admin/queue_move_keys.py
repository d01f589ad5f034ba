"""The idempotency keys `scheduler queue move` carries into the destination
(scheduler/admin/queue_move.py): a keyed enqueue re-sent there finds the moved job."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import redis

from scheduler.admin.queue_move_check import text as _t
from scheduler.client.queue import Queue
from scheduler.core import connection

CARRY_PER_RENEWAL = 100  # idempotency keys carried between two renewals of the run lock


class BatchKeys:
    """The idempotency keys of each source partition by the job id each names, read once (a
    SCAN) at its first batch: a batch's keys are carried before its finish, so a run stopped
    after a finish has carried them (its rerun re-sends only what is still in `moving`, and
    carries their keys again: NX). Keys written after that read are carry_keys' (the end)."""

    def __init__(self, client: redis.Redis, dst: list[Queue], renew: Callable[[], None]) -> None:
        self.client, self.dst, self.renew = client, dst, renew
        self.by_part: dict[str, dict[str, list[str]]] = {}
        self.carried: dict[str, set[str]] = {}  # each partition's keys a batch carried

    def carry(self, part: Queue, ids: list[str]) -> int:
        """The keys naming `ids` (jobs the destination holds), into it; how many were written."""
        index = self.by_part.get(part.name)
        if index is None:
            index = self.by_part[part.name] = {}
            for key, jid in _named(self.client, part, self.renew, set()):
                index.setdefault(jid, []).append(key)
        found = [key for jid in ids for key in index.pop(jid, ())]
        wrote = {key for key in found if _carry(self.client, part, key, self.dst, set(ids))}
        self.carried.setdefault(part.name, set()).update(wrote)
        return len(wrote)

    def seen(self, part: Queue) -> set[str]:
        """The keys of `part` a batch carried: the end pass (carry_keys) skips them; the others
        are read again there (written since, or naming another job by then)."""
        return self.carried.get(part.name, set())


def _named(
    client: redis.Redis, part: Queue, renew: Callable[[], None], skip: set[str]
) -> Iterator[tuple[str, str]]:
    """(key, the job id its value names) for each idempotency key of `part` not in `skip`.
    `renew` keeps the run lock: a round trip a key, far off or many."""
    prefix = part.keys.prefix + "idem:"
    node = connection.node_for_key(client, part.keys.prefix)
    for n, key in enumerate(map(_t, node.scan_iter(match=prefix + "*", count=1000))):
        if n % CARRY_PER_RENEWAL == CARRY_PER_RENEWAL - 1:
            renew()
        if key in skip:
            continue
        value = client.get(key)
        if value is not None:
            yield key, _t(value).split(" ")[0]


def _carry(client: redis.Redis, part: Queue, key: str, dst: list[Queue], ids: set[str]) -> bool:
    """`key` of `part` into each queue of `dst` while it names one of `ids` (its text, its time
    left; NX: a key a queue took since is kept); True when written into one at least."""
    value, ttl_ms = client.get(key), int(client.pttl(key))
    if value is None or ttl_ms <= 0 or _t(value).split(" ")[0] not in ids:
        return False
    digest = key[len(part.keys.prefix + "idem:") :]
    return any([client.set(q.keys.idem(digest), value, nx=True, px=ttl_ms) for q in dst])


def carry_keys(
    client: redis.Redis,
    part: Queue,
    dst: list[Queue],
    moved_ids: set[str],
    renew: Callable[[], None],
    seen: set[str],
) -> int:
    """Each idempotency key of `part` that names a job in `moved_ids` is written into each queue
    of `dst` (_carry), at the end of the partition: those written since BatchKeys read them
    (`seen`: the keys that read saw, skipped: carried with their batch already). A
    partitioned destination routes a key by its text, of which the source stores only the
    digest: so into every partition, where a re-sent keyed enqueue finds it whichever partition
    it routes to (the id it returns routes to the moved job). Returns how many keys were
    written (into one partition at least; NX: none twice). Only this run's jobs: a key's value
    names a job id and nothing else of it, so a job gone from the source and found in the
    destination may be another job under the same id (a caller's `job_id` in both queues)."""
    if not moved_ids:
        return 0
    named = _named(client, part, renew, seen)
    return sum(_carry(client, part, key, dst, moved_ids) for key, jid in named if jid in moved_ids)
