"""A job's spec record (STRING spec:<id>, written once at enqueue by lua/lib/job.lua) read into
the fields its hash would hold, and merged with the hash the way claim.lua reads a job."""

from __future__ import annotations

import re

from scheduler.core.limits import MAX_TIME_MS

# A job's spec record (lua/lib/job.lua: `2|task|max_attempts|backoff|timeout_ms|enqueued_ms|
# result_ttl_ms|flags|payload`, empty = default; flags: 'k' keep the payload, then 'd<ms>' the
# start deadline) read into the fields its hash would hold.
# 'k' keeps the payload, 'd<ms>' the start deadline; any other text (a hand edit) is neither.
_FLAGS = re.compile(r"(k?)(?:d([0-9]+))?")
_SPEC_DEFAULTS = ("", "5", "1000,2.0,3600000,0.25", "0", "", "")
_SPEC_NAMES = ("task", "max_attempts", "backoff", "timeout_ms", "enqueued_ms", "result_ttl_ms")
# A record's head: every field before the payload, through the '|' that ends them, as
# lua/lib/job.lua job_spec(..., head) reads it, from the record's first HEAD_BYTES.
HEAD_BYTES = 1024
_HEAD = re.compile(r"2(?:\|[^|]*){7}\|")
_HEAD_RAW = re.compile(rb"2(?:\|[^|]*){7}\|")


def spec_head(raw: str | bytes) -> str | None:
    """The head in a record's first HEAD_BYTES (GETRANGE's reply, bytes or text), None when it
    is not all there (no record, a field edited to be long, another layout): the whole record
    says how the job reads then. Bytes are decoded up to the head only: the cut may fall
    inside one of the payload's characters."""
    if isinstance(raw, str):
        found = _HEAD.match(raw)
        return found[0] if found else None
    found_raw = _HEAD_RAW.match(raw)
    try:
        return found_raw[0].decode() if found_raw else None
    except UnicodeDecodeError:  # as the whole record's text reads (codec.s)
        return None


def spec_fields(text: str, run_at_ms: str | None) -> dict[str, str] | None:
    """The fields of a spec record, or None when it is not one (edited by hand)."""
    parts = text.split("|", 8)
    if len(parts) != 9 or parts[0] != "2":
        return None
    fields = {n: v or d for n, v, d in zip(_SPEC_NAMES, parts[1:7], _SPEC_DEFAULTS, strict=True)}
    if not fields["result_ttl_ms"]:
        del fields["result_ttl_ms"]
    if not fields["enqueued_ms"] and run_at_ms is not None:
        fields["enqueued_ms"] = run_at_ms
    flags = _FLAGS.fullmatch(parts[7])  # as lua/lib/job.lua spec_flags reads it
    if flags and flags[1] == "k":
        fields["keep_payload"] = "1"
    if flags and flags[2] and int(flags[2]) <= MAX_TIME_MS:  # the start deadline
        fields["start_by_ms"] = flags[2]
    fields["payload"] = parts[8]
    return fields


def with_spec(fields: dict[str, str], spec: str, due_ms: int | None) -> dict[str, str]:
    """A job's hash fields completed from its spec record, as claim.lua reads them: the hash
    wins; a job never claimed (no hash) waiting in due is `due` with run_at = its due score and
    0 attempts. An unreadable record is kept as `spec_unreadable` (doctor and `jobs show`)."""
    run_at = None if due_ms is None else str(due_ms)
    from_spec = spec_fields(spec, run_at)
    if from_spec is None:
        return {"spec_unreadable": spec[:200], **fields}
    if "state" not in fields and run_at is not None:
        from_spec.update(state="due", run_at_ms=run_at, attempts="0")
    return from_spec | fields
