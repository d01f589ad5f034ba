"""The refusals of `scheduler queue move` before its first write (scheduler/admin/queue_move.py)
and doctor's reading of an interrupted move (`moving_findings`)."""

from __future__ import annotations

from typing import Any

import redis

from scheduler.admin.doctor_model import Issue
from scheduler.admin.inspection import queue_exists, server_now_ms
from scheduler.client.queue import Queue
from scheduler.core.errors import CorruptKey, SchedulerError, newer_storage
from scheduler.core.keys import STORAGE_GENERATION, QueueKeys


class MoveRefused(SchedulerError):
    """The move was refused before anything was written (a missing source, schedules)."""


def text(v: Any) -> str:
    """A reply value as text (the client may or may not decode)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def check_move(
    client: redis.Redis,
    src: list[Queue],
    dst: list[Queue],
    names: tuple[str, str, bool],
    *,
    skip_schedules: bool,
) -> None:
    """Refuse before the first write: a missing source, a queue stored by a newer version,
    schedules in the source (unless skipped: their runs then stay). `names`: the source, the
    destination, and whether the source is partitioned."""
    name, dest, partitioned = names
    now = server_now_ms(client, src[0].keys)
    if not partitioned and not (
        queue_exists(client, src[0].keys, now) or client.exists(src[0].keys.prefix + "moving")
    ):
        raise MoveRefused(
            f"no queue named {name!r}: nothing to move (a move that finished leaves none)"
        )
    for q in (*src, *dst):
        refused = newer_storage(
            q.name, client.hget(q.keys.config, "generation"), STORAGE_GENERATION
        )
        if refused is not None:
            raise refused
    # move_in's own check of due comes after move_out took the jobs: checked first.
    zsets = [q.keys.due for q in dst] + [q.keys.prefix + "moving" for q in src]
    for key in zsets:
        try:
            client.zcard(key)
        except redis.ResponseError:
            raise CorruptKey(f"CORRUPT {key} is not a zset (nothing written)") from None
    for q in (*src, *dst):  # an unfinished move is finished first, to where it went: else 2 copies
        to = text(client.hget(q.keys.config, "move_to") or "?")
        busy = client.zcard(q.keys.prefix + "moving")
        if busy and (q in dst or to not in ("?", dest)):
            raise MoveRefused(f"{q.name!r} has jobs of a move to {to!r}: rerun that first")
    if not skip_schedules:
        n = sum(int(client.scard(q.keys.schedules)) for q in src)
        if n:
            raise MoveRefused(
                f"queue {name!r} has {n} schedule(s): define them on {dest!r}, remove them "
                "here, then move (or --skip-schedules: their pending runs stay)"
            )


def moving_findings(client: redis.Redis, keys: QueueKeys) -> tuple[set[str], list[Issue]]:
    """For doctor: the ids in the queue's `moving` set (an interrupted move's: they are in no
    other place, yet no orphans: `--fix` must not put them back in due, where a worker would
    run them while the destination may hold them too), and its one finding."""
    key = keys.prefix + "moving"
    try:
        ids = {text(i) for i in client.zrange(key, 0, -1)}
    except redis.ResponseError:
        why = f"{key} is not a zset (edited by hand): `scheduler queue move` refuses the queue"
        return set(), [Issue("moving-damaged", "error", why, f"DEL {key}", keys.queue)]
    if not ids:
        return ids, []
    what = f"{len(ids)} job(s) of an interrupted `scheduler queue move` wait in {key}"
    fix = "run the same `scheduler queue move --from ... --to ...` again: it finishes them"
    return ids, [Issue("move-interrupted", "warning", what, fix, keys.queue)]
