"""The idempotency keys `scheduler queue move` carries into the destination
(scheduler/admin/queue_move.py): a keyed enqueue re-sent there finds the moved job. What the run
remembers of them is on disk (queue_move_ledger.py); each SCAN page of keys is read in one
pipeline, and a batch's keys written in another (a round trip a key made a keyed move 9x slower
than a plain one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import redis

from scheduler.admin.queue_move_check import text as _t
from scheduler.admin.queue_move_ledger import CHUNK, MoveLedger
from scheduler.client.queue import Queue
from scheduler.core import connection

SCAN_COUNT = 1000  # keys asked of each SCAN call; the run lock is renewed once a page


class BatchKeys:
    """The idempotency keys of each source partition by the job id each names, read once (a
    SCAN) at its first batch: a batch's keys are carried before its finish, so a run stopped
    after a finish has carried them (its rerun re-sends only what is still in `moving`, and
    carries their keys again: NX). Keys written after that read are carry_keys' (the end)."""

    def __init__(
        self, client: redis.Redis, dst: list[Queue], renew: Callable[[], None], ledger: MoveLedger
    ) -> None:
        self.client, self.dst, self.renew, self.ledger = client, dst, renew, ledger

    def carry(self, part: Queue, ids: list[str]) -> int:
        """The keys naming `ids` (jobs the destination holds), into it; how many were written."""
        if not self.ledger.indexed(part.name):
            pages = _named(self.client, part, self.renew)
            self.ledger.index(part.name, (pair for page in pages for pair in page))
        found = self.ledger.pop_named(part.name, ids)
        batch = set(ids)
        wrote = _carry(self.client, part, found, self.dst, lambda jids: jids & batch)
        self.ledger.add_carried(part.name, wrote)
        return len(wrote)


def _named(
    client: redis.Redis, part: Queue, renew: Callable[[], None]
) -> Iterator[list[tuple[str, str]]]:
    """(key, the job id its value names) for each idempotency key of `part`, a SCAN page at a
    time, their values read in one pipeline. `renew` keeps the run lock, once a page."""
    prefix = part.keys.prefix + "idem:"
    node = connection.node_for_key(client, part.keys.prefix)
    cursor: int | None = None
    while cursor != 0:
        renew()
        cursor, found = node.scan(cursor or 0, match=prefix + "*", count=SCAN_COUNT)
        keys = [_t(k) for k in found]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        values = pipe.execute() if keys else []
        yield [(k, _t(v).split(" ")[0]) for k, v in zip(keys, values, strict=True) if v is not None]


def _carry(
    client: redis.Redis,
    part: Queue,
    keys: list[str],
    dst: list[Queue],
    allowed: Callable[[set[str]], set[str]],
) -> list[str]:
    """Each of `keys` of `part` into each queue of `dst` while it names a job id `allowed`
    keeps (its text, its time left; NX: a key a queue took since is kept); the keys written into
    one queue at least."""
    wrote: list[str] = []
    for i in range(0, len(keys), CHUNK):
        chunk = keys[i : i + CHUNK]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.get(key)
            pipe.pttl(key)
        read = pipe.execute()
        live: list[tuple[str, bytes, int, str]] = []  # key, value, ttl_ms, the job id named
        for key, value, ttl_ms in zip(chunk, read[::2], read[1::2], strict=True):
            if value is not None and int(ttl_ms) > 0:
                live.append((key, value, int(ttl_ms), _t(value).split(" ")[0]))
        keep = allowed({jid for *_, jid in live})
        sends = [s for s in live if s[3] in keep]
        pipe = client.pipeline(transaction=False)
        start = len(part.keys.prefix + "idem:")
        for key, value, ttl_ms, _ in sends:
            for q in dst:
                pipe.set(q.keys.idem(key[start:]), value, nx=True, px=ttl_ms)
        answers = pipe.execute() if sends else []
        n = len(dst)
        wrote += [s[0] for j, s in enumerate(sends) if any(answers[j * n : (j + 1) * n])]
    return wrote


def carry_keys(
    client: redis.Redis,
    part: Queue,
    dst: list[Queue],
    ledger: MoveLedger,
    renew: Callable[[], None],
) -> int:
    """Each idempotency key of `part` that names a job this run moved (the ledger's) is written
    into each queue of `dst` (_carry), at the end of the partition: those written since BatchKeys
    read them (the keys a batch carried are skipped). A partitioned destination routes a key by
    its text, of which the source stores only the digest: so into every partition, where a
    re-sent keyed enqueue finds it whichever partition it routes to (the id it returns routes to
    the moved job). Returns how many keys were written (into one partition at least; NX: none
    twice). Only this run's jobs: a key's value names a job id and nothing else of it, so a job
    gone from the source and found in the destination may be another job under the same id (a
    caller's `job_id` in both queues)."""
    if not ledger.any_moved():
        return 0
    wrote = 0
    for page in _named(client, part, renew):
        carried = ledger.carried_of(part.name, [key for key, _ in page])
        moved = ledger.moved_of([jid for key, jid in page if key not in carried])
        keys = [key for key, jid in page if key not in carried and jid in moved]
        wrote += len(_carry(client, part, keys, dst, ledger.moved_of_set))
    return wrote
