"""Doctor's reading of an interrupted `scheduler queue move` (scheduler/admin/queue_move.py):
the jobs in a queue's `moving` set, which are no orphans, and a run lock that never expires."""

from __future__ import annotations

import redis

from scheduler.admin.doctor_model import Issue
from scheduler.admin.queue_move_check import text
from scheduler.core.errors import BadArgument
from scheduler.core.keys import QueueKeys, check_queue_name


def moving_findings(client: redis.Redis, keys: QueueKeys) -> tuple[set[str], list[Issue]]:
    """For doctor: the ids in the queue's `moving` set (an interrupted move's: they are in no
    other place, yet no orphans: `--fix` must not put them back in due, where a worker would
    run them while the destination may hold them too), and its one finding; and a run lock
    that never expires (`move-lock-stuck`)."""
    key = keys.prefix + "moving"
    stuck = _stuck_lock(client, keys)
    try:
        ids = {text(i) for i in client.zrange(key, 0, -1)}
    except redis.ResponseError:
        why = f"{key} is not a zset (edited by hand): `scheduler queue move` refuses the queue"
        return set(), [*stuck, Issue("moving-damaged", "error", why, f"DEL {key}", keys.queue)]
    if not ids:
        return ids, stuck
    what = f"{len(ids)} job(s) of an interrupted `scheduler queue move` wait in {key}"
    found = [*stuck, Issue("move-interrupted", "warning", what, _rerun(client, keys), keys.queue)]
    # An id there with no record (deleted by hand: move_done drops both at once) is answered
    # 'unreadable' by every rerun and stays: `moving` never empties, nor the record ends.
    pipe = client.pipeline(transaction=False)
    order = sorted(ids)
    for jid in order:
        pipe.exists(keys.job(jid), keys.spec(jid))
    for jid, n in zip(order, pipe.execute(), strict=True):
        if not int(n):
            why = f"{key} holds {jid!r} with no record to move (deleted by hand): reruns keep it"
            how = f"ZREM {key} {jid}"
            found.append(Issue("moving-no-record", "error", why, how, keys.queue, job_id=jid))
    return ids, found


def _rerun(client: redis.Redis, keys: QueueKeys) -> str:
    """The fix of `move-interrupted`: the rerun toward the recorded destination, the only one
    move_out accepts while `moving` holds jobs (a record edited into no queue name: say so)."""
    try:
        got = client.hget(keys.config, "move_to")
    except redis.ResponseError:  # config of another type: doctor names that apart
        got = None
    if got is None:
        return "run the move that took them again, to the same destination: it finishes them"
    to = text(got)
    try:
        check_queue_name(to)
    except BadArgument:
        return (
            f"config move_to {to[:80]!r} names no queue (edited by hand): set it to the queue "
            "they were moving to, then run that move again"
        )
    return (
        f"run `scheduler queue move --to {to}` again (--from this queue, or the partitioned "
        "queue it is a partition of): it finishes them"
    )


def _stuck_lock(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """A run lock (queue_move_lock.py) with no expiry, or of another type (hand edits), keeps
    every move of the queue out for good; a run's own lock expires: no finding."""
    key = keys.prefix + "move_lock"
    if int(client.pttl(key)) != -1:
        return []
    why = f"{key}, the run lock of `scheduler queue move`, never expires (edited by hand)"
    how = f"DEL {key} once no move of the queue is running (not applied by --fix)"
    return [Issue("move-lock-stuck", "error", why, how, keys.queue)]
