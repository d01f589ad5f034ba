"""The doctor's vocabulary: findings (`Issue`), what is stored about one job (`Snapshot`), the
check's `Context`, the reads a snapshot is made of (`snapshot_reads`, `snapshot_from`: the check
and a repair read a job alike), the repair plans (each one lua/repair.lua move: the lib/job.lua
moves of the transitions, done only while the job is where the check found it) and the strict
readers of stored numbers and fields."""

import functools
import hashlib
import json
import math
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import scripts
from scheduler.core.codec import RESULT_TTL_MS, stored_int, stored_int_in
from scheduler.core.keys import QueueKeys
from scheduler.core.limits import DEFAULT_LEASE_MS
from scheduler.core.spec_record import with_spec

DEFAULT_STALE_LEASE_MS = 5 * 60_000
_PAGE = 500
# The most record bytes one pipeline of the first read GETs (doctor_pending: STRLEN first; one
# record alone may be more): a page of 500 records of 512 KiB payloads held 256 MiB in the
# doctor's process, and as much in the server's reply buffer.
_PAGE_BYTES = 4 * 1024 * 1024
_CONFIRM_BATCH = 100
_WATCH_TRIES = 5
_PLACES = ("due", "leased", "dead")  # preference order when the state field names none of them
Command = tuple[str, ...]


@dataclass(frozen=True)
class Issue:
    """One finding. `repair` holds the commands `--fix` runs in one MULTI (empty when no repair
    is safe); `fix` says what an operator types. `rearms`: the repair re-arms an orphan (a job
    in none of due, leased, dead, which no worker sees) by putting it back in due. `next_run`
    (a fixed finding): the run of a schedule its repair armed, having parked the pending one."""

    code: str
    severity: str  # 'error' | 'warning'
    message: str
    fix: str
    queue: str | None = None
    job_id: str | None = None
    repair: tuple[Command, ...] = ()
    rearms: bool = False
    next_run: str | None = None
    node: str | None = None  # a server finding's cluster node ("host:port"): its fix runs there

    def redis_cli(self) -> list[str]:
        return [_by_hand(cmd) for cmd in self.repair]

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "queue": self.queue,
            "job_id": self.job_id,
            "message": self.message,
            "fix": self.fix,
            "fixable": bool(self.repair),
            "rearms": self.rearms,
            "next_run": self.next_run,
            "redis_cli": self.redis_cli(),
        }


@dataclass(frozen=True)
class Report:
    """What `repair_queue` fixed and what remains."""

    queue: str
    fixed: list[Issue]
    remaining: list[Issue]

    @property
    def rearmed(self) -> list[Issue]:
        """The fixed orphans put back in due (counted apart: no worker saw them before)."""
        return [i for i in self.fixed if i.rearms]

    @property
    def next_runs(self) -> list[Issue]:
        """The fixed findings whose repair parked a schedule's pending run and armed its next."""
        return [i for i in self.fixed if i.next_run is not None]


@dataclass(frozen=True)
class Snapshot:
    """What is stored about one job id, ideally read atomically."""

    id: str
    key_type: str  # 'hash', 'none', or a wrong type
    fields: dict[str, str]
    ttl_ms: int | None
    due_ms: int | None
    lease_until_ms: int | None
    dead_count: int  # 1 when in the dead ZSET, else 0
    # Set aside by flow control (in flow:held, not in due): read as due, at its held score.
    held: bool = False
    # Its hash or spec record has no expiry (ttl_ms is the sooner one's: that hides the other).
    kept: bool = False
    # The fields read from its spec record alone (not in its hash): where their bytes are.
    from_spec: frozenset[str] = frozenset()

    @property
    def places(self) -> list[str]:
        present = (self.due_ms is not None, self.lease_until_ms is not None, self.dead_count > 0)
        return [p for p, here in zip(_PLACES, present, strict=True) if here]


@dataclass(frozen=True)
class Context:
    keys: QueueKeys
    now_ms: int
    live_workers: frozenset[str]
    stale_lease_ms: int = DEFAULT_STALE_LEASE_MS
    record_ttl_ms: int = RESULT_TTL_MS


