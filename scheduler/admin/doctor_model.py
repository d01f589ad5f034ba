"""The doctor's vocabulary: findings (`Issue`), what is stored about one job (`Snapshot`), the
check's `Context`, the repair plans (each one lua/repair.lua move: the lib/job.lua moves of the
transitions, done only while the job is where the check found it) and the strict readers of
stored numbers and fields."""

import functools
import hashlib
import json
import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduler.core import scripts
from scheduler.core.codec import RESULT_TTL_MS, stored_int, stored_int_in
from scheduler.core.keys import QueueKeys

DEFAULT_STALE_LEASE_MS = 5 * 60_000
_PAGE = 500
_CONFIRM_BATCH = 100
_WATCH_TRIES = 5
_PLACES = ("due", "leased", "dead")  # preference order when the state field names none of them
Command = tuple[str, ...]


@dataclass(frozen=True)
class Issue:
    """One finding. `repair` holds the commands `--fix` runs in one MULTI (empty when no repair
    is safe); `fix` says what an operator types."""

    code: str
    severity: str  # 'error' | 'warning'
    message: str
    fix: str
    queue: str | None = None
    job_id: str | None = None
    repair: tuple[Command, ...] = ()

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
            "redis_cli": self.redis_cli(),
        }


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
    if not fields.get("task"):
        return "invalid-job", "invalid job: task"
    payload = fields.get("payload")
    if payload is None:
        return "bad-payload", "invalid job: payload"
    try:
        json.loads(payload)
    except ValueError:
        return "bad-payload", "invalid payload: not JSON"
    if stored_int_in(fields.get("attempts"), "attempts") is None:
        return "invalid-job", "invalid job: attempts"
    if stored_int_in(fields.get("max_attempts"), "max_attempts") is None:
        return "invalid-job", "invalid job: max_attempts"
    if stored_int_in(fields.get("run_at_ms"), "run_at_ms") is None:
        return "invalid-job", "invalid job: run_at_ms"
    return None


def _has_undecodable(text: str) -> bool:
    return not text.isascii() and any("\udc80" <= ch <= "\udcff" for ch in text)


def undecodable_fields(fields: dict[str, str]) -> list[str]:
    """Names of the fields whose name or value held bytes that are not UTF-8."""
    return sorted(k for k, v in fields.items() if _has_undecodable(k) or _has_undecodable(v))
