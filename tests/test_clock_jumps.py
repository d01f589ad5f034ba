"""The Redis server's clock steps (an NTP step, a VM restored from a snapshot, a failover to a
replica whose clock differs): back by 1 s or 1 h, forward by 1 h, between calls, on the test
clock (tests/conftest.py tq). docs/durability.md ("Clock steps") says what is inherent: a step
back delays what was placed by the clock before it, a step forward is lapsed leases and missed
runs. These check that nothing is lost, run twice under a valid lease, stuck beyond the step or
answered with an error, and the two defects found: a job parked after a step back was the first
the count retention deleted, and a rate key stayed shut for the whole step."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import Queue
from scheduler.cli.main import main
from scheduler.core.models import JobState
from tests.conftest import Clock
from tests.test_dashboard import make_client

T0 = 10_000_000_000  # a server time, ms
SEC, HOUR = 1_000, 3_600_000
STEPS = [-SEC, -HOUR, HOUR]


def _ids(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=10, lease_ms=30_000).jobs]


def _run(q: Queue) -> list[str]:
    """Claim what is due and complete it: the ids that ran."""
    jobs = q.claim("w", limit=10, lease_ms=30_000).jobs
    for j in jobs:
        q.complete(j.id, j.token)
    return [j.id for j in jobs]


def _park(q: Queue) -> str:
    jid = q.enqueue("t", None, max_attempts=1)
    [job] = q.claim("w", limit=1, lease_ms=30_000).jobs
    assert q.fail(jid, job.token, ("E", "boom", ""), retryable=False).status == "dead"
    return jid


def test_a_job_parked_after_a_step_back_is_kept_by_the_count_retention(
    tq: tuple[Queue, Clock],
) -> None:
    """Its score was the stepped-back now, below every older dead letter: the count retention
    (lowest first) deleted it at once, and went on deleting each new one for the whole step,
    while the older ones stayed. Now no score is below the newest one's."""
    q, clock = tq
    q.set_dead_retention(max_count=3)
    old = []
    for i in range(3):
        clock.set_ms(T0 + i)
        old.append(_park(q))
    clock.set_ms(T0 - HOUR)
    new = [_park(q), _park(q)]
    assert q.dead_ids() == [new[1], new[0], old[2]]  # newest first, the two oldest trimmed
    assert q.get_job(new[0]).state == JobState.DEAD
    assert q.get_job(new[0]).fields["dead_ms"] == str(T0 - HOUR)  # when it died, as it was


def test_a_job_enqueued_early_and_parked_after_a_step_back_is_kept(
    tq: tuple[Queue, Clock],
) -> None:
    """Parks after the step back tied at the newest score: the retention (lowest score, then
    id, first) deleted the one with the smallest id, a job enqueued before the others (ids
    sort by enqueue time) though parked last. Each park now scores after the newest one."""
    q, clock = tq
    q.set_dead_retention(max_count=3)
    clock.set_ms(T0 - 10)
    early = q.enqueue("t", None, max_attempts=1, job_id="0-early")  # sorts before the made ids
    [held] = q.claim("w", limit=1, lease_ms=HOUR * 2).jobs
    old = []
    for i in range(3):
        clock.set_ms(T0 + i)
        old.append(_park(q))
    clock.set_ms(T0 - HOUR)
    later = [_park(q), _park(q)]
    assert q.fail(early, held.token, ("E", "boom", ""), retryable=False).status == "dead"
    assert q.dead_ids() == [early, later[1], later[0]]  # newest first, the three older trimmed


