"""An error in a follow-up step of an operation reaches the operation itself (the drivers throw
it back in), so claim can hand out the jobs it already leased instead of stranding them until
their leases lapse."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.operations.ops import Commands


def test_claim_keeps_its_jobs_when_the_schedule_refill_fails(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = q.enqueue("t", {"n": 1})
    client.sadd(q.keys.schedules_refill, "some-schedule")  # the claim reply will ask for a refill
    real = q._execute
    failed: list[Any] = []

    def flaky(req: Any) -> Any:
        if isinstance(req, Commands) and any("SRANDMEMBER" in c for c in req.cmds):
            failed.append(req)
            raise redis.ConnectionError("connection dropped during the refill")
        return real(req)

    monkeypatch.setattr(q, "_execute", flaky)
    batch = q.claim("w", limit=5)
    assert failed, "the refill step was not reached"
    assert [j.id for j in batch.jobs] == [job_id]
    assert client.sismember(q.keys.schedules_refill, "some-schedule")  # left for the next claim


def test_other_errors_still_reach_the_caller(q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(req: Any) -> Any:
        raise redis.ConnectionError("down")

    monkeypatch.setattr(q, "_execute", broken)
    with pytest.raises(redis.ConnectionError):
        q.claim("w", limit=5)
    with pytest.raises(redis.ConnectionError):
        q.enqueue("t", None)
