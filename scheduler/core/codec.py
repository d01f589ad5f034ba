"""One builder and one parser per transition, shared by the sync and asyncio clients: only the
I/O differs between them. Every argument is checked here, before anything is sent."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import random
import re
import secrets
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, InvalidPayload, SchedulerError, raise_for_status
from scheduler.core.keys import check_job_id
from scheduler.core.models import ClaimBatch, ClaimedJob, FailOutcome, Job, JobSpec, QueueCounts

DEFAULT_BACKOFF = Backoff()
MAX_PAYLOAD_BYTES = 512 * 1024
IDEMPOTENCY_TTL_MS = 24 * 3_600_000
RESULT_TTL_MS = 3_600_000
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
    "max_attempts": (1, 1_000_000),
    "attempts": (0, 1_000_000),  # stored only (claim counts it)
    "timeout_ms": (0, 7 * DAY_MS),  # 0 = no timeout
    "lease_ms": (1, DAY_MS),
    "limit": (0, 1_000),  # jobs per claim
    "reap_limit": (0, 10_000),
    "result_ttl_ms": (1, 366 * DAY_MS),
    "record_ttl_ms": (1, 366 * DAY_MS),
    "idem_ttl_ms": (1, 366 * DAY_MS),
    "backoff.base_ms": (0, MAX_DELAY_MS),
    "backoff.cap_ms": (0, MAX_DELAY_MS),
    "every_ms": (1, MAX_DELAY_MS),
    "batch_size": (1, 10_000),  # jobs per enqueue script call
    "fence": (0, MAX_SAFE_INT - 1),  # stored only
}
FLOAT_LIMITS: dict[str, tuple[float, float]] = {
    "backoff.factor": (1.0, 1000.0),
    "backoff.jitter": (0.0, 1.0),
}
_MAX_MESSAGE = 2_000
_MAX_TRACEBACK = 8_000
ENQUEUE_FIELDS = 10
CLAIM_FIELDS = 10


def s(v: Any) -> str:
    """A reply value as text, whatever the client's decode_responses setting."""
    return v.decode() if isinstance(v, bytes) else str(v)


_id_seq = itertools.count()


def new_job_id() -> str:
    """Sortable and unique: creation ms, a per-process sequence (jobs due at the same ms are
    claimed in enqueue order, since the due set orders ties by id) and 48 random bits. Made by
    the client, so a re-sent enqueue names the same job and cannot create a second one."""
    seq = next(_id_seq) & 0xFFFFFF
    return f"{time.time_ns() // 1_000_000:012x}{seq:06x}{secrets.token_hex(6)}"


def new_nonce() -> str:
    return secrets.token_hex(8)


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


# One encoder for every call: json.dumps with options builds a new one each time (slow).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def encode_json(value: Any, what: str, limit: int) -> str:
    try:
        text = _JSON.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested too deeply to encode") from None
    if not text.isascii():
        # A lone surrogate ('\ud800') is a str but not UTF-8: refuse it here, typed.
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise InvalidPayload(f"{what} is not valid Unicode text: {exc.reason}") from None
    else:
        size = len(text)
    if size > limit:
        raise InvalidPayload(f"{what} is {size} bytes, over the {limit} limit")
    return text


