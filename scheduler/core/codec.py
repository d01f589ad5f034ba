"""One builder and one parser per transition, shared by every driver of the operations: only
the I/O differs between them. Every argument is checked here, before anything is sent. The
limits and stored-number reader (limits.py), the backoff text (backoff_text.py), claim's reply
(claim_reply.py) and fail's (fail_reply.py) live next door, their names re-exported here."""

from __future__ import annotations

import functools
import hashlib
import math
import random
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import backoff_text as backoff_text
from scheduler.core.backoff_text import check_backoff as check_backoff
from scheduler.core.backoff_text import stored_backoff as stored_backoff
from scheduler.core.claim_reply import CLAIM_FIELDS as CLAIM_FIELDS
from scheduler.core.claim_reply import claim_args as claim_args
from scheduler.core.claim_reply import parse_claim as parse_claim
from scheduler.core.errors import BadArgument
from scheduler.core.fail_reply import fail_args as fail_args
from scheduler.core.fail_reply import parse_fail as parse_fail
from scheduler.core.flow import check_flow, flow_field
from scheduler.core.ids import MadeId
from scheduler.core.ids import new_job_id as new_job_id
from scheduler.core.json_text import encode_json as encode_json
from scheduler.core.keys import check_new_job_id
from scheduler.core.limits import DEFAULT_BACKOFF as DEFAULT_BACKOFF
from scheduler.core.limits import FLOAT_LIMITS as FLOAT_LIMITS
from scheduler.core.limits import IDEMPOTENCY_TTL_MS as IDEMPOTENCY_TTL_MS
from scheduler.core.limits import LIMITS as LIMITS
from scheduler.core.limits import MAX_DELAY_MS as MAX_DELAY_MS
from scheduler.core.limits import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from scheduler.core.limits import MAX_SAFE_INT as MAX_SAFE_INT
from scheduler.core.limits import MAX_TIME_MS as MAX_TIME_MS
from scheduler.core.limits import RESULT_TTL_MS as RESULT_TTL_MS
from scheduler.core.limits import SCHEDULE_NAME_RE as SCHEDULE_NAME_RE
from scheduler.core.limits import TASK_RE as TASK_RE
from scheduler.core.limits import _int as _int
from scheduler.core.limits import check_int as check_int
from scheduler.core.limits import check_lease as check_lease
from scheduler.core.limits import lease_pairs as lease_pairs
from scheduler.core.limits import s as s
from scheduler.core.limits import stored_int as stored_int
from scheduler.core.limits import stored_int_in as stored_int_in
from scheduler.core.limits import task_name_hint
from scheduler.core.models import Job, JobSpec, QueueCounts, _EncodedResult
from scheduler.core.spec_record import with_spec

ENQUEUE_FIELDS = 13
_IDEM_TTL = str(IDEMPOTENCY_TTL_MS)  # the default key window, written once


