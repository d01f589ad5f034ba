"""The refusals of `scheduler queue move` before its first write (scheduler/admin/queue_move.py),
and the records it keeps in the destination while a batch is in flight."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Generator
from typing import Any

import redis

from scheduler.admin.inspection import queue_exists, server_now_ms
from scheduler.client.partitioned_merge import read_layout
from scheduler.client.queue import Queue
from scheduler.core.errors import BadArgument, CorruptKey, SchedulerError, newer_storage
from scheduler.core.keys import STORAGE_GENERATION, QueueKeys
from scheduler.core.partitions import PARTITION_NAME, Layout
from scheduler.operations.requests import Script

# How long a source partition's last take (config `move_take_ms`, lua/move_out.lua) keeps a run
# toward another destination out: longer than one run's gap between two batches (a put and a
# finish of at most MOVE_PER_CALL jobs), so two runs do not split a queue between destinations.
MOVE_QUIET_MS = 60_000  # lua/move_out.lua MOVE_QUIET_MS
# The recorded name last and whole (a hand edit may hold spaces: move_out cuts it at 80 bytes).
_ELSEWHERE = re.compile(r"MOVE_ELSEWHERE moving=(\d+) age_ms=(\d+|none) to=(.*)")
# + a source's name: a destination partition's config field, written before each put into it
# (a copy here may still be in that source's `moving`) and deleted once that run's moving is empty.
INCOMING = "move_from:"
DELIVERED = "move_in:"  # + a source's name: the ids a move put into a destination partition
_INCOMING_REPLY = re.compile(r"MOVE_INCOMING from=(.*)", re.DOTALL)


class MoveRefused(SchedulerError):
    """The move was refused before anything was written (a missing source, schedules, another
    run's destination), or once a rerun re-sent its own stopped jobs (a stopped move into the
    source: its message says so)."""


def elsewhere(part: str, to: str, busy: int, age_ms: int | None) -> MoveRefused:
    """The refusal of a run toward another destination than `to`, recorded by a take from
    `part` `age_ms` ago (None: no time, an older version's record), `busy` jobs in `moving`."""
    if busy:
        return MoveRefused(
            f"{part!r} has jobs of a move to {to!r}: rerun that first ({busy} in its `moving` "
            "set may be there already; a second destination would run them twice)"
        )
    return MoveRefused(
        f"{part!r}: a move to {to!r} took jobs {(age_ms or 0) / 1000:.1f} s ago and may be "
        f"between two batches: let it finish or rerun it (another destination is accepted "
        f"{MOVE_QUIET_MS // 1000} s after its last take)"
    )


def take_refusal(part: str, name: str, exc: redis.ResponseError) -> MoveRefused | None:
    """move_out.lua's MOVE_ELSEWHERE or MOVE_INCOMING error (a take from `part`, of the source
    queue `name`) as MoveRefused; None for another error."""
    if m := _INCOMING_REPLY.match(str(exc)):
        why = "its record is here: it may still be running"
        return incoming(name, m[1], why, QueueKeys(part).config, INCOMING + m[1])
    m = _ELSEWHERE.match(str(exc))
    if m is None:
        return None
    age = None if m[2] == "none" else int(m[2])
    return elsewhere(part, m[3], int(m[1]), age)


def incoming(name: str, other: str, why: str, config: str, field: str) -> MoveRefused:
    """The refusal of a move of `name` onward while a move from `other` into it may hold
    copies here (`field`, move_from:<other>, in the partition's `config`)."""
    return MoveRefused(
        f"{name!r} holds jobs of a stopped move from {other!r} ({why}): run `scheduler queue "
        f"move --from {other} --to {name}` again first (moved on before it, they would be "
        f"written here again and run twice); if that move is abandoned: HDEL {config} {field}"
    )


def script_call(name: str, args: list[str]) -> Generator[Script, Any, Any]:
    """One script call, for a Queue's `_run` / `_write`."""
    return (yield Script(name, args))


def text(v: Any) -> str:
    """A reply value as text (the client may or may not decode)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def check_names(
    client: redis.Redis, src: list[Queue], dst: list[Queue], names: tuple[str, str]
) -> None:
    """BadArgument (nothing written) for the same queue on both sides, or either side one
    partition of a partitioned queue. As --to, every job would land there, whatever partition
    its id routes to (the partitioned queue itself routes each). As --from, its runs keep their
    records under another name than the queue's runs (`move_from:` and the kept ids,
    `move_in:<source>`): a stopped run rerun under the other name would find none of them and
    write a job again that ran, so only the queue itself moves its partitions."""
    source, dest = names
    if {q.name for q in src} & {q.name for q in dst}:
        raise BadArgument(f"--from and --to name the same queue ({source!r})")
    for name, side, what, how in (
        (dest, "--to", "move into", "which routes each job to its partition"),
        (source, "--from", "move", "which moves every partition"),
    ):
        if (m := PARTITION_NAME.match(name)) is None:
            continue
        try:
            layout = read_layout(client, m.group(1))
        except BadArgument as exc:  # unreadable (a hand edit): it may be a partition, refused
            raise BadArgument(
                f"{name!r} may be a partition of {m.group(1)!r}, whose layout record cannot be "
                f"read ({exc}): see `scheduler doctor`; nothing written"
            ) from None
        if layout is not None and name in layout.names:
            raise BadArgument(
                f"{name!r} is a partition of the partitioned queue {m.group(1)!r}: {what} the "
                f"queue itself ({side} {m.group(1)}), {how}"
            )


def check_move(
    client: redis.Redis,
    src: list[Queue],
    dst: list[Queue],
    names: tuple[str, str, bool],
    *,
    skip: bool,
    dry_run: bool = False,
) -> None:
    """Refuse before the first write: a missing source, a queue stored by a newer version,
    another run's destination (`elsewhere`; move_out.lua decides it again at each take),
    schedules in the source (unless skipped: their runs then stay), a stopped move into the
    source (`incoming_refusal`; a real run holding jobs of its own in `moving` re-sends them
    first, then QueueMove._run refuses: those are no copies, and sent they let that move
    finish). `names`: the source, the destination, and whether the source is partitioned."""
    name, dest, partitioned = names
    for side, queues in ((name, src), (dest, dst)):  # partitioned by another process since the
        layout = read_layout(client, side)  # run read it: its queues are no longer that side's
        if [q.name for q in queues] != ([side] if layout is None else list(layout.names)):
            raise MoveRefused(
                f"{side!r} was partitioned (or its layout record changed) since this run read "
                "it: run the same command again"
            )
    now = server_now_ms(client, src[0].keys)
    # Read below with bare calls: a hand edit refuses typed (move_out / move_in's CORRUPT).
    # move_in's check of due comes after move_out took the jobs: checked first.
    for q in (*src, *dst):
        kinds = [(q.keys.config, "hash"), (q.keys.prefix + "moving", "zset")]
        for key, kind in kinds + ([(q.keys.due, "zset")] if q in dst else []):
            if text(client.type(key)) not in ("none", kind):
                raise CorruptKey(f"CORRUPT {key} is not a {kind} (nothing written)")
    if not partitioned and not (
        queue_exists(client, src[0].keys, now) or client.exists(src[0].keys.prefix + "moving")
    ):
        raise MoveRefused(
            f"nothing left to move: {name!r} holds no jobs and no keys (no queue named so). "
            "This is also what a finished move answers: it leaves its source empty"
        )
    for q in (*src, *dst):
        refused = newer_storage(
            q.name, client.hget(q.keys.config, "generation"), STORAGE_GENERATION
        )
        if refused is not None:
            raise refused
    for q in src:  # as move_out.lua decides at each take, refused here before any
        got, took = client.hmget(q.keys.config, ["move_to", "move_take_ms"])
        to, busy = None if got is None else text(got), int(client.zcard(q.keys.prefix + "moving"))
        digits = text(took) if took is not None else ""
        took_ms = int(digits) if digits.isascii() and digits.isdigit() else None
        if took_ms is not None and took_ms > now + MOVE_QUIET_MS:
            took_ms = None  # far ahead (a hand edit): old, as move_out.lua reads it
        age = None if took_ms is None else max(now - took_ms, 0)
        recent = age is not None and age < MOVE_QUIET_MS
        if to is not None and to != dest and (busy or recent):
            raise elsewhere(q.name, to, busy, age)
    own = any(int(client.zcard(q.keys.prefix + "moving")) for q in src)
    stopped = incoming_refusal(client, src, name, forget_stale=not dry_run)
    if stopped is not None and not own:  # own: re-sent first, then refused (QueueMove._run)
        raise stopped
    if not skip:
        n = sum(schedule_count(client, q.keys) for q in src)
        if n:
            raise MoveRefused(
                f"queue {name!r} has {n} schedule(s): define them on {dest!r}, remove them "
                "here, then move (or --skip-schedules: their pending runs stay)"
            )


def schedule_count(client: redis.Redis, keys: QueueKeys) -> int:
    """The schedules of a queue: names in its index whose key exists (of any type: `schedules
    remove` deletes it). A name whose hash was deleted by hand is none: `schedules list` and
    `remove` do not see it, so a refusal for it could not be followed."""
    names = [text(n) for n in client.smembers(keys.schedules)]
    n = 0
    for i in range(0, len(names), 1000):
        pipe = client.pipeline(transaction=False)
        for name in names[i : i + 1000]:
            pipe.exists(keys.schedule(name))
        n += sum(int(x) for x in pipe.execute())
    return n


def incoming_refusal(
    client: redis.Redis, src: list[Queue], name: str, *, forget_stale: bool = False
) -> MoveRefused | None:
    """A move into `name` stopped between a put and its finish: those jobs are here and in its
    source's `moving`, and its rerun sends them again. Moved on from here first, they would be
    written here again by that rerun: in two queues, run twice. A record whose source no longer
    holds jobs moving here is stale (that run finished its jobs): no refusal, and a real run
    (`forget_stale`) deletes it while it holds the value read here, since each take refuses
    any record (move_out.lua's MOVE_INCOMING: a move into `name` may start after this check)."""
    for q in src:
        # That move's `move_to` names q, or the partitioned queue q is a partition of (a
        # partition moved as a source on its own, `--from <queue>.p<k>.<n>`).
        m = PARTITION_NAME.match(q.name)
        into = {q.name, m.group(1)} if m else {q.name}
        for field, value in client.hgetall(q.keys.config).items():
            field, other = text(field), text(field)[len(INCOMING) :]
            if not field.startswith(INCOMING):
                continue
            try:
                if not other:
                    raise ValueError("no source name")
                layout = read_layout(client, other)
                for p in [other] if layout is None else list(layout.names):
                    k = QueueKeys(p)
                    to, n = client.hget(k.config, "move_to"), client.zcard(k.prefix + "moving")
                    if to is not None and text(to) in into and int(n):
                        raise ValueError(f"{n} job(s) in {k.prefix}moving")
            except (ValueError, SchedulerError, redis.ResponseError) as exc:  # a hand edit: refused
                return incoming(name, other, str(exc), q.keys.config, field)
            if forget_stale:
                q._run(script_call("move_done", ["forget", field, text(value)]))
    return None


def partitioned_refusal(
    client: redis.Redis, part: Queue, source: str, exc: BadArgument
) -> MoveRefused | None:
    """move_in.lua's refusal of a put into `part` partitioned since the run's check (by another
    process) as MoveRefused, once the `move_from:<source>` record written before it is deleted
    (no job of the run is there); the batch waits in the source's `moving`, where a rerun finds
    it and sends it into the partitions. None for another BadArgument."""
    if f"queue={part.name} is partitioned" not in str(exc):
        return None
    client.hdel(part.keys.config, INCOMING + source)
    return MoveRefused(
        f"the destination was partitioned during the run ({part.name!r}): run the same command "
        "again (the jobs taken wait in the source's `moving` set until then, and are sent first)"
    )


def record_incoming(client: redis.Redis, part: Queue, source: str) -> None:
    """Before a put into `part`: a move from `source` may leave copies here (incoming_refusal).
    A new value each time: a run deleting a stale record deletes only the value it read."""
    value = f"{int(time.time() * 1000)}-{secrets.token_hex(4)}"
    client.hset(part.keys.config, INCOMING + source, value)


def clear_incoming(client: redis.Redis, src: list[Queue], dst: list[Queue], source: str) -> None:
    """Once no source partition holds jobs in `moving` (none in flight): its record in each
    destination partition and the ids it kept there (move_in.lua's `move_in:<source>`). Each
    value is read before `moving`, and deleted only while it is unchanged (move_done.lua
    'forget'): a run of the source that took over since (a lost lock: paused past its lease
    between this check and the deletion) writes a new value before its put, and nothing of
    its own is deleted. Kept ids of a run cut before its SREM would answer 'e' for a new job
    reusing one, which would be deleted from the source: lost."""
    values = [client.hget(q.keys.config, INCOMING + source) for q in dst]
    if any(int(client.zcard(q.keys.prefix + "moving")) for q in src):
        return
    for q, value in zip(dst, values, strict=True):
        if value is not None:
            q._run(script_call("move_done", ["forget", INCOMING + source, text(value)]))


def forget_delivered(
    client: redis.Redis, dst: list[Queue], layout: Layout | None, source: str, ids: list[str]
) -> None:
    """After a batch's finish: its ids leave each destination partition's `move_in:<source>`
    (move_in.lua keeps them from the put until then)."""
    for k, idx in by_partition(layout, ids).items():
        client.srem(dst[k].keys.prefix + DELIVERED + source, *(ids[i] for i in idx))


def by_partition(layout: Layout | None, ids: list[str]) -> dict[int, list[int]]:
    """The positions in `ids` by the destination partition each id routes to (0: plain)."""
    groups: dict[int, list[int]] = {}
    for i, jid in enumerate(ids):
        groups.setdefault(0 if layout is None else layout.partition_of_id(jid), []).append(i)
    return groups


def count_stays(client: redis.Redis, k: QueueKeys, stays: dict[str, int]) -> None:
    """A source partition's jobs that stay, by reason, counted from their sets."""
    stays["leased"] += int(client.zcard(k.leased))
    stays["held"] += int(client.zcard(k.flow_held))  # waiting for parents: there too
    try:
        stays["dead"] += int(client.zcard(k.dead))
    except redis.ResponseError:  # an older version's dead LIST
        stays["dead"] += int(client.llen(k.dead))