def _utf8(text: str) -> str:
    """Text a handler produced (error messages), made UTF-8-safe instead of refused."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def _epoch_ms(at: datetime) -> int:
    if not isinstance(at, datetime):
        raise BadArgument(f"run_at must be a datetime, got {at!r}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise BadArgument("run_at must be timezone-aware (a naive datetime is ambiguous)")
    # Rounded up: the server runs a job when its ms clock reaches run_at_ms, which must never
    # be before the instant asked for.
    ms = math.ceil(at.timestamp() * 1000)
    lo, hi = LIMITS["run_at_ms"]
    if not lo <= ms <= hi:
        raise BadArgument(
            f"run_at must be between 1970-01-01 and 2200-01-01 UTC ({lo}..{hi} ms), got {at}"
        )
    return ms


def enqueue_fields(spec: JobSpec, max_payload_bytes: int) -> list[str]:
    """The 13 ARGV fields of one job in lua/enqueue.lua, after checking everything."""
    if not isinstance(spec.task, str) or not TASK_RE.fullmatch(spec.task):
        raise BadArgument(f"invalid task name {spec.task!r}: use 1-200 of A-Z a-z 0-9 _ . : / -")
    payload = encode_json(spec.payload, "payload", max_payload_bytes)
    job_id = check_job_id(spec.job_id) if spec.job_id is not None else new_job_id()
    jitter = check_int(spec.jitter_ms, "jitter_ms")
    offset = random.randint(0, jitter) if jitter else 0
    if spec.run_at is not None and spec.delay_ms is not None:
        raise BadArgument("give run_at or delay_ms, not both")
    if spec.run_at is not None:
        when, time_ms = "at", _epoch_ms(spec.run_at) + offset
        # Checked with the whole jitter range, not the drawn offset: the same call always
        # gets the same answer.
        if time_ms - offset + jitter > MAX_TIME_MS:
            raise BadArgument(
                f"run_at + jitter_ms must be before 2200-01-01 UTC ({MAX_TIME_MS} ms)"
            )
    else:
        delay = 0 if spec.delay_ms is None else check_int(spec.delay_ms, "delay_ms")
        when, time_ms = "in", delay + offset
        if delay + jitter > MAX_DELAY_MS:
            raise BadArgument(
                f"delay_ms + jitter_ms must be <= {MAX_DELAY_MS}, got {delay + jitter}"
            )
    max_attempts = check_int(spec.max_attempts, "max_attempts")
    backoff = spec.backoff if spec.backoff is not None else DEFAULT_BACKOFF
    check_backoff(backoff)
    timeout_ms = check_int(spec.timeout_ms, "timeout_ms")
    idem = ""
    if spec.key is not None:
        if not isinstance(spec.key, str) or not 1 <= len(spec.key) <= 512:
            raise BadArgument("key must be a string of 1-512 characters")
        # Hashed, so any text is safe inside a key name.
        try:
            idem = hashlib.sha256(spec.key.encode()).hexdigest()
        except UnicodeEncodeError as exc:
            raise BadArgument(f"key is not valid Unicode text: {exc.reason}") from None
    return [
        job_id, spec.task, payload, when, str(time_ms), str(max_attempts), _backoff_arg(backoff),
        str(timeout_ms), idem, _IDEM_TTL,
    ]  # fmt: skip


_IDEM_TTL = str(IDEMPOTENCY_TTL_MS)


def check_backoff(b: Any) -> Backoff:
    """A Backoff whose every field is within LIMITS / FLOAT_LIMITS (Backoff itself checks only
    the lower bounds and types)."""
    if not isinstance(b, Backoff):
        raise BadArgument(f"backoff must be a Backoff, got {b!r}")
    check_int(b.base_ms, "backoff base_ms", "backoff.base_ms")
    check_int(b.cap_ms, "backoff cap_ms", "backoff.cap_ms")
    for name, v in (("factor", b.factor), ("jitter", b.jitter)):
        lo, hi = FLOAT_LIMITS["backoff." + name]
        if not lo <= v <= hi:
            raise BadArgument(f"backoff {name} must be in [{lo}, {hi}], got {v!r}")
    return b


@functools.lru_cache(maxsize=256)
def _backoff_arg(b: Backoff) -> str:
    """'base_ms,factor,cap_ms,jitter': stored as it is in the job hash's `backoff` field."""
    return f"{b.base_ms},{float(b.factor)!r},{b.cap_ms},{float(b.jitter)!r}"


def enqueue_args(specs: Sequence[JobSpec], max_payload_bytes: int) -> list[str]:
    check_int(len(specs), "jobs per script call", "batch_size")
    args = [str(len(specs))]
    for spec in specs:
        if not isinstance(spec, JobSpec):
            raise BadArgument(f"expected JobSpec, got {spec!r}")
        args.extend(enqueue_fields(spec, max_payload_bytes))
    return args


def parse_enqueue(reply: Any, args: list[str]) -> list[str]:
    """enqueue.lua answers {flags, (index, id) pairs}: the ids are the ones sent, except where
    an idempotency key named an earlier job."""
    ids = [args[1 + i * ENQUEUE_FIELDS] for i in range(int(args[0]))]
    subst = reply[1:]
    for k in range(0, len(subst), 2):
        ids[int(subst[k]) - 1] = s(subst[k + 1])
    return ids


