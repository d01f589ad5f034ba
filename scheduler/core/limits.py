"""The valid range of every number and name that crosses the boundary, and the one reader of
stored numbers: arguments are checked against these before anything is sent."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument

DEFAULT_BACKOFF = Backoff()
MAX_PAYLOAD_BYTES = 512 * 1024
IDEMPOTENCY_TTL_MS = 24 * 3_600_000
RESULT_TTL_MS = 3_600_000
# claim's and heartbeat's lease length when none is given: one default, so a manual loop that
# claims and heartbeats without lease_ms keeps one lease length.
DEFAULT_LEASE_MS = 30_000
MAX_PROGRESS_BYTES = 4096  # ctx.set_progress; lua/progress.lua repeats it
# The one task-name and schedule-name rules (schedules/recurring.py uses these too; Lua checks
# the same in lib/util.lua).
TASK_RE = re.compile(r"[A-Za-z0-9_.:/\-]{1,200}")
SCHEDULE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# The valid range (inclusive) of every number that crosses the boundary, in this one place:
# arguments are refused outside it (BadArgument naming the field and the range), and stored
# numbers are read back within it. lua/lib/util.lua's LIM repeats these numbers for the scripts
# (a test checks they agree); docs/limits.md is the same table for people. Every bound stays far
# below 2^53, so a Lua number holds each value exactly.
DAY_MS = 86_400_000
MAX_TIME_MS = 7_258_118_400_000  # 2200-01-01T00:00:00Z
MAX_DELAY_MS = 3650 * DAY_MS
MAX_SAFE_INT = 2**53 - 1
LIMITS: dict[str, tuple[int, int]] = {
    "run_at_ms": (0, MAX_TIME_MS),  # run_at: 1970-01-01 .. 2200-01-01 UTC; past means due now
    "delay_ms": (0, MAX_DELAY_MS),  # delay_ms (+ jitter), fail's delay_ms: up to 3650 days
    "jitter_ms": (0, MAX_DELAY_MS),
    "start_within_ms": (1, MAX_DELAY_MS),  # no attempt starts after run_at + this
    "max_attempts": (1, 1_000_000),
    "attempts": (0, 1_000_000),  # stored only (claim counts it)
    "timeout_ms": (0, 7 * DAY_MS),  # 0 = none of its own (the task's timeout_s, else none)
    "lease_ms": (1, DAY_MS),
    "limit": (0, 1_000),  # jobs per claim
    "reap_limit": (0, 10_000),  # accepted; a claim reaps at most REAP_PER_CALL of them
    "result_ttl_ms": (1, 366 * DAY_MS),
    "record_ttl_ms": (1, 366 * DAY_MS),
    "key_ttl_ms": (1, 366 * DAY_MS),  # how long an idempotency key is held past run_at
    "backoff.base_ms": (0, MAX_DELAY_MS),
    "backoff.cap_ms": (0, MAX_DELAY_MS),
    "every_ms": (1, MAX_DELAY_MS),
    "batch_size": (1, 10_000),  # enqueue_many's; sent as calls of ENQUEUE_PER_CALL at most
    # Queue / AsyncQueue settings (operations/requests.py Settings): checked at construction.
    "max_payload_bytes": (1, 512 * 1024 * 1024),  # Redis's own largest string (proto-max-bulk-len)
    "wait_replicas": (0, 10_000),
    "wait_timeout_ms": (1, DAY_MS),  # WAIT 0 would block the enqueue forever
    "fence": (0, MAX_SAFE_INT - 1),  # stored only
}
# Work bounds of one script call (Redis runs one at a time: every client waits for it). The most
# lapsed leases one claim reaps whatever its reap_limit (lua/claim.lua REAP_STEP; 30-50 us
# each, 10,000 held the server 290-520 ms): the rest go in the next claims. The most jobs of
# one enqueue call (lua/enqueue.lua MAX_BATCH; 15-20 us each, 10,000 held it 150-180 ms): a
# larger batch_size is sent as several calls, and a chain, written in one call, has at most
# this many steps.
REAP_PER_CALL = 500
ENQUEUE_PER_CALL = 1_000
# Each parent a job names is work of that call as well (lib/flow.lua flow_parents + flow_wait:
# reads and links per parent; 1,000 jobs of 100 parents each held it 1.37 s): an enqueue call
# takes at most ENQUEUE_WORK_PER_CALL jobs + parents named (a chain's 1,000 steps, 1,999, are
# one call), and a requeue_dead call reads and links again at most REQUEUE_LINKS_PER_CALL of
# the parents its children list (lua/requeue_dead.lua LINKS_PER_CALL; the rest: next calls).
ENQUEUE_WORK_PER_CALL = 2 * ENQUEUE_PER_CALL
REQUEUE_LINKS_PER_CALL = 1_000
# Bytes bound an enqueue call too (a payload may be 512 KiB; 100 of them were one call of
# 195 ms): enqueue_many, like the asyncio batcher, closes a call before the job that would take
# its fields (UTF-8) past ENQUEUE_BYTES_PER_CALL, unless a later job names one of the call's
# (a chain stays one call whatever its size; one job over it goes alone). A call runs ~4 ms
# per MiB (64 KiB or 512 KiB payloads alike): 1 MiB holds the server ~4 ms, as long as the
# batcher's calls, and a split costs one script prologue (~8 us) per extra call.
ENQUEUE_BYTES_PER_CALL = 1 << 20
# lua/lib/flow.lua, per script: waiting children a parent's end reaches (FLOW_END_STEP; 500
# held it 40-61 ms), a key's lapsed leases checked and its held jobs promoted (FLOW_CK_STEP,
# FLOW_PROMOTE_STEP; 1,000 of each 69-99 ms); jobs one claim sets aside or parks, at most
# min(limit, SET_ASIDE_OF_BATCH) + HOLD_BUDGET (FLOW_ASIDE_BATCH, FLOW_HOLD_BUDGET; a claim of
# 1,000 set aside 1,200), and as many rate-held jobs whose slot has come brought back
# (flow_rate_due; 1,200 before). The rest: the next scripts. Leases per heartbeat /
# complete_many / release call: scheduler/operations/leasing.py SETTLE_CHUNK.
CHILDREN_PER_CALL = 300
KEY_STEP_PER_CALL = 400
SET_ASIDE_OF_BATCH = 100
HOLD_BUDGET = 200
FLOAT_LIMITS: dict[str, tuple[float, float]] = {
    "backoff.factor": (1.0, 1000.0),
    "backoff.jitter": (0.0, 1.0),
}


def s(v: Any) -> str:
    """A reply value as text, whatever the client's decode_responses setting."""
    return v.decode() if isinstance(v, bytes) else str(v)