def new_nonce() -> str:
    return secrets.token_hex(8)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def ceil_ms(at: datetime) -> int:
    """An aware datetime as epoch ms, rounded up (never before the instant), in integers:
    ceil(at.timestamp() * 1000) in floats is 1 ms late for some whole-ms times after 2038."""
    return -(-((at - _EPOCH) // _US) // 1000)


def epoch_ms(at: datetime) -> int:
    """An aware datetime as epoch ms in 1970..2200 (rounded up), else BadArgument."""
    if not isinstance(at, datetime):
        raise BadArgument(f"run_at must be a datetime, got {at!r}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise BadArgument("run_at must be timezone-aware (a naive datetime is ambiguous)")
    # Rounded up: the server runs a job when its ms clock reaches run_at_ms, which must never
    # be before the instant asked for.
    ms = ceil_ms(at)
    lo, hi = LIMITS["run_at_ms"]
    if not lo <= ms <= hi:
        raise BadArgument(
            f"run_at must be between 1970-01-01 and 2200-01-01 UTC ({lo}..{hi} ms), got {at}"
        )
    return ms


def enqueue_fields(spec: JobSpec, max_payload_bytes: int) -> list[str]:
    """The 13 ARGV fields of one job in lua/enqueue.lua, after checking everything."""
    if not isinstance(spec.task, str) or not TASK_RE.fullmatch(spec.task):
        raise BadArgument(f"invalid task name {spec.task!r}: {task_name_hint(spec.task)}")
    payload = encode_json(spec.payload, "payload", max_payload_bytes)
    job_id = check_new_job_id(spec.job_id) if spec.job_id is not None else new_job_id()
    jitter = check_int(spec.jitter_ms, "jitter_ms")
    offset = random.randint(0, jitter) if jitter else 0
    if spec.run_at is not None and spec.delay_ms is not None:
        raise BadArgument("give run_at or delay_ms, not both")
    if spec.run_at is not None:
        when, time_ms = "at", epoch_ms(spec.run_at) + offset
        # Checked with the whole jitter range, not the drawn offset: one call, one answer.
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
    backoff = _backoff_arg(spec.backoff if spec.backoff is not None else DEFAULT_BACKOFF)
    timeout_ms = check_int(spec.timeout_ms, "timeout_ms")
    idem = ""
    if spec.key is None and (spec.key_ttl_ms is not None or spec.debounce is True):
        raise BadArgument("key_ttl_ms and debounce need a key")
    if spec.key is not None:
        if not isinstance(spec.key, str) or not 1 <= len(spec.key) <= 512:
            raise BadArgument("key must be a string of 1-512 characters")
        try:  # hashed, so any text is safe inside a key name
            idem = hashlib.sha256(spec.key.encode()).hexdigest()
        except UnicodeEncodeError as exc:
            raise BadArgument(f"key is not valid Unicode text: {exc.reason}") from None
    # The plain path (no flow argument given, the common case) skips check_flow's checks.
    if (
        type(spec.priority) is int
        and spec.priority == 0
        and spec.concurrency_key is None
        and spec.concurrency_limit is None
        and spec.rate_limit is None
        and spec.rate_key is None
        and spec.after is None
    ):
        flow = ""
    else:
        flow = flow_field(
            check_flow(
                spec.task,
                priority=spec.priority,
                concurrency_key=spec.concurrency_key,
                concurrency_limit=spec.concurrency_limit,
                rate_limit=spec.rate_limit,
                rate_key=spec.rate_key,
                after=spec.after,
            )
        )
    return [
        job_id,
        spec.task,
        payload,
        when,
        str(time_ms),
        str(max_attempts),
        backoff,
        str(timeout_ms),
        idem,
        _IDEM_TTL if spec.key_ttl_ms is None else str(check_int(spec.key_ttl_ms, "key_ttl_ms")),
        "" if spec.result_ttl_ms is None else str(check_int(spec.result_ttl_ms, "result_ttl_ms")),
        _flags(spec, flow),
        flow,
    ]


def _backoff_arg(b: Any) -> str:
    """A job's backoff, checked and written once per distinct Backoff (most jobs share the
    default; issue 16, single enqueue). Not a Backoff, or a bool where an int belongs (equal,
    for the cache, to 1 / 0): check_backoff refuses it, typed."""
    if not isinstance(b, Backoff) or type(b.base_ms) is bool or type(b.cap_ms) is bool:
        check_backoff(b)
    return _checked_backoff_text(b)


@functools.lru_cache(maxsize=256)
def _checked_backoff_text(b: Backoff) -> str:
    return backoff_text(check_backoff(b))  # frozen and hashable; a refused one is not cached


def _flags(spec: JobSpec, flow: str) -> str:
    """enqueue.lua's flags: 'b' debounce, 'k' keep the payload once done, 'w<ms>' start window."""
    if spec.debounce is False and spec.keep_payload is False and spec.start_within_ms is None:
        return ""  # the common case, first (issue 16: single and bulk enqueue)
    if not isinstance(spec.keep_payload, bool) or not isinstance(spec.debounce, bool):
        raise BadArgument(f"keep_payload and debounce must be True or False, got {spec!r:.200}")
    # A caller's job_id: each call a re-send (a partitioned queue's own ids are fine).
    if spec.debounce and (
        (spec.job_id is not None and not isinstance(spec.job_id, MadeId)) or flow
    ):
        raise BadArgument("debounce takes no job_id and no flow options (priority, ...)")
    flags, window = "b" * spec.debounce + "k" * spec.keep_payload, spec.start_within_ms
    return flags if window is None else f"{flags}w{check_int(window, 'start_within_ms')}"


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


def heartbeat_args(leases: Sequence[tuple[str, str]], lease_ms: int) -> list[str]:
    return [str(check_int(lease_ms, "lease_ms")), *lease_pairs(leases)]


def parse_heartbeat(reply: Any, leases: Sequence[tuple[str, str]]) -> tuple[int, dict[str, str]]:
    lease_until = int(s(reply[0]))
    return lease_until, {job_id: s(st) for (job_id, _), st in zip(leases, reply[1:], strict=True)}


def complete_args(
    items: Sequence[tuple[str, str, Any]], result_ttl_ms: int, max_bytes: int
) -> list[str]:
    args = [str(check_int(result_ttl_ms, "result_ttl_ms"))]
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 3:
            raise BadArgument(f"a completion is (job_id, token, result), got {item!r:.80}")
        job_id, token, result = item
        check_lease(job_id, token)
        # Most handlers return None: no encoder call for it (issue 16, drain); the worker's
        # results come encoded already (_EncodedResult, checked when their handler returned).
        if type(result) is not _EncodedResult:
            result = "null" if result is None else encode_json(result, "result", max_bytes)
        args.extend((job_id, token, result))
    return args


def parse_statuses(reply: Any) -> list[str]:
    return [s(v) for v in reply]


def parse_counts(reply: Any) -> QueueCounts:
    now_ms, oldest = int(s(reply[0])), int(s(reply[5]))
    return QueueCounts(
        now_ms=now_ms,
        due=int(reply[1]),
        scheduled=int(reply[2]),
        leased=int(reply[3]),
        dead=int(reply[4]),
        # The due index's head: a job scheduled later when none is due yet.
        oldest_due_ms=None if oldest < 0 or oldest > now_ms else oldest,
        lapsed=int(reply[6]),
        held_key_limit=int(reply[7]),
        held_rate_window=int(reply[8]),
        held_waiting=int(reply[9]),
        paused_ms=None if int(s(reply[10])) < 0 else int(s(reply[10])),
        moving=int(reply[11]),
    )


def score_ms(score: Any) -> int:
    """A ZSET score as ms, clamped as claim.lua clamps one: a hand-written inf is no time."""
    x = float(score)
    if math.isnan(x) or x < 0:
        return 0
    return int(min(x, MAX_TIME_MS))


def parse_job(
    job_id: str, raw: Any, lease_score: Any, spec: Any = None, due_score: Any = None
) -> Job | None:
    """A job from its hash and its spec record (lua/lib/job.lua), either of which may be
    missing: a job never claimed is its spec alone, waiting in due (run_at = its due score); a
    job of an older version (or a schedule occurrence) is its hash alone."""
    fields = {s(k): s(v) for k, v in raw.items()} if raw else {}
    if spec is not None:
        fields = with_spec(fields, s(spec), None if due_score is None else score_ms(due_score))
    if not fields:
        return None
    return Job(
        id=job_id,
        state=fields.get("state", "?"),
        task=fields.get("task", ""),
        payload_json=fields.get("payload", ""),
        fields=fields,
        lease_until_ms=None if lease_score is None else score_ms(lease_score),
    )
