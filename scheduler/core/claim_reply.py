"""claim.lua's arguments and reply: the claimed jobs, each field checked again client-side."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from scheduler.core.backoff import Backoff
from scheduler.core.backoff_text import parse_stored_backoff
from scheduler.core.errors import BadArgument
from scheduler.core.keys import check_job_id
from scheduler.core.limits import (
    LIMITS,
    SCHEDULE_NAME_RE,
    TASK_RE,
    check_int,
    s,
    stored_int_in,
)
from scheduler.core.models import ClaimBatch, ClaimedJob

CLAIM_FIELDS = 11  # per job in claim.lua's reply (lua/lib/job.lua pack_job)
_NONCE_RE = re.compile(r"[0-9A-Za-z]{1,64}")


def check_worker_id(worker_id: object) -> str:
    """A worker id as claim.lua takes it (valid Unicode, 1-200 bytes of UTF-8: the script
    counts bytes), else BadArgument."""
    if not isinstance(worker_id, str) or not 1 <= len(worker_id) <= 200:
        raise BadArgument(f"worker_id must be a string of 1-200 bytes, got {worker_id!r:.80}")
    if not worker_id.isascii():
        try:
            size = len(worker_id.encode())
        except UnicodeEncodeError as exc:
            raise BadArgument(f"worker_id is not valid Unicode text: {exc.reason}") from None
        if size > 200:
            raise BadArgument(f"worker_id must be 1-200 bytes of UTF-8, got {size}")
    return worker_id


def claim_args(
    worker_id: str,
    limit: int,
    lease_ms: int,
    nonce: str,
    reap_limit: int,
    holding: int | None = None,
    drained_for: str | None = None,
) -> list[str]:
    check_worker_id(worker_id)
    # A re-sent claim's replay key (claim:<nonce>): claim.lua takes 1-64 ASCII letters/digits.
    if not isinstance(nonce, str) or not _NONCE_RE.fullmatch(nonce):
        raise BadArgument(f"nonce must be 1-64 ASCII letters and digits, got {nonce!r:.80}")
    check_int(limit, "limit")
    check_int(lease_ms, "lease_ms")
    check_int(reap_limit, "reap_limit")
    args = [worker_id, str(limit), str(lease_ms), nonce, str(reap_limit)]
    # What the worker holds (a last-attempt suspect runs alone, claim.lua), and the suspect it
    # drained for: sent only when said, so an older script's argument count is unchanged.
    if holding is not None:
        args.append(str(check_int(holding, "holding", "limit")))  # only 0 or not matters
        if drained_for is not None:
            args.append(check_job_id(drained_for))
    elif drained_for is not None:
        raise BadArgument("drained_for needs holding")
    return args


class _Unreadable(ValueError):
    """One claimed job's field the client cannot use (its name is the message)."""


_TOKEN_RE = re.compile(r"[0-9]{1,16}-[0-9A-Za-z]{1,64}")


def _text(v: Any, name: str) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            raise _Unreadable(f"{name}: not UTF-8") from None
    return str(v)


def _field_int(v: Any, name: str) -> int:
    # Fast path for the usual reply value, plain ASCII digits: the same answer as stored_int
    # (every bound used here is within 2**53), without its regex (issue 16: claim parse).
    if type(v) is str and 0 < len(v) <= 16 and v.isascii() and v.isdigit():
        lo, hi = LIMITS[name]
        n = int(v)
        if lo <= n <= hi:
            return n
        raise _Unreadable(name)
    m = stored_int_in(v, name)
    if m is None:
        raise _Unreadable(name)
    return m


# Task names already checked by TASK_RE in this process (a batch mostly repeats one or two).
_TASKS_OK: set[str] = set()
_TASKS_OK_MAX = 1024


def _task_ok(task: str) -> bool:
    if task in _TASKS_OK:
        return True
    if not TASK_RE.fullmatch(task):
        return False
    if len(_TASKS_OK) < _TASKS_OK_MAX:
        _TASKS_OK.add(task)
    return True


def claimed_job_of(
    id: str,
    token: str,
    attempts: int,
    max_attempts: int,
    task: str,
    payload_json: str,
    run_at_ms: int,
    claimed_ms: int,
    backoff: Backoff,
    timeout_ms: int,
    schedule: str,
    start_by_ms: int | None = None,
) -> ClaimedJob:
    """The same object as ClaimedJob(...) (equal, same hash, still frozen), built without the
    frozen __init__'s twelve object.__setattr__ calls: ~1.3 of its ~1.7 us, once per claimed job
    (issue 16). tests/test_worker_hot_path.py catches a field added to ClaimedJob but not here."""
    job = object.__new__(ClaimedJob)
    d = job.__dict__
    d["id"] = id
    d["token"] = token
    d["attempts"] = attempts
    d["max_attempts"] = max_attempts
    d["task"] = task
    d["payload_json"] = payload_json
    d["run_at_ms"] = run_at_ms
    d["claimed_ms"] = claimed_ms
    d["backoff"] = backoff
    d["timeout_ms"] = timeout_ms
    d["schedule"] = schedule
    d["start_by_ms"] = start_by_ms
    return job


def _claimed_job(raw: Sequence[Any], now_ms: int) -> ClaimedJob:
    if len(raw) != CLAIM_FIELDS:
        raise _Unreadable("reply cut short")
    job_id, token, task, payload, schedule, backoff_raw = (
        raw[0],
        raw[1],
        raw[4],
        raw[5],
        raw[9],
        raw[7],
    )
    # decode_responses=True gives str; anything else goes through _text's checks.
    if type(job_id) is not str:
        job_id = _text(job_id, "id")
    if type(token) is not str:
        token = _text(token, "token")
    if type(task) is not str:
        task = _text(task, "task")
    if type(payload) is not str:
        payload = _text(payload, "payload")
    if type(schedule) is not str:
        schedule = _text(schedule, "schedule")
    if type(backoff_raw) is not str:
        backoff_raw = _text(backoff_raw, "backoff")
    if not _TOKEN_RE.fullmatch(token):
        raise _Unreadable("token")
    if not _task_ok(task):
        raise _Unreadable("task")
    if schedule and not SCHEDULE_NAME_RE.fullmatch(schedule):
        raise _Unreadable("schedule")
    backoff = parse_stored_backoff(backoff_raw)
    if backoff is None:
        raise _Unreadable("backoff")
    return claimed_job_of(
        job_id,
        token,
        _field_int(raw[2], "attempts"),
        _field_int(raw[3], "max_attempts"),
        task,
        payload,
        _field_int(raw[6], "run_at_ms"),
        now_ms,
        backoff,
        _field_int(raw[8], "timeout_ms"),
        schedule,
        None if raw[10] in ("", b"") else _field_int(raw[10], "run_at_ms"),
    )


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
    # After the jobs: the schedules' refill flag (cron_slots.refill_requested), then the
    # suspect leased by this call ('' for none when a drain follows), then the drain.
    suspect = _lossy(reply[base + 1]) if len(reply) > base + 1 else None
    drain = _lossy(reply[base + 2]) if len(reply) > base + 2 else None
    return ClaimBatch(now_ms, next_ms, jobs, unreadable, suspect or None, drain)