def claim_args(worker_id: str, limit: int, lease_ms: int, nonce: str, reap_limit: int) -> list[str]:
    if not isinstance(worker_id, str) or not 1 <= len(worker_id) <= 200:
        raise BadArgument("worker_id must be a string of 1-200 characters")
    if not worker_id.isascii():
        try:
            worker_id.encode()
        except UnicodeEncodeError as exc:
            raise BadArgument(f"worker_id is not valid Unicode text: {exc.reason}") from None
    check_int(limit, "limit")
    check_int(lease_ms, "lease_ms")
    check_int(reap_limit, "reap_limit")
    return [worker_id, str(limit), str(lease_ms), nonce, str(reap_limit)]


class _Unreadable(ValueError):
    """One claimed job's field the client cannot use (its name is the message)."""


_TOKEN_RE = re.compile(r"[0-9]{1,16}-[0-9A-Za-z]{1,64}")
_FLOAT_TEXT = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


def _text(v: Any, name: str) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            raise _Unreadable(f"{name}: not UTF-8") from None
    return str(v)


def _field_int(v: Any, name: str) -> int:
    n = stored_int_in(v, name)
    if n is None:
        raise _Unreadable(name)
    return n


def _claimed_job(raw: Sequence[Any], now_ms: int) -> ClaimedJob:
    if len(raw) != CLAIM_FIELDS:
        raise _Unreadable("reply cut short")
    job_id, token = _text(raw[0], "id"), _text(raw[1], "token")
    task, payload = _text(raw[4], "task"), _text(raw[5], "payload")
    schedule = _text(raw[9], "schedule")
    if not _TOKEN_RE.fullmatch(token):
        raise _Unreadable("token")
    if not TASK_RE.fullmatch(task):
        raise _Unreadable("task")
    if schedule and not SCHEDULE_NAME_RE.fullmatch(schedule):
        raise _Unreadable("schedule")
    backoff = parse_stored_backoff(_text(raw[7], "backoff"))
    if backoff is None:
        raise _Unreadable("backoff")
    attempts = _field_int(raw[2], "attempts")
    max_attempts = _field_int(raw[3], "max_attempts")
    return ClaimedJob(
        id=job_id, token=token, attempts=attempts, max_attempts=max_attempts, task=task,
        payload_json=payload, run_at_ms=_field_int(raw[6], "run_at_ms"), claimed_ms=now_ms,
        backoff=backoff, timeout_ms=_field_int(raw[8], "timeout_ms"), schedule=schedule,
    )  # fmt: skip


