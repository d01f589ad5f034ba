"""Why a job is not running right now, in words, for the job page.

The one place these reasons are worked out: flow control (priorities, concurrency keys, rate
limits, dependencies; docs/flow-control.md) adds its reasons here, each as one more `Reason`,
and the job page shows every reason returned without any change to the template."""

from __future__ import annotations

import re
from dataclasses import dataclass

from redis.exceptions import ResponseError

from scheduler.client.queue import Queue
from scheduler.core.codec import stored_int
from scheduler.core.errors import SchedulerError
from scheduler.core.models import Job, JobState

# The job field `flow_reason` as lua/lib/flow.lua writes it (flow_admit, flow_wait).
_KEY_LIMIT = re.compile(r"limited by key (\S+) \((\d+) leased\)")
# 'older job': the words before the key's held jobs were ordered by priority too (fbeacb5),
# still stored on a job held by the previous version (a rolling deploy).
_BEHIND = re.compile(r"waiting behind (?:older )?job (\S+) of key (\S+) \((\d+) of (\d+) leased\)")
_RATE = re.compile(r"rate window (\S+) \((\d+) per (\d+) ms\) until (\d+)")
_WAITING = re.compile(r"waiting for (\d+) jobs")
# A dead reason of a child parked by its parent (lib/flow.lua flow_parent_ended).
_PARENT = re.compile(r"parent (dead|cancelled): (\S+)")

# The job page's Cancel button: a waiting (held too) or leased job, what lua/cancel.lua stops.
CAN_CANCEL = frozenset({JobState.DUE, JobState.SCHEDULED, JobState.HELD, JobState.LEASED})


@dataclass(frozen=True)
class Reason:
    code: str  # stable: 'scheduled', 'waiting-for-worker', 'limited-by-key', 'dead', ...
    text: str


def _in(ms: int, now_ms: int) -> str:
    return f"in {max(ms - now_ms, 0) // 1000} s"


def flow_reasons(job: Job, now_ms: int) -> list[Reason]:
    """The flow-control hold of a waiting job (set aside by a key, a rate window or its
    parents), from its `flow_reason` field; [] when it is not held."""
    raw = job.fields.get("flow_reason")
    if not raw:
        return []
    if m := _KEY_LIMIT.fullmatch(raw):
        key, limit = m.groups()
        text = f"limited by key {key}: its {limit} slots are leased; it runs when one ends"
        return [Reason("limited-by-key", text)]
    if m := _BEHIND.fullmatch(raw):
        ahead, key, live, limit = m.groups()
        text = (
            f"waiting behind job {ahead} of key {key}: the key had room ({live} of "
            f"{limit} leased when it was set aside), but the key's held jobs go back in order "
            f"(run time, moved ahead by priority), so {ahead} goes first; this one comes back "
            "in its turn as leases end"
        )
        return [Reason("behind-older-in-key", text)]
    if m := _RATE.fullmatch(raw):
        key, count, window, until = m.groups()
        text = (
            f"rate window {key} is full ({count} starts per {window} ms): "
            f"its next slot is {_in(int(until), now_ms)} (server ms {until})"
        )
        return [Reason("rate-window", text)]
    if m := _WAITING.fullmatch(raw):
        n = m.group(1)
        text = f"waiting for {n} parent job{'' if n == '1' else 's'} to be done (enqueue after=)"
        return [Reason("waiting-for-parents", text)]
    return [Reason("flow-held", f"held by flow control: {raw}")]