def _by_hand(cmd: Command) -> str:
    if cmd[0] == "EVALSHA":  # a lib move (lua/repair.lua): its sha means nothing in a terminal
        nkeys = int(cmd[2])
        args = " ".join(shlex.quote(a) for a in cmd[3 + nkeys :])
        return f"scheduler doctor --fix   # runs lua/repair.lua on {shlex.quote(cmd[3])}: {args}"
    return "redis-cli " + " ".join(shlex.quote(a) for a in cmd)  # none today: every repair is Lua


@functools.cache
def repair_sha() -> str:
    """lua/repair.lua's SHA1, computed on first use (not at import: the CLI imports this)."""
    return hashlib.sha1(scripts.source("repair").encode()).hexdigest()


# -- reading one job: its keys, its places (flow:held read as due) ---------------------------
def _hash_reply(reply: Any) -> dict[str, str]:
    return {} if isinstance(reply, ResponseError) else {str(a): str(b) for a, b in reply.items()}


def _ttl(pttl: Any, spec_pttl: Any = -2) -> int | None:
    """The job's expiry: its hash's, or its spec record's (a pending job is the spec alone)."""
    left = [int(t) for t in (pttl, spec_pttl) if not isinstance(t, ResponseError) and int(t) >= 0]
    return min(left) if left else None


def _kept(pttl: Any, spec_pttl: Any = -2) -> bool:
    """Whether its hash or its spec record exists with no expiry."""
    return any(not isinstance(t, ResponseError) and int(t) == -1 for t in (pttl, spec_pttl))


def _at(score: Any) -> int | None:
    """A ZSCORE reply as ms; an error reply (a key of another type) reads as not there."""
    return None if score is None or isinstance(score, ResponseError) else _score_ms(score)


def snapshot_reads(keys: QueueKeys, jid: str) -> list[tuple[str, ...]]:
    """What one job's snapshot is read from, in `snapshot_from`'s order."""
    jk, sk = keys.job(jid), keys.spec(jid)
    return [("TYPE", jk), ("HGETALL", jk), ("PTTL", jk), ("ZSCORE", keys.due, jid),
            ("ZSCORE", keys.leased, jid), ("ZSCORE", keys.dead, jid), ("GET", sk), ("PTTL", sk),
            ("ZSCORE", keys.flow_held, jid)]  # fmt: skip


def snapshot_from(jid: str, reply: Sequence[Any]) -> Snapshot:
    """The snapshot from the replies to `snapshot_reads` (error replies kept, not raised)."""
    t, h, pttl, due, leased, dead, spec, spec_pttl, held = reply
    due_ms, held_ms = _at(due), _at(held)
    # A job set aside by flow control (lua/lib/flow.lua) is due, in flow:held instead.
    at = held_ms if due_ms is None else due_ms
    hashed = _hash_reply(h)
    t, fields = _with_spec(str(t), hashed, spec, at)
    in_dead = 0 if _at(dead) is None else 1
    ttl = _ttl(pttl, spec_pttl)
    held = due_ms is None and at is not None
    kept = _kept(pttl, spec_pttl)
    spec_only = frozenset(fields) - frozenset(hashed)
    return Snapshot(jid, t, fields, ttl, at, _at(leased), in_dead, held, kept, spec_only)


SPEC_WRONG_TYPE = "spec record of another type"  # a Snapshot.key_type: spec:<id> by hand


def _with_spec(
    t: str, fields: dict[str, str], spec: Any, due_ms: int | None
) -> tuple[str, dict[str, str]]:
    """A job of this version is its spec record (STRING spec:<id>) until its first claim, then
    the spec plus the hash (lua/lib/job.lua): read as the one hash claim sees. A spec key of
    another type (its GET refused) is SPEC_WRONG_TYPE, not a missing spec."""
    if isinstance(spec, ResponseError) and t in ("hash", "none"):
        return SPEC_WRONG_TYPE, fields
    if not isinstance(spec, str) or t not in ("hash", "none"):
        return t, fields
    return "hash", with_spec(fields, spec, due_ms)


