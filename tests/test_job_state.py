"""JobState.SCHEDULED vs DUE: status() and get_job() report a waiting job as SCHEDULED while its
run_at is after the server's now (the test clock here) and DUE from then on; the stored
`state` stays `due` (docs/glossary.md)."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.models import JobState
from tests.conftest import Clock

MIN_MS = 60_000


def test_future_job_is_scheduled_until_its_time(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(1_000_000)
    jid = q.enqueue("t", delay_ms=MIN_MS)
    assert q.status(jid) == JobState.SCHEDULED
    job = q.get_job(jid)
    assert job.state == "scheduled" and job.stored_state == "due"
    clock.set_ms(1_000_000 + MIN_MS - 1)  # one ms before run_at: still scheduled
    assert q.status(jid) == JobState.SCHEDULED
    clock.set_ms(1_000_000 + MIN_MS)  # at run_at: due
    assert q.status(jid) == JobState.DUE


def test_job_due_now_is_due(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    clock.set_ms(5_000)
    jid = q.enqueue("t")
    assert q.status(jid) == JobState.DUE
    assert q.get_job(jid).state == "due"
    # Never claimed: its spec record alone, the state is its place in due (lua/lib/job.lua).
    assert client.exists(q.keys.job(jid)) == 0 and client.zscore(q.keys.due, jid) is not None


def test_retry_with_backoff_is_scheduled_then_due(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(10_000)
    jid = q.enqueue("t", backoff=Backoff(base_ms=MIN_MS, factor=2.0, cap_ms=10 * MIN_MS, jitter=0))
    (job,) = q.claim("w", limit=1).jobs
    assert q.status(jid) == JobState.LEASED
    out = q.fail(jid, job.token, RuntimeError("boom"))
    assert out.status == "retry" and out.run_at_ms == 10_000 + MIN_MS
    assert q.status(jid) == JobState.SCHEDULED
    clock.set_ms(out.run_at_ms)
    assert q.status(jid) == JobState.DUE


def test_released_job_is_due_again(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(20_000)
    jid = q.enqueue("t")
    (job,) = q.claim("w", limit=1).jobs
    assert q.release([(jid, job.token)]) == ["released"]
    # Release puts the job back at the server's now: claimable at once, so DUE.
    assert q.status(jid) == JobState.DUE


def test_listed_jobs_carry_the_same_state(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(30_000)
    later, now = q.enqueue("t", delay_ms=MIN_MS), q.enqueue("t")
    assert [(j.id, j.state) for j in q.list_jobs("scheduled")] == [(later, "scheduled")]
    assert [(j.id, j.state) for j in q.list_jobs("due")] == [(now, "due")]
