"""doctor's cheap first read of never-claimed jobs (scheduler/admin/doctor_pending.py): a big
healthy backlog is not re-read job by job (a scale audit: 90 s and 936 MB of client for 1M
pending jobs), yet every damage a pending job's record can carry is still found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler.admin import doctor
from scheduler.admin.doctor import check_queue
from scheduler.core.connection import connect


@pytest.fixture
def snapshot_ids(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids check_queue re-reads in its atomic snapshots."""
    seen: list[str] = []
    real = doctor.read_snapshots

    def spy(client: Any, keys: Any, ids: Any) -> Any:
        seen.extend(ids)
        return real(client, keys, ids)

    monkeypatch.setattr(doctor, "read_snapshots", spy)
    return seen


def test_a_healthy_backlog_is_not_read_job_by_job(
    q: Queue, client: redis.Redis, snapshot_ids: list[str]
) -> None:
    q.enqueue_many([JobSpec("t", {"n": i}, delay_ms=i % 2 * 60_000) for i in range(1_500)])
    claimed = q.claim("w", limit=5).jobs  # a few with hashes: read the usual way
    assert check_queue(client, q.name) == []
    assert snapshot_ids == []
    assert len(claimed) == 5


Damage = Callable[[redis.Redis, str], object]
DAMAGE: dict[str, tuple[Damage, str]] = {
    # name: (how the spec record of one pending job is damaged, the finding expected)
    "an expiry on it": (lambda c, k: c.pexpire(k, 600_000), "expiring-job"),
    "not a record": (lambda c, k: c.set(k, "garbage"), "invalid-job"),
    "payload not JSON": (lambda c, k: c.set(k, "2|t|||||||{nope"), "bad-payload"),
    "not a STRING": (lambda c, k: (c.delete(k), c.hset(k, "a", "1")), "wrong-type"),
    "bytes not UTF-8": (lambda c, k: c.set(k, b"2|t\xff|||||||null"), "undecodable"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_each_damage_of_a_pending_record_is_still_found(
    q: Queue, client: redis.Redis, redis_url: str, snapshot_ids: list[str], case: str
) -> None:
    ids = q.enqueue_many([JobSpec("t", {"n": i}) for i in range(50)])
    damage, code = DAMAGE[case]
    damage(client, q.keys.spec(ids[7]))
    # As `scheduler doctor` reads (scheduler/cli/doctor.py): undecodable bytes kept as such.
    with connect(redis_url, encoding_errors="surrogateescape") as reader:
        found = check_queue(reader, q.name)
    assert [(i.code, i.job_id) for i in found] == [(code, ids[7])], found
    assert snapshot_ids == [ids[7]]  # the suspect alone was re-read


def test_a_due_score_that_is_no_time_is_still_found(q: Queue, client: redis.Redis) -> None:
    ids = q.enqueue_many([JobSpec("t", None) for _ in range(3)])
    client.zadd(q.keys.due, {ids[1]: float("inf")})
    assert [(i.code, i.job_id) for i in check_queue(client, q.name)] == [("bad-score", ids[1])]
