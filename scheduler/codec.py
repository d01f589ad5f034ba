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

from scheduler.backoff import Backoff
from scheduler.errors import BadArgument, InvalidPayload, raise_for_status
from scheduler.keys import check_job_id
from scheduler.models import ClaimBatch, ClaimedJob, FailOutcome, Job, JobSpec, QueueCounts

DEFAULT_BACKOFF = Backoff()
MAX_PAYLOAD_BYTES = 512 * 1024
IDEMPOTENCY_TTL_MS = 24 * 3_600_000
RESULT_TTL_MS = 3_600_000
_TASK_RE = re.compile(r"^[A-Za-z0-9_.:/\-]{1,200}$")
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
    return value


# One encoder for every call: json.dumps with options builds a new one each time (slow).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def encode_json(value: Any, what: str, limit: int) -> str:
    try:
        text = _JSON.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    # len(text) <= bytes <= 4 * len(text): encode only when the size is in doubt.
    if len(text) * 4 > limit and len(text.encode()) > limit:
        raise InvalidPayload(f"{what} is {len(text.encode())} bytes, over the {limit} limit")
    return text


def _epoch_ms(at: datetime) -> int:
    if not isinstance(at, datetime):
        raise BadArgument(f"run_at must be a datetime, got {at!r}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise BadArgument("run_at must be timezone-aware (a naive datetime is ambiguous)")
    # Rounded up: the server runs a job when its ms clock reaches run_at_ms, which must never
    # be before the instant asked for.
    return math.ceil(at.timestamp() * 1000)


def enqueue_fields(spec: JobSpec, max_payload_bytes: int) -> list[str]:
    """The 13 ARGV fields of one job in lua/enqueue.lua, after checking everything."""
    if not isinstance(spec.task, str) or not _TASK_RE.match(spec.task):
        raise BadArgument(f"invalid task name {spec.task!r}: use 1-200 of A-Z a-z 0-9 _ . : / -")
    payload = encode_json(spec.payload, "payload", max_payload_bytes)
    job_id = check_job_id(spec.job_id) if spec.job_id is not None else new_job_id()
    jitter = _int(spec.jitter_ms, "jitter_ms", minimum=0)
    offset = random.randint(0, jitter) if jitter else 0
    if spec.run_at is not None and spec.delay_ms is not None:
        raise BadArgument("give run_at or delay_ms, not both")
    if spec.run_at is not None:
        when, time_ms = "at", _epoch_ms(spec.run_at) + offset
    else:
        delay = 0 if spec.delay_ms is None else _int(spec.delay_ms, "delay_ms", minimum=0)
        when, time_ms = "in", delay + offset
    max_attempts = _int(spec.max_attempts, "max_attempts", minimum=1)
    backoff = spec.backoff if spec.backoff is not None else DEFAULT_BACKOFF
    if not isinstance(backoff, Backoff):
        raise BadArgument(f"backoff must be a Backoff, got {backoff!r}")
    timeout_ms = _int(spec.timeout_ms, "timeout_ms", minimum=0)
    idem = ""
    if spec.key is not None:
        if not isinstance(spec.key, str) or not 1 <= len(spec.key) <= 512:
            raise BadArgument("key must be a string of 1-512 characters")
        # Hashed, so any text is safe inside a key name.
        idem = hashlib.sha256(spec.key.encode()).hexdigest()
    return [
        job_id, spec.task, payload, when, str(time_ms), str(max_attempts), _backoff_arg(backoff),
        str(timeout_ms), idem, _IDEM_TTL,
    ]  # fmt: skip


_IDEM_TTL = str(IDEMPOTENCY_TTL_MS)


@functools.lru_cache(maxsize=256)
def _backoff_arg(b: Backoff) -> str:
    """'base_ms,factor,cap_ms,jitter': stored as it is in the job hash's `backoff` field."""
    return f"{b.base_ms},{float(b.factor)!r},{b.cap_ms},{float(b.jitter)!r}"


def enqueue_args(specs: Sequence[JobSpec], max_payload_bytes: int) -> list[str]:
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
    if not isinstance(worker_id, str) or not worker_id:
        raise BadArgument("worker_id must be a non-empty string")
    _int(limit, "limit", minimum=0)
    if limit > 1000:
        raise BadArgument(f"limit must be <= 1000, got {limit}")
    _int(lease_ms, "lease_ms", minimum=1)
    return [worker_id, str(limit), str(lease_ms), nonce, str(reap_limit)]


def parse_claim(reply: Any) -> ClaimBatch:
    now_ms, next_ms, n = int(s(reply[0])), int(s(reply[1])), int(reply[2])
    jobs = []
    base = 3
    for _ in range(n):
        f = [s(v) for v in reply[base : base + CLAIM_FIELDS]]
        base += CLAIM_FIELDS
        jobs.append(
            ClaimedJob(
                id=f[0],
                token=f[1],
                attempts=int(f[2]),
                max_attempts=int(f[3]),
                task=f[4],
                payload_json=f[5],
                run_at_ms=int(float(f[6])),
                claimed_ms=now_ms,
                backoff=stored_backoff(f[7]),
                timeout_ms=int(float(f[8])),
                schedule=f[9],
            )
        )
    return ClaimBatch(now_ms=now_ms, next_ms=next_ms, jobs=jobs)


def stored_backoff(text: str) -> Backoff:
    """The job hash's 'base_ms,factor,cap_ms,jitter' (as enqueue.lua stores it)."""
    try:
        base, factor, cap, jitter = text.split(",")
        return Backoff(int(float(base)), float(factor), int(float(cap)), float(jitter))
    except (ValueError, BadArgument):
        return DEFAULT_BACKOFF


def lease_pairs(leases: Sequence[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for job_id, token in leases:
        out.extend((job_id, token))
    return out


def heartbeat_args(leases: Sequence[tuple[str, str]], lease_ms: int) -> list[str]:
    return [str(_int(lease_ms, "lease_ms", minimum=1)), *lease_pairs(leases)]


def parse_heartbeat(reply: Any, leases: Sequence[tuple[str, str]]) -> tuple[int, dict[str, str]]:
    lease_until = int(s(reply[0]))
    return lease_until, {job_id: s(st) for (job_id, _), st in zip(leases, reply[1:], strict=True)}


def complete_args(
    items: Sequence[tuple[str, str, Any]], result_ttl_ms: int, max_bytes: int
) -> list[str]:
    args = [str(_int(result_ttl_ms, "result_ttl_ms", minimum=1))]
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
    delay = "" if delay_ms is None else str(_int(delay_ms, "delay_ms", minimum=0))
    return [
        job_id, token, "1" if retryable else "0", etype[:200], message[:_MAX_MESSAGE],
        tb[-_MAX_TRACEBACK:], repr(random.random()), delay,
    ]  # fmt: skip


def parse_fail(reply: Any, job_id: str, token: str) -> FailOutcome:
    status, detail = s(reply[0]), s(reply[1])
    raise_for_status(status, job_id, token)
    if status == "retry":
        return FailOutcome("retry", run_at_ms=int(detail))
    return FailOutcome("dead", dead_reason=detail)


def parse_counts(reply: Any) -> QueueCounts:
    oldest = int(s(reply[5]))
    return QueueCounts(
        now_ms=int(s(reply[0])), due_now=int(reply[1]), scheduled=int(reply[2]),
        leased=int(reply[3]), dead=int(reply[4]), oldest_due_ms=None if oldest < 0 else oldest,
        lapsed=int(reply[6]),
    )  # fmt: skip


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
        lease_until_ms=int(lease_score) if lease_score is not None else None,
    )