def _int(value: Any, name: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise BadArgument(f"{name} must be >= {minimum}, got {value}")
    if abs(value) > MAX_SAFE_INT:
        raise BadArgument(f"{name} must be within +-(2**53 - 1), got {value}")
    return value


def check_int(value: Any, name: str, limit: str | None = None) -> int:
    """An integer argument within LIMITS[limit or name], else BadArgument naming both."""
    lo, hi = LIMITS[limit or name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise BadArgument(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def check_lease(job_id: Any, token: Any) -> None:
    """A (job id, token) a worker call sends: both text, else BadArgument (the scripts answer
    a malformed one as a stale or missing lease). Only a type check: it runs per job."""
    if type(job_id) is not str or type(token) is not str:
        raise BadArgument(f"job id and token must be str, got {job_id!r:.140}, {token!r:.80}")
    if not (job_id.isascii() and token.isascii()):  # a lone surrogate cannot be sent at all
        try:
            job_id.encode() + token.encode()
        except UnicodeEncodeError as exc:
            raise BadArgument(f"job id and token must be valid Unicode: {exc.reason}") from None


def lease_pairs(leases: Sequence[tuple[str, str]]) -> list[str]:
    """A list of (job_id, token) pairs as ARGV; a generator (read twice: args, then the reply),
    a str or a bare id is refused."""
    if isinstance(leases, str) or not isinstance(leases, Sequence):
        raise BadArgument(f"leases must be a list of (job_id, token) pairs, got {leases!r:.80}")
    out: list[str] = []
    for pair in leases:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise BadArgument(f"a lease is a (job_id, token) pair, got {pair!r:.80}")
        check_lease(*pair)
        out.extend(pair)
    return out


_INT_TEXT = re.compile(r"-?[0-9]{1,16}")


def stored_int(value: Any, lo: int | None = None, hi: int | None = None) -> int | None:
    """The one reader of stored numbers (job and schedule hashes, script replies): decimal
    digits only, as lua/lib/util.lua parse_int reads them (no '1e3', '0x10', 'inf', ' 7', '7.0'),
    within +-(2**53 - 1) and [lo, hi]; None when the text is anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                return None
        if not isinstance(value, str) or not _INT_TEXT.fullmatch(value):
            return None
        n = int(value)
    if abs(n) > MAX_SAFE_INT or (lo is not None and n < lo) or (hi is not None and n > hi):
        return None
    return n


def stored_int_in(value: Any, name: str) -> int | None:
    """stored_int within LIMITS[name]."""
    lo, hi = LIMITS[name]
    return stored_int(value, lo, hi)


def task_name_hint(task: Any) -> str:
    """What to say of a task name TASK_RE refused: a task handle or another object passed as
    the name gets told what a name is."""
    if isinstance(task, str):
        return "use 1-200 of A-Z a-z 0-9 _ . : / -"
    name = getattr(task, "name", None)
    if hasattr(task, "spec") and isinstance(name, str):  # a TaskHandle
        return (
            f"a task name is a str: enqueue a task handle as handle.enqueue(q, payload) "
            f"(its defaults apply), or by its name {name!r}"
        )
    return f"a task name is a str, not {type(task).__name__}"
