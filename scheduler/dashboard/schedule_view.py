"""The schedules page's rows: the next runs in the schedule's own time zone and the outcome of
the occurrence before the pending one (its job, read by id: O(1) per schedule)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from scheduler.admin.doctor_flow import FLOW_EFFECT
from scheduler.client.partitioned_merge import not_answering
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument, SchedulerError, slot_move_text
from scheduler.core.models import Job
from scheduler.dashboard import batch
from scheduler.dashboard.store import Store
from scheduler.schedules.cron_slots import cron_slots_after, cron_slots_upto
from scheduler.schedules.recurring import Schedule, check_schedule_name

NEXT_RUNS = 3
Rows = tuple[list[dict[str, Any]], int]  # a queue's rows, how many names its set holds
# An occurrence's job id is 'schedule:<name>:<slot ms>' (lua/lib/schedule.lua occurrence_id).
OCCURRENCE_PREFIX = "schedule:"
# A slot is a server time in ms: ASCII digits only ('²'.isdigit() is True, int('²') fails),
# and short enough for a date (a longer one overflows the cron arithmetic).
_SLOT = re.compile(r"[0-9]{1,15}")
# Stored text is hostile input: a cron/time computation on it may raise any of these.
_UNREADABLE = (SchedulerError, ValueError, KeyError, OverflowError)


def _slot_of(pending: str, name: str) -> int | None:
    head = f"{OCCURRENCE_PREFIX}{name}:"
    tail = pending[len(head) :] if pending.startswith(head) else ""
    return int(tail) if _SLOT.fullmatch(tail) else None


def flow_warning(s: Schedule) -> tuple[str, str] | None:
    """(severity, what its runs get) for a schedule's flow field read as unset (edited by hand,
    Schedule.flow_unreadable), as doctor's 'schedule-flow-unreadable' says; None when all read.
    Not for an unreadable schedule: it has no runs."""
    if s.unreadable or not s.flow_unreadable:
        return None
    return FLOW_EFFECT.get(s.flow_unreadable, ("warning", "see scheduler doctor"))


def actionable(name: str) -> bool:
    """A name the buttons may put in a URL path: a valid schedule name (the set of names is
    writable by any producer) other than '.' and '..' (a browser resolves those as dot
    segments: the form would post elsewhere)."""
    try:
        check_schedule_name(name)
    except BadArgument:
        return False
    return name not in (".", "..")


def next_runs(s: Schedule, now_ms: int) -> list[int]:
    """The next NEXT_RUNS run times (server ms): the pending one first, at its own due time (a
    run a redefinition kept has the offset it was placed with, not the stored one), then the
    slots after its slot, each at slot + the stored offset (counted from its due time, the
    later runs of a kept run carried its old offset)."""
    first = s.next_run_ms
    head = [first] if first is not None else []
    slot = _slot_of(s.pending, s.name)
    if slot is None:  # none pending (paused): from where resume places, now - offset
        slot = first - s.offset_ms if first is not None else now_ms - s.offset_ms
    try:
        if s.kind == "cron" and s.cron:
            rest = cron_slots_after(s.cron, s.tz or "UTC", slot, NEXT_RUNS)
            return (head + [r + s.offset_ms for r in rest])[:NEXT_RUNS]
    except _UNREADABLE:
        return head
    if first is None or s.every_ms <= 0:
        return head
    # Interval slots are the multiples of every_ms (lib/rearm.lua); a run a redefinition kept
    # may sit between two of the new ones, and the next is the first multiple after it.
    base = slot // s.every_ms * s.every_ms
    later = [base + i * s.every_ms + s.offset_ms for i in range(1, NEXT_RUNS)]
    return (head + later)[:NEXT_RUNS]


def previous_slot(s: Schedule, now_ms: int) -> int | None:
    """The slot before the pending occurrence's (or the last one up to now when none is
    pending); None when it cannot be told."""
    slot = _slot_of(s.pending, s.name)
    try:
        if s.kind == "cron" and s.cron:
            upto = (slot - 1) if slot is not None else now_ms
            found = cron_slots_upto(s.cron, s.tz or "UTC", upto, 1)
            return found[-1] if found else None
    except _UNREADABLE:
        return None
    # A kept run off the interval's multiples came from the old definition: its slot before
    # cannot be told.
    if slot is not None and s.every_ms > 0 and slot % s.every_ms == 0:
        return slot - s.every_ms
    return None


def queue_schedule_rows(
    store: Store, name: str, limit: int
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """schedule_rows of each partition of queue `name` (a schedule lives in one), `limit` rows
    in all, and the partitions not read: one whose node does not answer is left out while
    another answers ('partition <name>: <error>'; /schedules answered 503)."""
    rows: list[dict[str, Any]] = []
    total, unread, errors = 0, [], []
    parts = store.view(name).part_names
    for part in parts:
        try:
            found, count = schedule_rows(store, part, limit - len(rows))
        except Exception as exc:  # a node down, or refusing for now (its slot moving)
            if not not_answering(exc):
                raise
            unread.append(f"partition {part}: {slot_move_text(exc) or exc}")
            errors.append(exc)
            continue
        rows, total = rows + found, total + count
    if len(errors) == len(parts):  # none answered (a plain queue's one): the app's 503
        raise errors[0]
    return rows, total, unread


def schedule_rows(store: Store, name: str, limit: int) -> tuple[list[dict[str, Any]], int]:
    """(the rows of the first `limit` schedules by name, how many names the queue holds)."""
    found: tuple[list[dict[str, Any]], int] | None = batch.take("schedules", name)
    if found is not None:  # read with the page's other queues (page_rows)
        return found[0][: max(limit, 0)], found[1]
    q = store.queue(name)
    # Cut before reading the definitions: the schedules set is a plain key a producer can fill.
    schedules, total = store.run(q, q.ops.first_schedules(limit))
    if not schedules:
        return [], total
    now_ms = q.counts().now_ms
    prev_ids = _previous_ids(schedules, now_ms)
    jobs = store.run(q, q.ops.get_jobs(list(prev_ids.values()))) if prev_ids else []
    return _rows(q, schedules, now_ms, prev_ids, jobs), total


def page_rows(store: Store, names: Sequence[str], shown: int) -> dict[str, Rows]:
    """schedule_rows of every partition of `names` at once, `shown` rows in all, by partition
    (queue) name: each step one driver call a server (batch.run_ops): their names (and how
    many), the definitions of those shown, the clock of their node, their last occurrences.
    Each was a few round trips of each queue's own: 200 queues, 400 and more a page. A
    partition that failed a step is left out: read alone (schedule_rows), named as before."""
    parts = [q for v in batch.views(store, names) for q in v.parts]
    got = batch.run_ops(store.client, [(q, q.ops.first_schedules(0)) for q in parts])
    out: dict[str, Rows] = {}
    read: list[tuple[Queue, int]] = []  # with a limit: parts holding schedules
    room = shown
    for q, r in zip(parts, got, strict=True):
        if isinstance(r, BaseException):
            continue
        if r[1] and room > 0:
            read.append((q, room))
            room -= r[1]  # at most: a name removed meanwhile is no row
        else:
            out[q.name] = ([], r[1])
    got = batch.run_ops(store.client, [(q, q.ops.first_schedules(n)) for q, n in read])
    done = [(q, r) for (q, _), r in zip(read, got, strict=True) if not isinstance(r, BaseException)]
    clocks = batch.run_ops(store.client, [(q, q.ops.counts()) for q, _ in done])
    timed = [(q, r, c.now_ms) for (q, r), c in zip(done, clocks, strict=True)
             if not isinstance(c, BaseException)]  # fmt: skip
    prev = [_previous_ids(r[0], now_ms) for _, r, now_ms in timed]
    asked = [(q, q.ops.get_jobs(list(p.values()))) for (q, _, _), p in zip(timed, prev, strict=True)
             if p]  # fmt: skip
    replies = iter(batch.run_ops(store.client, asked))
    for (q, (schedules, total), now_ms), p in zip(timed, prev, strict=True):
        jobs = next(replies) if p else []
        if not isinstance(jobs, BaseException):
            out[q.name] = (_rows(q, schedules, now_ms, p, jobs), total)
    return out


def _previous_ids(schedules: list[Schedule], now_ms: int) -> dict[str, str]:
    """Each schedule's last occurrence's job id, by schedule name (when it can be told)."""
    prev_ids: dict[str, str] = {}
    for s in schedules:
        if not actionable(s.name):
            continue  # no occurrence id is built from a name that is not one
        slot = previous_slot(s, now_ms)
        if slot is not None and slot >= 0:
            prev_ids[s.name] = f"{OCCURRENCE_PREFIX}{s.name}:{slot}"
    return prev_ids


def _rows(
    q: Queue, schedules: list[Schedule], now_ms: int, prev_ids: dict[str, str], found: list[Job]
) -> list[dict[str, Any]]:
    jobs = {j.id: j for j in found}
    rows = []
    for s in schedules:
        prev = jobs.get(prev_ids.get(s.name, ""))
        rows.append(
            {
                "queue": q.name,
                "s": s,
                "valid": actionable(s.name),  # else shown flagged, without buttons
                "tz": s.tz or "UTC",
                "next_runs": next_runs(s, now_ms),
                "flow_warning": flow_warning(s),
                "last_id": prev.id if prev else None,
                "last_state": prev.state if prev else None,
                "last_error": prev.fields.get("last_error_type") if prev else None,
            }
        )
    return rows
