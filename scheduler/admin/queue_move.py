"""Moving waiting jobs from one queue to another, plain or partitioned on either side
(`scheduler queue move`; docs/cluster.md, "Outgrowing one Redis").

Three Lua steps per batch, each atomic: move_out.lua takes waiting jobs out of a source
partition's `due` into its `moving` set (no worker claims them there) and returns their records;
move_in.lua writes them into the destination partition their id routes to, same id, same
run_at, same record (attempts, errors, spec), idempotent by id; move_done.lua deletes them from
the source. A crash between steps leaves them in `moving`, which the next run re-sends first:
a rerun always finishes, and no job is written twice nor lost. One destination at a time:
move_out.lua records it and refuses another run's (queue_move_check.py, MOVE_QUIET_MS). One run
of a source at a time: its run lock (queue_move_lock.py), checked by each take."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import redis

from scheduler.admin import queue_move_check as mc
from scheduler.admin.queue_move_check import MoveRefused, check_names, record_incoming
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.admin.queue_move_check import text as _t
from scheduler.admin.queue_move_doctor import moving_findings
from scheduler.admin.queue_move_keys import BatchKeys, KeyConflicts, carry_keys
from scheduler.admin.queue_move_ledger import MoveLedger
from scheduler.admin.queue_move_lock import LOCK_LEASE_MS, RunLock, locked_reply
from scheduler.client.partitioned_merge import read_layout
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument
from scheduler.core.keys import check_queue_name
from scheduler.core.partitions import Layout

DAY_MS = 86_400_000  # move_done.lua 'renew' accepts a lease up to a day
MOVE_PER_CALL = 1000  # lua/move_out.lua, move_in.lua, move_done.lua MAX_IDS / MAX_BATCH
MOVE_BYTES = 4 * 1024 * 1024  # a batch's spec records (200 of 512 KiB: a move_out of 2.2 s)
__all__ = ["MoveRefused", "MoveReport", "QueueMove", "move_queue", "moving_findings"]
STAY_REASONS = ("leased", "held", "flow", "schedule", "dead", "unreadable", "conflict", "moving")


@dataclass
class MoveReport:
    """What one `move` did (or, dry_run, would do). `stays`: jobs left in the source, by
    reason (STAY_REASONS); `resumed`: found in the source's `moving` set (an interrupted move)
    and sent again; `already`: the destination had them (written by that interrupted run);
    `conflicts`: jobs whose idempotency key the destination holds for another job."""

    source: str
    dest: str
    dry_run: bool
    moved: int = 0
    resumed: int = 0
    already: int = 0
    keys: int = 0
    stays: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAY_REASONS, 0))
    conflicts: KeyConflicts = field(default_factory=KeyConflicts)

    def as_dict(self) -> dict[str, Any]:
        head = {"from": self.source, "to": self.dest, "dry_run": self.dry_run}
        counts = {k: getattr(self, k) for k in ("moved", "resumed", "already", "keys")}
        tail = {"stays": dict(self.stays), "key_conflicts": self.conflicts.as_dict()}
        return head | counts | tail


def _parts(client: redis.Redis, name: str, clock: str) -> tuple[Layout | None, list[Queue]]:
    layout = read_layout(client, name)
    names = [name] if layout is None else list(layout.names)
    return layout, [Queue(client, n, _clock=clock) for n in names]


@dataclass(frozen=True)
class Entry:
    """One job move_out handed out: its id, run_at_ms, spec text and hash fields."""

    id: str
    run_at_ms: str
    spec: str
    fields: list[str]


class QueueMove:
    """One move from `source` to `dest` over `client`; `run()` does it all, `take` / `put` /
    `finish` are its three steps and `close` its end (a test calls them apart to stop between
    them)."""

    def __init__(
        self,
        client: redis.Redis,
        source: str,
        dest: str,
        *,
        batch: int = 500,
        clock: str = "server",
        lease_ms: int = LOCK_LEASE_MS,
    ) -> None:
        check_queue_name(source), check_queue_name(dest)
        for what, v, top in (("batch", batch, MOVE_PER_CALL), ("lease_ms", lease_ms, DAY_MS)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
                raise BadArgument(f"{what} must be an int in 1..{top}, not {v!r:.40}")
        self.client, self.batch = client, batch
        self.src_layout, self.src = _parts(client, source, clock)
        self.dst_layout, self.dst = _parts(client, dest, clock)
        check_names(client, self.src, self.dst, (source, dest))  # same queue; a partition as --to
        self.report = MoveReport(source, dest, dry_run=False)
        self.ledger = MoveLedger()  # this run's moved ids and keys, on disk (no O(N) memory)
        self.kept = 0  # ids take() left where they were (a page offset: they are listed again)
        self.lock = RunLock(client, source, self.src, lease_ms)  # taken by run() alone
        self.batch_keys = BatchKeys(
            client, self.dst, lambda: self.lock.renew(), self.ledger, source, self.report.conflicts
        )

    def check(self, *, skip_schedules: bool, dry_run: bool = False) -> None:
        """Refuse before the first write (queue_move_check.check_move)."""
        names = (self.report.source, self.report.dest, self.src_layout is not None)
        mc.check_move(self.client, self.src, self.dst, names, skip=skip_schedules, dry_run=dry_run)

    def take(
        self, part: Queue, ids: list[str], *, look: bool = False, fresh: bool = False
    ) -> list[Entry]:
        """Step 1 (move_out.lua): the ids' records, out of due into `moving` (look: read
        only; fresh: ids listed from due, so one in `moving` is another run's and left to it).
        Stays are counted in the report by reason."""
        ours = bool(self.lock.held)  # a step-by-step caller (a test) holds none
        self.lock.renew()
        mode = "look" if look else "fresh" if fresh else "take"
        args = [mode, self.report.dest, self.lock.token if ours else "", *ids]
        try:  # move_out records the destination, or refuses another run's (MOVE_ELSEWHERE)
            reply = part._run(_call("move_out", args))  # or another run's lock (MOVE_LOCKED)
        except redis.ResponseError as exc:
            refused = locked_reply(self.report.source, exc, ours=ours)
            raise refused or mc.take_refusal(part.name, self.report.source, exc) or exc from None
        out: list[Entry] = []
        for row in reply:
            jid, what = _t(row[0]), _t(row[1])
            if what == "moving":
                out.append(Entry(jid, _t(row[2]), _t(row[3]), [_t(f) for f in row[4]]))
            elif what in ("flow", "schedule", "unreadable"):
                self.report.stays[what] += 1
                self.kept += 1
            # leased / held / dead / missing: it left due meanwhile (counted from its set);
            # taken: another run's since this page was listed (that run sends it)
        return out

    def put(self, entries: list[Entry]) -> str:
        """Step 2 (move_in.lua): each job into the destination partition its id routes to.
        Returns the flags ('c' written, 'e' already there, 'x' another job holds the id there,
        'm' the destination's own `moving` holds it: a move the other way) in entries' order."""
        self.lock.renew()  # a run that lost its lock while paused writes nothing more
        flags = [""] * len(entries)
        for k, idx in mc.by_partition(self.dst_layout, [e.id for e in entries]).items():
            record_incoming(self.client, self.dst[k], self.report.source)  # before a copy
            args = [str(len(idx)), self.report.source, self.lock.epoch if self.lock.held else ""]
            for i in idx:  # the source's name: move_in's 'm' (a move back there), its epoch
                e = entries[i]
                args += [e.id, e.run_at_ms, e.spec, json.dumps(e.fields)]
            try:  # into the queue index
                answer = _t(self.dst[k]._write(_call("move_in", args)))
            except redis.ResponseError as exc:  # MOVE_STALE: a later run wrote there
                raise locked_reply(self.report.source, exc, ours=True) or exc from None
            except BadArgument as exc:  # partitioned since check(): its record here goes
                raise (
                    mc.partitioned_refusal(self.client, self.dst[k], self.report.source, exc) or exc
                ) from None
            for i, flag in zip(idx, answer, strict=True):
                flags[i] = flag
        return "".join(flags)

    def finish(self, part: Queue, ids: list[str], *, back: bool = False) -> int:
        """Step 3 (move_done.lua): the jobs leave the source (back: the destination holds their
        ids for other jobs: back into due), then the destination's `move_in:<source>` set.
        Refused, nothing written, once the run lost its lock (MOVE_LOCKED, as take)."""
        ours = bool(self.lock.held)
        args = ["back" if back else "done", self.lock.token if ours else "", *ids]
        if not back:  # their idempotency keys first: a run stopped after the finish has them
            self.report.keys += self.batch_keys.carry(part, ids)
        try:
            done = int(part._run(_call("move_done", args)))
        except redis.ResponseError as exc:
            raise locked_reply(self.report.source, exc, ours=ours) or exc from None
        mc.forget_delivered(self.client, self.dst, self.dst_layout, self.report.source, ids)
        return done

    def close(self, part: Queue) -> bool:
        """The run's end on `part` (move_done.lua 'end'): True when its record was deleted."""
        return bool(part._run(_call("move_done", ["end", self.report.dest])))

    def _page(self, part: Queue, key: str) -> list[str]:
        """The next ids of `key` a batch takes: `batch` at most, and at most MOVE_BYTES of
        their spec records (STRLEN; one record alone may be more)."""
        ids = [_t(i) for i in self.client.zrange(key, self.kept, self.kept + self.batch - 1)]
        pipe = self.client.pipeline(transaction=False)
        for i in ids:
            pipe.strlen(part.keys.spec(i))
        sizes = accumulate(n if type(n) is int else 0 for n in pipe.execute(raise_on_error=False))
        return ids[: max(1, sum(1 for total in sizes if total <= MOVE_BYTES))]

    def _drain(self, part: Queue, key: str, *, dry_run: bool, resumed: bool) -> None:
        """Every job listed in `key` (the part's moving set, then its due), a page at a time;
        the ones that stay keep their place, so the next page starts after them."""
        self.kept = 0
        while ids := self._page(part, key):
            before = self.kept
            entries = self.take(part, ids, look=dry_run, fresh=not resumed)
            if dry_run:
                self.kept = before + len(ids)
                self.report.moved += len(entries)
                continue
            if entries:  # a key the destination holds for another job: stays (queue_move_keys)
                clash = self.batch_keys.clashes(part, [e.id for e in entries], resumed=resumed)
                flags = self.put(sent := [e for e in entries if e.id not in clash])
                self.report.moved += flags.count("c")
                self.report.already += flags.count("e")
                self.report.resumed += len(entries) if resumed else 0
                ours = [e.id for e, f in zip(sent, flags, strict=True) if f in "ce"]
                theirs = [e.id for e, f in zip(sent, flags, strict=True) if f not in "ce"]
                theirs += list(clash)
                if ours:
                    self.finish(part, ours)
                    self.ledger.add_moved(ours)
                if theirs:  # back in due, after this page's kept ones: listed again later
                    self.finish(part, theirs, back=True)
                if theirs and not resumed:  # a resumed one is counted by the due pages
                    self.report.stays["conflict"] += flags.count("x") + len(clash)
                    self.report.stays["moving"] += flags.count("m")  # a move back, mid-steps
                    self.kept += len(theirs)

    def run(self, *, dry_run: bool = False, skip_schedules: bool = False) -> MoveReport:
        self.report.dry_run = dry_run
        self.lock.look()  # another run's lock: named first (its other refusals follow from it)
        self.check(skip_schedules=skip_schedules, dry_run=True)  # its refusals, nothing written
        if dry_run:  # takes no lock
            return self._run(dry_run=True)
        try:  # an error or Ctrl-C while taking them leaves none of the locks either
            self.lock.take()  # before the first write: a second run is refused here
            self.check(skip_schedules=skip_schedules)  # again, holding it: with its deletions
            report = self._run(dry_run=False)
        except BaseException:
            self.lock.release(quiet=True)  # a failed release must not hide the run's error
            raise
        finally:
            self.ledger.close()
        self.lock.release()
        return report

    def _run(self, *, dry_run: bool) -> MoveReport:
        for part in self.src:  # an interrupted move's jobs first, from every partition
            moving = part.keys.prefix + "moving"
            if dry_run:
                self.report.resumed += int(self.client.zcard(moving))
            else:
                self._drain(part, moving, dry_run=False, resumed=True)
        name = self.report.source
        if not dry_run:  # none in flight now: a record and kept ids left by a cut run go
            self.lock.renew()  # (each write of the run's own, from a run that holds its lock)
            mc.clear_incoming(self.client, self.src, self.dst, name)
        # A stopped move into the source, let past check() for these: due waits for its rerun.
        stopped = mc.incoming_refusal(self.client, self.src, name, forget_stale=not dry_run)
        for part in self.src if stopped is None else ():
            self._drain(part, part.keys.due, dry_run=dry_run, resumed=False)
            if not dry_run:
                self.carry_keys(part)
            mc.count_stays(self.client, part.keys, self.report.stays)
        if not dry_run:
            self.lock.renew()
            for part in self.src:  # at the end: a part done early stays another destination's
                self.close(part)  # until the whole run is over
            mc.clear_incoming(self.client, self.src, self.dst, name)
        if stopped is not None:
            n, were = self.report.resumed, "would be" if dry_run else "were"
            why = f"{n} job(s) of this move's stopped run {were} re-sent first"
            raise MoveRefused(f"{why} (a conflict: back into due); {stopped}")
        return self.report

    def carry_keys(self, part: Queue) -> None:
        """The keys of `part` its batches did not carry, in (queue_move_keys.carry_keys)."""
        args = (self.client, part, self.dst, self.dst_layout, self.ledger, self.lock.renew)
        self.report.keys += carry_keys(*args, self.report.conflicts)


def move_queue(
    client: redis.Redis,
    source: str,
    dest: str,
    *,
    batch: int = 500,
    dry_run: bool = False,
    skip_schedules: bool = False,
    clock: str = "server",
    lease_ms: int = LOCK_LEASE_MS,
) -> MoveReport:
    """Move the waiting jobs of queue `source` into `dest` (module docstring). Safe to run
    again: a run interrupted anywhere is finished by the next. Raises BadArgument (same queue,
    a bad batch), MoveRefused (no such source, schedules, another run's destination, another
    run of the source: its run lock), NewerStorage; nothing written."""
    return QueueMove(client, source, dest, batch=batch, clock=clock, lease_ms=lease_ms).run(
        dry_run=dry_run, skip_schedules=skip_schedules
    )