def test_a_dead_score_written_by_hand_far_ahead_is_not_every_later_parks(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """A park is scored no lower than the newest dead letter only up to 366 days ahead
    (LIM.ttl_ms): a score written by hand (inf, 1e15) would otherwise be every later park's,
    out of the age retention's reach for good."""
    q, clock = tq
    clock.set_ms(T0)
    for score in (float("inf"), 1e15):
        client.zadd(q.keys.dead, {"by-hand": score})
        job = _park(q)
        assert client.zscore(q.keys.dead, job) == T0
    clock.set_ms(T0 + 10)
    client.zadd(q.keys.dead, {"by-hand": T0 + HOUR})  # a step back's worth ahead: after it
    assert client.zscore(q.keys.dead, _park(q)) == T0 + HOUR + 1


def test_a_rate_window_holds_its_key_one_window_after_a_step_back(
    tq: tuple[Queue, Clock],
) -> None:
    """A start logged before a step back reads as later than now: it held a 1-per-second key
    for the whole hour (flow_rate_due counted it in every window). It now counts as at now."""
    q, clock = tq
    rated: dict[str, Any] = {"rate_limit": (1, SEC), "rate_key": "r"}
    clock.set_ms(T0)
    a = q.enqueue("t", 1, **rated)
    assert _run(q) == [a]
    clock.set_ms(T0 - HOUR)
    b, c = q.enqueue("t", 2, **rated), q.enqueue("t", 3, **rated)
    assert _run(q) == []  # the start at T0 fills the window now
    clock.set_ms(T0 - HOUR + SEC + 1)
    assert _run(q) == [b]
    clock.set_ms(T0 - HOUR + 2 * SEC + 2)
    assert _run(q) == [c]


@pytest.mark.parametrize("step", STEPS)
def test_a_lease_across_a_step(tq: tuple[Queue, Clock], step: int) -> None:
    """Back: the lease is still held (heartbeat extends it from the new now), nothing is claimed
    twice, complete is accepted. Forward: the lease has lapsed (heartbeat says 'expired'), the
    next claim reaps it and runs the job again (inherent), the first worker's complete is stale."""
    q, clock = tq
    clock.set_ms(T0)
    jid = q.enqueue("t", 1, max_attempts=5)
    [job] = q.claim("w", limit=1, lease_ms=30_000).jobs
    clock.set_ms(T0 + step)
    until, status = q.heartbeat([(jid, job.token)], lease_ms=30_000)
    if step < 0:
        assert (until, status) == (T0 + step + 30_000, {jid: "held"})
        assert _ids(q) == []
        q.complete(jid, job.token)
        assert q.get_job(jid).state == JobState.DONE
    else:
        assert status == {jid: "expired"}
        assert _ids(q) == [jid]
        assert q.get_job(jid).attempts == 2
    counts = q.counts()
    assert counts.due == 0 and counts.dead == 0


@pytest.mark.parametrize("kind", ["every", "cron"])
@pytest.mark.parametrize("step", [-SEC, HOUR])
def test_a_schedule_goes_on_after_a_step(tq: tuple[Queue, Clock], kind: str, step: int) -> None:
    """Back by a second: the next run is a second later by the wall clock. Forward by an hour:
    one late run (run_once), then one a minute again; no burst, no silence."""
    q, clock = tq
    clock.set_ms(T0)
    if kind == "every":
        q.schedule("s", "t", every_ms=60_000)
    else:
        q.schedule("s", "t", cron="* * * * *")
    first = q.get_schedule("s").next_run_ms
    assert first is not None
    clock.set_ms(first)
    assert len(_run(q)) == 1
    clock.set_ms(first + step)
    assert len(_run(q)) == (1 if step > 0 else 0)
    base = first + max(step, 0)
    for k in range(1, 4):
        clock.set_ms(base + k * 60_000)
        assert len(_run(q) + _run(q)) == 1


def test_a_schedule_removed_after_a_step_back_stays_silent_until_its_last_run(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Documented (docs/durability.md): its last run is remembered a month
    (schedule_ran:<name>), so defining it again does not restart it from the stepped-back clock;
    deleting that key between remove and schedule does."""
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=60_000)
    first = q.get_schedule("s").next_run_ms
    assert first is not None
    clock.set_ms(first)
    assert len(_run(q)) == 1
    clock.set_ms(T0 - HOUR)
    q.remove_schedule("s")
    q.schedule("s", "t", every_ms=60_000)
    assert q.get_schedule("s").next_run_ms == first + 60_000  # after the slot that ran
    q.remove_schedule("s")
    client.delete(q.keys.prefix + "schedule_ran:s")
    q.schedule("s", "t", every_ms=60_000)
    assert q.get_schedule("s").next_run_ms == first - HOUR


@pytest.mark.parametrize("step", STEPS)
def test_retries_releases_reschedules_and_results_after_a_step(
    tq: tuple[Queue, Clock], step: int
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    done = q.enqueue("t", 0)
    [j] = q.claim("w", limit=1, lease_ms=30_000).jobs
    q.complete(done, j.token, "A")
    a, r = q.enqueue("t", 1, max_attempts=3), q.enqueue("t", 2)
    s = q.enqueue("t", 3, delay_ms=120_000)
    got = {j.id: j for j in q.claim("w", limit=2, lease_ms=HOUR * 3).jobs}
    clock.set_ms(T0 + step)
    out = q.fail(a, got[a].token, ("E", "x", ""), delay_ms=5_000)
    assert (out.status, out.run_at_ms) == ("retry", T0 + step + 5_000)
    q.release([(r, got[r].token)])
    q.reschedule(s, delay_ms=1_000)
    b = q.enqueue("t", 4)
    [jb] = q.claim("w", limit=1, lease_ms=30_000).jobs  # r or b: both due at the new now
    q.complete(jb.id, jb.token, "B")
    clock.set_ms(T0 + step + 5_000)
    ran = [jb.id, *_run(q)]
    assert sorted(ran) == sorted([a, r, s, b])
    assert q.result(jb.id, timeout_s=1) == "B"
    finished = {j.id for j in q.list_jobs("finished")}
    assert jb.id in finished
    assert (done in finished) == (step < 0)  # its 1 h result TTL ran out with the step forward


@pytest.mark.parametrize("step", [-HOUR, HOUR])
def test_the_cli_and_dashboard_read_state_stamped_by_another_clock(
    client: redis.Redis, tq: tuple[Queue, Clock], redis_url: str, step: int
) -> None:
    """State written while the server's clock read (real now - step), then read by the CLI and
    the dashboard on the real TIME: every view answers (a negative "dead for" after a step
    back, a lease left longer than it was given: what the clock says)."""
    q, clock = tq
    clock.set_ms(int(time.time() * 1000) - step)
    q.set_dead_retention(max_age_ms=HOUR * 24)
    q.schedule("s", "t", every_ms=60_000)
    q.schedule("c", "t", cron="* * * * *", rate_limit=(1, SEC))
    ids = [q.enqueue("t", i, max_attempts=1) for i in range(3)]
    later = q.enqueue("t", 9, delay_ms=5_000)
    jobs = q.claim("w", limit=3, lease_ms=30_000).jobs
    q.complete(jobs[0].id, jobs[0].token, "r")
    q.fail(jobs[1].id, jobs[1].token, ("E", "x", ""), retryable=False)
    q.pause()
    runner, name = CliRunner(env={"COLUMNS": "200"}), q.name
    commands = [["stats"], ["dead", "list"], ["dead", "retention"], ["schedules", "list"],
                ["workers"], ["doctor"]]  # fmt: skip
    commands += [["jobs", "list", "--state", s] for s in ("due", "scheduled", "leased", "dead")]
    commands += [["jobs", "list", "--state", "finished"], ["stats", "--json"]]
    commands += [["jobs", "show", i] for i in [*ids, later]]
    for args in commands:
        r = runner.invoke(main, [*args, "-q", name, "--url", redis_url])
        assert r.exit_code in (0, 1), (args, r.output)  # 1: doctor's findings (no AOF)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.output)
    web = make_client(client, q)
    pages = ["/", "/api/overview", f"/queues/{name}", f"/queues/{name}/api"]
    pages += [f"/queues/{name}/dead", "/schedules", "/workers"]
    pages += [f"/queues/{name}/jobs/{i}" for i in [*ids, later, *client.zrange(q.keys.due, 0, -1)]]
    for page in pages:
        assert web.get(page).status_code == 200, page
