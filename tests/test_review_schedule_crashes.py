"""Review of recurring schedules on the failure paths: a run that fails and retries while its
schedule is removed and defined again, a late pending run cancelled, and the first claim after
an outage longer than a cron schedule's slot buffer. Each test runs the real scripts on the
test clock."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.schedules.recurring import stable_offset_ms
from tests.conftest import Clock

MIN_MS = 60_000
BASE = 10_000 * MIN_MS


def _slot(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def _minutes(done: Counter[str]) -> list[int]:
    return sorted((_slot(i) - BASE) // MIN_MS for i in done)


def _work(q: Queue, clock: Clock, now_ms: int, done: Counter[str]) -> None:
    """Workers at `now_ms`: claim and complete everything claimable."""
    clock.set_ms(now_ms)
    while True:
        batch = q.claim("w", limit=50, lease_ms=30_000)
        for job in batch.jobs:
            q.complete(job.id, job.token)
            done[job.id] += 1
        if len(batch.jobs) < 50 and not (0 <= batch.next_ms <= now_ms):
            return


def test_a_retrying_run_of_a_removed_schedule_is_not_taken_over_by_its_redefinition(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    # The schedule is removed while its run is leased; the run fails and waits for its retry.
    # The schedule is defined again with a jitter whose offset puts its first slot back at
    # that run's slot: the retry must stay a retry (not become the new pending occurrence,
    # which a pause deletes and the misfire policy may drop).
    q, clock = tq
    name = "r"
    jitter = next(j for j in range(1_000, 50_000, 997) if stable_offset_ms(name, j) > 5_000)
    clock.set_ms(BASE + 1)
    q.schedule(name, "t", every_ms=MIN_MS)
    clock.set_ms(BASE + MIN_MS + 1)
    (run,) = q.claim("w", limit=10).jobs
    assert q.remove_schedule(name) == "removed"
    assert q.fail(run.id, run.token, ("E", "boom", "")).status == "retry"
    assert q.schedule(name, "t", every_ms=MIN_MS, jitter_ms=jitter) == "created"
    assert q.get_schedule(name).pending != run.id
    assert q.pause_schedule(name) == "paused"
    assert client.hmget(q.keys.job(run.id), "state", "attempts") == ["due", "1"]
    assert client.zscore(q.keys.due, run.id) is not None


@pytest.mark.parametrize(
    ("misfire", "expect"), [("catch_up:3", [8, 9, 10]), ("run_once", [10]), ("skip", [])]
)
def test_cancelling_a_late_pending_run_skips_that_run_only(
    tq: tuple[Queue, Clock], misfire: str, expect: list[int]
) -> None:
    # Nothing claimed for ten minutes; an operator cancels the stale pending run (minute 1).
    # The missed runs the policy would have run (claiming minute 1 drops it and runs them)
    # must still run: the cancel skips minute 1 alone (README "Cancelling a pending run").
    q, clock = tq
    clock.set_ms(BASE + 1)
    q.schedule("c", "t", every_ms=MIN_MS, misfire=misfire)
    first = q.get_schedule("c").pending
    assert _slot(first) == BASE + MIN_MS
    now = BASE + 10 * MIN_MS + 30_000
    clock.set_ms(now)
    assert q.cancel(first) == "due"
    done: Counter[str] = Counter()
    _work(q, clock, now, done)
    assert _minutes(done) == expect
    assert _slot(q.get_schedule("c").pending) == BASE + 11 * MIN_MS


@pytest.mark.parametrize("kind", ["cron", "every"])
def test_catch_up_after_an_outage_longer_than_the_cron_buffer_runs_the_latest_n(
    tq: tuple[Queue, Clock], kind: str
) -> None:
    # 500 minutes without a claim, catch_up:100: the latest 100 missed runs, as for an
    # interval schedule (README "misfire"); not the first buffered one, 500 minutes late.
    q, clock = tq
    clock.set_ms(BASE + 1)
    spec: dict[str, Any] = {"cron": "* * * * *"} if kind == "cron" else {"every_ms": MIN_MS}
    q.schedule("c", "t", misfire="catch_up:100", **spec)
    done: Counter[str] = Counter()
    _work(q, clock, BASE + 500 * MIN_MS + 1_000, done)
    assert _minutes(done) == list(range(401, 501))
    assert all(n == 1 for n in done.values())
    _work(q, clock, BASE + 501 * MIN_MS, done)
    assert _minutes(done)[-2:] == [500, 501]