def why_not_running(
    job: Job, now_ms: int, live_workers: int, paused_ms: int | None = None, claiming: int = -1
) -> list[Reason]:
    """Reasons the job is not being run now; [] when it is running (leased). paused_ms: when
    its queue was paused (QueueCounts.paused_ms), None while it is not. claiming: how many of
    the live workers still claim (not quiet or stopping; -1: not known, taken as all)."""
    state = job.state
    if state == JobState.LEASED:
        return []
    held = flow_reasons(job, now_ms)
    if state == JobState.SCHEDULED:
        return [*_scheduled(job.run_at_ms, now_ms), *held]
    paused = [] if paused_ms is None else [_paused(paused_ms, now_ms)]
    if state == JobState.HELD:  # set aside by flow control, whatever its run_at
        run_at = job.run_at_ms
        later = [] if run_at is None or run_at <= now_ms else _scheduled(run_at, now_ms)
        held = held or [Reason("flow-held", "held by flow control until its hold ends")]
        return [*paused, *held, *later, *_suspect(job), *_past_deadline(job, now_ms)]
    if state == JobState.DUE:
        if live_workers == 0:
            waits = [
                *paused,
                *held,
                Reason("no-live-worker", "it is due, but no worker of this queue is alive"),
            ]
        elif claiming == 0:  # quiet or stopping: none claims again, a new worker must start
            text = "it is due, but its live workers are quiet or stopping: none will claim it"
            waits = [*paused, *held, Reason("no-claiming-worker", text)]
        else:
            waits = [*paused, *held] or [
                Reason("waiting-for-worker", "it is due and waits for a free worker slot")
            ]
        return [*waits, *_suspect(job), *_past_deadline(job, now_ms)]
    if state == JobState.DEAD:
        why = job.dead_reason or "unknown"
        if why == "start deadline passed":
            src = "its schedule's" if job.fields.get("schedule") else "enqueue"
            text = f"it was not started by its start deadline ({src} start_within_ms)"
            return [Reason("start-deadline", f"{text}: requeue it to run it anyway")]
        if m := _PARENT.fullmatch(why):
            text = f"parked because its parent job {m.group(2)} ended {m.group(1)}"
            return [Reason("parked-by-parent", f"{text}: requeue it to run it anyway")]
        return [Reason("dead", f"it is a dead letter ({why}): requeue it to run it again")]
    if state == JobState.DONE:
        return [Reason("done", "it has finished")]
    if state == JobState.CANCELLED:
        return [Reason("cancelled", "it was cancelled")]
    if state == JobState.MOVING:  # in the queue's `moving` set (admin/queue_move.py)
        text = ("`scheduler queue move` is moving it to another queue, where it runs (an "
                "interrupted move: running the same move again finishes it)")  # fmt: skip
        return [Reason("moving", text)]
    return [Reason("unknown-state", f"its stored state {state!r} is not one this version knows")]


def _scheduled(run_at: int | None, now_ms: int) -> list[Reason]:
    wait = "" if run_at is None else f" {_in(run_at, now_ms)}"
    return [Reason("scheduled", f"its run time has not come yet (due{wait})")]


def queue_paused_ms(q: Queue) -> int | None:
    """When q (a job's queue, or its partition) was paused, for why_not_running: a due job's
    first reason, not a busy worker. None also when its counts cannot be read (a key edited
    into another type): the job page still shows the job."""
    try:
        return q.counts().paused_ms
    except (ResponseError, SchedulerError):
        return None


def _paused(paused_ms: int, now_ms: int) -> Reason:
    since = f" (for {max(now_ms - paused_ms, 0) // 1000} s)" if paused_ms > 0 else ""
    text = f"its queue is paused{since}: no worker claims its jobs until it is resumed"
    return Reason("queue-paused", text)


def _suspect(job: Job) -> list[Reason]:
    """A job whose lease lapsed twice or more (its worker died running it), or once when its
    next attempt is its last, is claimed by a worker holding no other such job
    (docs/durability.md, claim.lua suspect_at): it may wait for one."""
    raw = job.fields.get("lapses") or ""
    n = int(raw) if raw.isascii() and raw.isdigit() else 0  # claim.lua reads garbage as 0
    last = (job.attempts or 0) + 1 >= (job.max_attempts or 0) > 0
    if n < 1 or (n < 2 and not last):
        return []
    text = (
        f"its lease lapsed {n} times (a worker died or stalled running it): it runs as a "
        "suspect, on a worker holding no other suspect"
    )
    return [Reason("suspect", text)]


def _past_deadline(job: Job, now_ms: int) -> list[Reason]:
    """A due job past its start deadline is not run: the next claim parks it."""
    start_by = job.start_by_ms
    if start_by is None or start_by >= now_ms:
        return []
    return [Reason("start-deadline", "its start deadline has passed: the next claim parks it")]


def _priority(stored: str | None) -> str:
    """The priority claim reads (lua/lib/flow.lua): unset is 0, and so is a value out of 0..9
    (a hand edit), said so."""
    if stored is None or stored_int(stored, 0, 9) is not None:
        return stored or "0"
    return f"unreadable ({stored[:40]!r}): claimed as 0"


def flow_settings(job: Job) -> list[tuple[str, str]]:
    """The job's flow-control settings as (label, value) rows for its record: priority always
    (0 = the default, the lowest), the concurrency key, rate key and parents when set."""
    f = job.fields
    rows = [("priority", _priority(f.get("priority")))]
    if f.get("ckey"):
        rows.append(("concurrency key", f"{f['ckey']} (at most {f.get('climit', '?')} at once)"))
    if f.get("rkey"):
        rate = f"{f.get('rcount', '?')} per {f.get('rwindow', '?')} ms"
        rows.append(("rate key", f"{f['rkey']} ({rate})"))
    if f.get("parents"):  # after=[...]: those its enqueue found not done
        rows.append(("parents", f["parents"]))
    return rows
