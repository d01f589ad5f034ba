"""The idempotency keys `scheduler queue move` carries into the destination
(scheduler/admin/queue_move.py): a keyed enqueue re-sent there finds the moved job. What the run
remembers of them is on disk (queue_move_ledger.py); each SCAN page of keys is read in one
pipeline, and a batch's keys written in another (a round trip a key made a keyed move 9x slower
than a plain one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import redis

from scheduler.admin.queue_move_check import DELIVERED
from scheduler.admin.queue_move_check import text as _t
from scheduler.admin.queue_move_ledger import CHUNK, MoveLedger
from scheduler.client.queue import Queue
from scheduler.core import connection
from scheduler.core.partitions import Layout

SCAN_COUNT = 1000  # keys asked of each SCAN call; the run lock is renewed once a page
LISTED = 100  # key conflicts a report names by id (all are counted): a bounded report


@dataclass
class KeyConflicts:
    """Jobs of the source whose idempotency key the destination holds for another job: each
    (the source's job id, the destination's job id, where the source's job is). 'source': seen
    before its put, it stayed there (the move's `conflict` stays); 'destination': written
    before the clash was seen (its key's copy refused: an enqueue into the destination during
    its batch, or the put of a stopped run), both wait there. Either way a person picks one."""

    count: int = 0
    listed: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, jid: str, other: str, where: str) -> None:
        self.count += 1
        if len(self.listed) < LISTED:
            self.listed.append((jid, other, where))

    def as_dict(self) -> dict[str, object]:
        jobs = [{"id": j, "other": o, "in": w} for j, o, w in self.listed]
        return {"count": self.count, "jobs": jobs}


class BatchKeys:
    """The idempotency keys of each source partition by the job id each names, read once (a
    SCAN) at its first batch: a batch's keys are carried before its finish, so a run stopped
    after a finish has carried them (its rerun re-sends only what is still in `moving`, and
    carries their keys again: NX). Keys written after that read are carry_keys' (the end)."""

    def __init__(
        self,
        client: redis.Redis,
        dst: list[Queue],
        renew: Callable[[], None],
        ledger: MoveLedger,
        source: str,
        conflicts: KeyConflicts,
    ) -> None:
        self.client, self.dst, self.renew, self.ledger = client, dst, renew, ledger
        self.source, self.conflicts = source, conflicts

    def _index(self, part: Queue) -> None:
        if not self.ledger.indexed(part.name):
            pages = _named(self.client, part, self.renew)
            self.ledger.index(part.name, (pair for page in pages for pair in page))

    def carry(self, part: Queue, ids: list[str]) -> int:
        """The keys naming `ids` (jobs the destination holds), into it; how many were written.
        A key the destination holds for another job is a conflict found late (KeyConflicts)."""
        self._index(part)
        found = self.ledger.pop_named(part.name, ids)
        batch = set(ids)
        wrote, clashed = _carry(self.client, part, found, self.dst, lambda jids: jids & batch)
        for _, jid, other in clashed:
            self.conflicts.add(jid, other, "destination")
        self.ledger.add_carried(part.name, [*wrote, *(key for key, _, _ in clashed)])  # once
        return len(wrote)

    def clashes(self, part: Queue, ids: list[str], *, resumed: bool) -> dict[str, str]:
        """Of `ids` (taken, not put yet), each whose key a destination partition holds for
        another job, with that job's id: put, both would run (a keyed enqueue re-sent to the
        destination once producers switched to it, docs/cluster.md). Read before the put, so
        the job stays in the source (a fresh one is counted here, a re-sent one (`resumed`) by
        the page of due it is met on again). Not a re-sent one the destination holds, or held
        (`move_in:<source>`: it ran there since): back in the source's due it would run twice;
        its key's refusal at the carry names it."""
        self._index(part)
        pairs = self.ledger.named_of(part.name, ids)  # (job id, its key), left in the index
        start, n = len(part.keys.prefix + "idem:"), len(self.dst)
        pipe = self.client.pipeline(transaction=False)
        for _, key in pairs:
            for q in self.dst:
                pipe.get(q.keys.idem(key[start:]))
        got = [None if v is None else _t(v).split(" ")[0] for v in pipe.execute()] if pairs else []
        out = {
            jid: other
            for i, (jid, _) in enumerate(pairs)
            for other in got[i * n : (i + 1) * n]
            if other is not None and other != jid
        }
        if resumed and out:
            pipe = self.client.pipeline(transaction=False)
            for jid in out:
                for q in self.dst:
                    pipe.exists(q.keys.job(jid), q.keys.spec(jid))
                    pipe.sismember(q.keys.prefix + DELIVERED + self.source, jid)
            held = pipe.execute()
            m = 2 * n
            out = {
                j: o for k, (j, o) in enumerate(out.items()) if not any(held[k * m : (k + 1) * m])
            }
        for jid, other in out.items() if not resumed else ():
            self.conflicts.add(jid, other, "source")
        return out


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
) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Each of `keys` of `part` into each queue of `dst` while it names a job id `allowed`
    keeps (its text, its time left; NX: a key a queue took since is kept). Returns the keys
    written into one queue at least, and (job id, the other job's id) for each key a queue
    refused because it names another job there: (key, job id, the other job's id)."""
    wrote: list[str] = []
    clashed: list[tuple[str, str, str]] = []
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
        refused = [(s, q) for j, s in enumerate(sends) for k, q in enumerate(dst)
                   if not answers[j * n + k]]  # fmt: skip
        if refused:  # rare: read what the refusing queue's key names
            pipe = client.pipeline(transaction=False)
            for (key, *_), q in refused:
                pipe.get(q.keys.idem(key[start:]))
            for ((key, _, _, jid), _), v in zip(refused, pipe.execute(), strict=True):
                other = None if v is None else _t(v).split(" ")[0]
                if other is not None and other != jid:
                    clashed.append((key, jid, other))
    return wrote, list(dict.fromkeys(clashed))  # a partitioned destination: once a job


def carry_keys(
    client: redis.Redis,
    part: Queue,
    dst: list[Queue],
    layout: Layout | None,
    ledger: MoveLedger,
    renew: Callable[[], None],
    conflicts: KeyConflicts,
) -> int:
    """At the end of the partition, each idempotency key of `part` its batches did not carry
    is written into each queue of `dst` (_carry) when it names a job this run moved (the
    ledger's; written since BatchKeys read them), or a job it did not move (finished,
    running, dead, left in the source) whose id the destination partition it routes to holds
    no record of: within its window a keyed enqueue re-sent to the destination finds that
    job's id instead of running the work again. A job gone from the source and found in the
    destination may be another job under the same id (a caller's `job_id` used in both
    queues): its key is not carried. A partitioned destination routes a key by its text, of
    which the source stores only the digest: so into every partition, where a re-sent keyed
    enqueue finds it whichever partition it routes to. Returns how many keys were written
    (into one partition at least; NX: none twice); a moved job whose key the destination holds
    for another job is added to `conflicts`."""

    def allowed(jids: set[str]) -> set[str]:
        moved = ledger.moved_of_set(jids)
        others = sorted(jids - moved)
        pipe = client.pipeline(transaction=False)
        for jid in others:
            there = dst[0 if layout is None else layout.partition_of_id(jid)].keys
            pipe.exists(there.job(jid), there.spec(jid))
        held = pipe.execute() if others else []
        return moved | {jid for jid, n in zip(others, held, strict=True) if not n}

    wrote = 0
    for page in _named(client, part, renew):
        carried = ledger.carried_of(part.name, [key for key, _ in page])
        keys = [key for key, _ in page if key not in carried]
        written, refused = _carry(client, part, keys, dst, allowed)
        wrote += len(written)
        moved = ledger.moved_of([jid for _, jid, _ in refused])
        for _, jid, other in refused:
            if jid in moved:  # one it did not move is no copy of it: NX keeps theirs
                conflicts.add(jid, other, "destination")
    return wrote
