"""The run lock of `scheduler queue move` (scheduler/admin/queue_move.py): one run of a source
queue at a time.

Each run makes a random token and, before its first write, takes one lock key per source
partition, `<partition prefix>move_lock` (a plain source: one), in that partition's hash slot:
`SET NX PX` with a JSON value naming the run (token, host, pid, started_ms, lease_ms). Taking
all of them before the first write lets a second run be refused before any of its writes. The
run renews them (compare-and-renew, lua/move_done.lua 'renew') before each take and each put;
each take checks the token atomically with the take (lua/move_out.lua, `MOVE_LOCKED`), so a run
that paused past its lease (GC, a stopped laptop) and lost its lock stops before its next take.
Its end deletes them (compare-and-delete, move_done.lua 'unlock'). A crashed run's lock
expires LOCK_LEASE_MS after its last renewal."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from datetime import UTC, datetime
from typing import Any

import redis

from scheduler.admin.inspection import server_now_ms
from scheduler.admin.queue_move_check import MoveRefused
from scheduler.admin.queue_move_check import script_call as _call
from scheduler.admin.queue_move_check import text as _t
from scheduler.client.queue import Queue

# A few times the longest gap between two renewals (one put or finish of at most 1000 jobs, a
# hundred idempotency keys carried): a crashed run blocks a rerun for at most this long.
LOCK_LEASE_MS = 30_000
_LOCKED = re.compile(r"MOVE_LOCKED holder=(.*)", re.DOTALL)


def lock_key(part: Queue) -> str:
    return part.keys.prefix + "move_lock"


def holder_text(client: redis.Redis, key: str, value: Any) -> str:
    """Who holds the lock at `key` (its JSON value), when it was last renewed, when it expires."""
    try:
        info = json.loads(_t(value))
        if not isinstance(info, dict):
            raise ValueError(info)
        started = datetime.fromtimestamp(int(info["started_ms"]) / 1000, UTC)
        host = str(info["host"])[:80]
        who = f"host {host}, pid {info['pid']}, started {started:%Y-%m-%d %H:%M:%S} UTC"
        lease_ms = int(info["lease_ms"])
    except (ValueError, KeyError, TypeError, OverflowError, OSError):
        who, lease_ms = "a value this version did not write", 0
    ttl_ms = int(client.pttl(key))
    when = f"expires in {max(ttl_ms, 0) / 1000:.1f} s unless renewed"
    if ttl_ms == -1:  # set by hand without an expiry: no run would write it so
        when = "never expires: no expiry set; delete it if no move is running"
    elif ttl_ms == -2:
        when = "gone since: run again"
    if lease_ms and ttl_ms >= 0:
        when = f"last renewed {max(lease_ms - ttl_ms, 0) / 1000:.1f} s ago, {when}"
    return f"{key} ({who}; {when})"


def held_refusal(source: str, holder: str) -> MoveRefused:
    return MoveRefused(
        f"another move of queue {source!r} is running: {holder}; let it finish, or rerun once "
        "its lock is gone (a stopped run's lock expires a lease after its last renewal)"
    )


def lost_refusal(source: str, holder: str) -> MoveRefused:
    return MoveRefused(
        f"this move of queue {source!r} lost its lock ({holder}): stopped before its next step; "
        "rerun to finish (jobs left in `moving` are sent again first)"
    )


def locked_reply(source: str, exc: redis.ResponseError, *, ours: bool) -> MoveRefused | None:
    """MOVE_LOCKED (move_out.lua's take, move_done.lua's finish) or MOVE_STALE (move_in.lua's
    put: a later run wrote there) as MoveRefused (None for another error); `ours`: the caller
    held the lock (it lost it), else another run holds it."""
    if str(exc).startswith("MOVE_STALE"):
        why = "a later run wrote into the destination, or the server's clock went back"
        return lost_refusal(source, f"{why}: {exc}")
    m = _LOCKED.match(str(exc))
    if m is None:
        return None
    holder = m[1] or "none: expired"
    return lost_refusal(source, holder) if ours else held_refusal(source, holder)


class RunLock:
    """The lock keys of one run on the source partitions `parts` (the module docstring)."""

    def __init__(self, client: redis.Redis, source: str, parts: list[Queue], lease_ms: int) -> None:
        self.client, self.source, self.parts, self.lease_ms = client, source, parts, lease_ms
        self.token = secrets.token_hex(16)
        self.held: list[Queue] = []
        self.epoch = ""  # the run's fencing epoch, taken with its locks (move_in.lua)

    def value(self) -> str:
        info = {
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_ms": int(time.time() * 1000),
            "lease_ms": self.lease_ms,
        }
        return json.dumps(info)

    def look(self) -> None:
        """The refusal a run would meet (the dry run: nothing written)."""
        for part in self.parts:
            key = lock_key(part)
            value = self._get(key)
            if value is not None:
                raise held_refusal(self.source, holder_text(self.client, key, value))

    def take(self) -> None:
        """Every partition's lock, or none of them and MoveRefused naming the holder."""
        value = self.value()
        try:
            for part in self.parts:
                key = lock_key(part)
                if self.client.set(key, value, nx=True, px=self.lease_ms):
                    self.held.append(part)
                    continue
                holder = holder_text(self.client, key, self._get(key) or "?")
                raise held_refusal(self.source, holder)
            # The server's time once every lock is held: a later run of the source takes them
            # only after this one's lapsed, a lease later. Each destination keeps the highest
            # it saw and refuses an earlier run's put: one that lost its lock between its
            # renewal and the put (move_in.lua runs in another slot than the lock).
            self.epoch = str(server_now_ms(self.client, self.parts[0].keys))
        except BaseException:  # a refusal, a server error, Ctrl-C: the ones taken are deleted
            self.release(quiet=True)
            raise

    def renew(self) -> None:
        """Each held lock's lease starts again; a lock taken over or expired: MoveRefused."""
        for part in self.held:
            got = part._run(_call("move_done", ["renew", self.token, str(self.lease_ms)]))
            if got != 1:
                key = lock_key(part)
                holder = holder_text(self.client, key, got) if got else "none: expired"
                self.held.remove(part)
                raise lost_refusal(self.source, holder)

    def release(self, *, quiet: bool = False) -> None:
        """Delete the locks this run still holds (another run's are kept), each one tried: one
        that fails (a server error) keeps its lock until its lease ends. The first failure is
        raised after the others were tried, unless `quiet` (a run ending on its own error:
        that one is what its caller must see)."""
        parts, self.held = self.held, []
        failed: list[Exception] = []
        for part in parts:
            try:
                part._run(_call("move_done", ["unlock", self.token]))
            except Exception as exc:  # a lost connection, a refusal translated: tried on
                failed.append(exc)
        if failed and not quiet:
            raise failed[0]

    def _get(self, key: str) -> Any:
        try:
            return self.client.get(key)
        except redis.ResponseError:  # edited by hand into another type
            raise MoveRefused(
                f"{key} is not a string (edited by hand): delete it if no move of "
                f"{self.source!r} is running"
            ) from None