def _lossy(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def parse_claim(reply: Any) -> ClaimBatch:
    """claim.lua checks every field it hands out; this checks them again, so that one job a
    client cannot read (another server version, a hand edit between check and reply) lands in
    `unreadable` as (id, token, reason) and never stops the rest of the batch from parsing."""
    now_ms, next_ms, n = int(s(reply[0])), int(s(reply[1])), int(reply[2])
    jobs: list[ClaimedJob] = []
    unreadable: list[tuple[str, str, str]] = []
    base = 3
    for _ in range(n):
        raw = reply[base : base + CLAIM_FIELDS]
        base += CLAIM_FIELDS
        try:
            jobs.append(_claimed_job(raw, now_ms))
        except (ValueError, TypeError, BadArgument) as exc:
            reason = (
                f"invalid job: {exc}" if isinstance(exc, _Unreadable) else f"invalid job: {exc!r}"
            )
            unreadable.append(
                (_lossy(raw[0]) if raw else "", _lossy(raw[1]) if len(raw) > 1 else "", reason)
            )
    return ClaimBatch(now_ms=now_ms, next_ms=next_ms, jobs=jobs, unreadable=unreadable)


def parse_stored_backoff(text: str) -> Backoff | None:
    """The job hash's 'base_ms,factor,cap_ms,jitter' (as enqueue.lua stores it), read as strictly
    as lua/lib/util.lua parse_backoff; '' is the default; None when unreadable."""
    if text == "":
        return DEFAULT_BACKOFF
    parts = text.split(",")
    if len(parts) != 4:
        return None
    base, cap = (
        stored_int_in(parts[0], "backoff.base_ms"),
        stored_int_in(parts[2], "backoff.cap_ms"),
    )
    floats = []
    for name, part in (("factor", parts[1]), ("jitter", parts[3])):
        lo, hi = FLOAT_LIMITS["backoff." + name]
        if len(part) > 32 or not _FLOAT_TEXT.fullmatch(part):
            return None
        x = float(part)
        if not lo <= x <= hi:
            return None
        floats.append(x)
    if base is None or cap is None:
        return None
    return Backoff(base, floats[0], cap, floats[1])


def stored_backoff(text: str) -> Backoff:
    """parse_stored_backoff, with the default for an unreadable value."""
    b = parse_stored_backoff(text)
    return DEFAULT_BACKOFF if b is None else b


def lease_pairs(leases: Sequence[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for job_id, token in leases:
        out.extend((job_id, token))
    return out


def heartbeat_args(leases: Sequence[tuple[str, str]], lease_ms: int) -> list[str]:
    return [str(check_int(lease_ms, "lease_ms")), *lease_pairs(leases)]


def parse_heartbeat(reply: Any, leases: Sequence[tuple[str, str]]) -> tuple[int, dict[str, str]]:
    lease_until = int(s(reply[0]))
    return lease_until, {job_id: s(st) for (job_id, _), st in zip(leases, reply[1:], strict=True)}


def complete_args(
    items: Sequence[tuple[str, str, Any]], result_ttl_ms: int, max_bytes: int
) -> list[str]:
    args = [str(check_int(result_ttl_ms, "result_ttl_ms"))]
    for job_id, token, result in items:
        args.extend((job_id, token, encode_json(result, "result", max_bytes)))
    return args


def parse_statuses(reply: Any) -> list[str]:
    return [s(v) for v in reply]


def fail_args(
    job_id: str,
    token: str,
    error: BaseException | tuple[str, str, str],
    *,
    retryable: bool,
    delay_ms: int | None,
) -> list[str]:
    if isinstance(error, BaseException):
        import traceback

        etype, message = type(error).__name__, str(error)
        tb = "".join(traceback.format_exception(error))
    else:
        etype, message, tb = error
    delay = "" if delay_ms is None else str(check_int(delay_ms, "delay_ms"))
    return [
        job_id, token, "1" if retryable else "0", _utf8(etype[:200]), _utf8(message[:_MAX_MESSAGE]),
        _utf8(tb[-_MAX_TRACEBACK:]), repr(random.random()), delay,
    ]  # fmt: skip


def parse_fail(reply: Any, job_id: str, token: str) -> FailOutcome:
    status, detail = s(reply[0]), s(reply[1])
    raise_for_status(status, job_id, token)
    if status == "retry":
        run_at_ms = stored_int_in(detail, "run_at_ms")
        if run_at_ms is None:
            raise SchedulerError(f"fail answered an unreadable run_at_ms {detail!r}")
        return FailOutcome("retry", run_at_ms=run_at_ms)
    return FailOutcome("dead", dead_reason=detail)


def parse_counts(reply: Any) -> QueueCounts:
    oldest = int(s(reply[5]))
    return QueueCounts(
        now_ms=int(s(reply[0])), due=int(reply[1]), scheduled=int(reply[2]),
        leased=int(reply[3]), dead=int(reply[4]), oldest_due_ms=None if oldest < 0 else oldest,
        lapsed=int(reply[6]),
    )  # fmt: skip


def _score_ms(score: Any) -> int:
    """A ZSET score as ms, clamped as claim.lua clamps one: a hand-written inf is no time."""
    x = float(score)
    if math.isnan(x) or x < 0:
        return 0
    return int(min(x, MAX_TIME_MS))


def parse_job(job_id: str, raw: Any, lease_score: Any) -> Job | None:
    if not raw:
        return None
    fields = {s(k): s(v) for k, v in raw.items()}
    return Job(
        id=job_id,
        state=fields.get("state", "?"),
        task=fields.get("task", ""),
        payload_json=fields.get("payload", ""),
        fields=fields,
        lease_until_ms=None if lease_score is None else _score_ms(lease_score),
    )
