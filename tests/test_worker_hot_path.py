"""The worker's per-job shortcuts (issue 16, docs/performance.md section 12) keep its behaviour."""

from __future__ import annotations

import dataclasses

from scheduler.core import claim_reply, codec
from scheduler.core.models import ClaimedJob


def _job_fields() -> dict[str, object]:
    return {
        "id": "j1",
        "token": "7-abc",
        "attempts": 2,
        "max_attempts": 5,
        "task": "t",
        "payload_json": '{"a": 1}',
        "run_at_ms": 10,
        "claimed_ms": 20,
        "backoff": codec.stored_backoff(""),
        "timeout_ms": 0,
        "schedule": "",
    }


def test_claimed_job_of_builds_what_the_constructor_builds() -> None:
    fields = _job_fields()
    fast = ClaimedJob._of(*fields.values())
    slow = ClaimedJob(**fields)  # type: ignore[arg-type]
    assert fast == slow and hash(fast) == hash(slow)
    assert vars(fast) == vars(slow)
    # a field added to ClaimedJob but not to _of would be missing here
    assert [f.name for f in dataclasses.fields(ClaimedJob)] == list(vars(fast))
    assert fast.fence == 7
    try:
        fast.id = "x"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("ClaimedJob._of must stay frozen")


def test_parse_claim_builds_claimed_jobs_equal_to_the_constructor() -> None:
    raw = ["j1", "7-abc", "2", "5", "t", '{"a": 1}', "10", "", "0", ""]
    batch = claim_reply.parse_claim(["20", "-1", "1", *raw])
    assert batch.jobs == [ClaimedJob(**_job_fields())]  # type: ignore[arg-type]