# -- repair plans: each one lua/repair.lua move, guarded by where the plan found the job ------
def _repair(
    k: QueueKeys, s: Snapshot, now_ms: int, move: str, *args: str, lease: bool = False
) -> list[Command]:
    """One lua/repair.lua call: `move` on job `s.id`, done only while the id is still in the
    places `s` saw (and, with `lease`, still under the same lease): a job claimed, finished or
    requeued since the check is not moved."""
    keys = k.script_keys()
    lease_until = str(s.lease_until_ms) if lease and s.lease_until_ms is not None else ""
    return [
        (
            "EVALSHA",  # the operator role may run EVALSHA, not EVAL (docs/security.md)
            repair_sha(),
            str(len(keys)),
            *keys,
            move,
            s.id,
            ",".join(s.places),
            lease_until,
            str(now_ms),
            *args,
        )
    ]


def _remove_from(
    k: QueueKeys, s: Snapshot, now_ms: int, places: Iterable[str], state: str = ""
) -> list[Command]:
    # state '' = the hash is gone (the script then checks the job key still does not exist).
    return _repair(k, s, now_ms, "unlist", ",".join(places), state)


def _to_due(
    k: QueueKeys, s: Snapshot, now_ms: int, run_at_ms: int, *, lease: bool = False
) -> list[Command]:
    # lib/job.lua to_due plus the fields claim's reaper writes; wakes idle workers.
    return _repair(k, s, now_ms, "due", str(run_at_ms), lease=lease)


def _to_lease(k: QueueKeys, s: Snapshot, now_ms: int) -> list[Command]:
    # The claim doctor read (its token) leased again for a default lease: its worker renews it.
    until = str(now_ms + DEFAULT_LEASE_MS)
    return _repair(k, s, now_ms, "lease", until, s.fields.get("token", ""))


def _dead_letter(
    k: QueueKeys, s: Snapshot, now_ms: int, reason: str, dead_ms: int, *, lease: bool = False
) -> list[Command]:
    # lib/job.lua's dead_letter: the move claim and fail make, not a copy.
    return _repair(k, s, now_ms, "dead", reason, str(dead_ms), lease=lease)


def _int(v: str | None) -> int | None:
    # The one strict reader of stored numbers, as claim.lua reads them (helper B, issue 10.9).
    return stored_int(v)


# A ZSET score is a double: a hand-written `inf` (or 1e300) is no time in ms. It is kept as an
# out-of-range int (so the id keeps its place) and reported.
MAX_SCORE_MS = 2**53
_OUT_OF_RANGE_MS = 2**63


def _score_ms(score: Any) -> int:
    value = float(score)
    if math.isfinite(value):
        return int(value)
    return _OUT_OF_RANGE_MS if value > 0 else -_OUT_OF_RANGE_MS


def _unreadable(fields: dict[str, str]) -> tuple[str, str] | None:
    """(code, dead reason) when a claim or a worker could not use this job (as claim.lua checks)."""
    # claim reads the spec record when the hash lacks the payload or the state.
    if "spec_unreadable" in fields and not ("payload" in fields and "state" in fields):
        return "invalid-job", "invalid job: record"
    if not fields.get("task"):
        return "invalid-job", "invalid job: task"
    payload = fields.get("payload")
    if payload is None:
        return "bad-payload", "invalid job: payload"
    try:
        json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than it parses
        return "bad-payload", "invalid payload: not JSON"
    if stored_int_in(fields.get("attempts"), "attempts") is None:
        return "invalid-job", "invalid job: attempts"
    if stored_int_in(fields.get("max_attempts"), "max_attempts") is None:
        return "invalid-job", "invalid job: max_attempts"
    if stored_int_in(fields.get("run_at_ms"), "run_at_ms") is None:
        return "invalid-job", "invalid job: run_at_ms"
    return None


def repaired(todo: Issue, reply: Any) -> Issue | None:
    """The finding a lua/repair.lua call fixed, from its reply (1 moved, 0 not moved), or the
    id of the run it armed (it parked a schedule's pending one: `next_run`)."""
    if isinstance(reply, bytes):
        reply = reply.decode(errors="surrogateescape")
    if isinstance(reply, str):
        return replace(todo, next_run=reply)
    return todo if reply == 1 else None
