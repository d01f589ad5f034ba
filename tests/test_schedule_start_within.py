"""A schedule's start window (`Queue.schedule(..., start_within_ms=N)`): each run starts within
N ms of its run time or not at all. A run claimed later is parked as dead ('start deadline
passed', as an enqueued job with enqueue's start_within_ms), and the schedule goes on: its next
run is armed. On the real scripts with the test clock (tests/conftest.py tq)."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, BadArgument, Queue
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.models import JobState
from scheduler.operations.ops import Script
from scheduler.schedules.recurring import stable_offset_ms
from tests.conftest import Clock, dump_queue

MIN_MS = 60_000
T0 = 1_000 * MIN_MS + 1  # just after a minute's slot: the first run is at T0 - 1 + MIN_MS
SLOT1 = 1_001 * MIN_MS
REASON = "start deadline passed"
WINDOW_MS = 30_000


def _claim(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=10, lease_ms=10_000).jobs]


def _every_minute(q: Queue, clock: Clock, **kw: object) -> str:
    clock.set_ms(T0)
    assert q.schedule("poll", "t", {"k": 1}, every_ms=MIN_MS, **kw) == "created"  # type: ignore[arg-type]
    return q.get_schedule("poll").pending


def test_a_run_claimed_past_its_window_is_parked_and_the_next_slot_still_runs(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    assert first == f"schedule:poll:{SLOT1}"
    assert q.get_schedule("poll").start_within_ms == WINDOW_MS
    assert q.get_job(first).start_by_ms == SLOT1 + WINDOW_MS
    clock.set_ms(SLOT1 + WINDOW_MS + 1)  # workers were busy: one ms too late
    assert _claim(q) == []
    job = q.get_job(first)
    assert (job.state, job.dead_reason, job.attempts) == (JobState.DEAD, REASON, 0)
    assert first in q.dead_ids()
    # The schedule goes on: the next slot is pending, and runs when claimed in time.
    second = q.get_schedule("poll").pending
    assert second == f"schedule:poll:{SLOT1 + MIN_MS}"
    assert q.get_job(second).start_by_ms == SLOT1 + MIN_MS + WINDOW_MS
    clock.set_ms(SLOT1 + MIN_MS + WINDOW_MS)  # the deadline itself is still in time
    [claimed] = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert claimed.id == second
    assert claimed.start_by_ms == SLOT1 + MIN_MS + WINDOW_MS  # the worker holds it to it too
    q.complete(claimed.id, claimed.token)
    assert q.get_schedule("poll").pending == f"schedule:poll:{SLOT1 + 2 * MIN_MS}"
    assert client.zscore(q.keys.due, f"schedule:poll:{SLOT1 + 2 * MIN_MS}") is not None


def test_a_run_claimed_in_time_runs_and_one_without_a_window_runs_late(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    clock.set_ms(SLOT1 + 5_000)
    assert _claim(q) == [first]
    q.schedule("plain", "t", every_ms=MIN_MS)
    plain = q.get_schedule("plain").pending
    assert q.get_job(plain).start_by_ms is None
    clock.set_ms(slot_ms(plain) + MIN_MS - 1)  # late, but nothing says it may not start
    assert plain in _claim(q)


def slot_ms(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def test_the_deadline_counts_from_the_jittered_run_time_of_a_cron_schedule(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("report", "t", cron="0 * * * *", jitter_ms=60_000, start_within_ms=1_000)
    pending = q.get_schedule("report").pending
    run_at = slot_ms(pending) + stable_offset_ms("report", 60_000)
    assert q.get_job(pending).run_at_ms == run_at
    assert q.get_job(pending).start_by_ms == run_at + 1_000
    clock.set_ms(run_at + 1_001)
    assert _claim(q) == []
    assert q.get_job(pending).dead_reason == REASON
    assert slot_ms(q.get_schedule("report").pending) == slot_ms(pending) + 3_600_000


def test_an_outage_stays_the_misfire_policys_and_only_a_run_it_keeps_is_held_to_its_window(
    tq: tuple[Queue, Clock],
) -> None:
    """Checked after the misfire policy: a run the policy drops after an outage is a misfire
    skip as before (cancelled, not a dead letter); the late run the policy keeps (run_once:
    the latest missed slot) is parked when it, too, is past its own window."""
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS, misfire="skip")
    clock.set_ms(SLOT1 + 3 * MIN_MS + 40_000)  # 3 slots missed
    assert _claim(q) == []
    job = q.get_job(first)
    assert (job.state, job.fields.get("skipped")) == (JobState.CANCELLED, "misfire")
    assert q.dead_ids() == []
    nxt = q.get_schedule("poll").pending
    assert nxt == f"schedule:poll:{SLOT1 + 4 * MIN_MS}"  # skip: the next future slot

    q.schedule("once", "t", every_ms=MIN_MS, start_within_ms=WINDOW_MS)  # run_once
    once = q.get_schedule("once").pending
    clock.set_ms(slot_ms(once) + 2 * MIN_MS + 40_000)  # 2 slots missed; the latest 40 s ago
    assert _claim(q) == []  # the stale one dropped, the latest placed and past its window
    assert q.get_job(once).fields.get("skipped") == "misfire"
    latest = f"schedule:once:{slot_ms(once) + 2 * MIN_MS}"
    assert q.get_job(latest).dead_reason == REASON
    assert q.get_schedule("once").pending == f"schedule:once:{slot_ms(once) + 3 * MIN_MS}"


def test_a_retry_that_would_start_past_the_window_is_parked_by_fail(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS, max_attempts=5)
    clock.set_ms(SLOT1)
    [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
    out = q.fail(first, job.token, ("E", "boom", ""), delay_ms=WINDOW_MS + 1)
    assert (out.status, out.dead_reason) == ("dead", REASON)
    out_ok = q.get_schedule("poll").pending  # armed at the claim, as always
    assert out_ok == f"schedule:poll:{SLOT1 + MIN_MS}"
    clock.set_ms(SLOT1 + MIN_MS)
    [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
    out = q.fail(job.id, job.token, ("E", "boom", ""), delay_ms=WINDOW_MS)  # in time
    assert (out.status, out.run_at_ms) == ("retry", SLOT1 + MIN_MS + WINDOW_MS)


def test_a_dead_run_requeued_runs_without_its_deadline(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    clock.set_ms(SLOT1 + WINDOW_MS + 1)
    assert _claim(q) == []
    assert q.requeue_dead([first]) == 1
    assert q.get_job(first).start_by_ms is None
    assert first in _claim(q)


def test_a_released_run_is_parked_by_the_next_claim_past_its_window(
    tq: tuple[Queue, Clock],
) -> None:
    """A worker gives back a prefetched run whose deadline passed (release): the next claim
    parks it, and the schedule's next run, armed at the first claim, stays."""
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    clock.set_ms(SLOT1)
    [job] = q.claim("w", limit=1, lease_ms=60_000).jobs
    clock.set_ms(SLOT1 + WINDOW_MS + 1)
    assert q.release([(first, job.token)]) == ["released"]
    assert _claim(q) == []
    assert q.get_job(first).dead_reason == REASON
    assert q.get_schedule("poll").pending == f"schedule:poll:{SLOT1 + MIN_MS}"


def test_redefining_the_window(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    before = dump_queue(client, q)
    same = q.schedule("poll", "t", {"k": 1}, every_ms=MIN_MS, start_within_ms=WINDOW_MS)
    assert same == "unchanged"
    assert dump_queue(client, q) == before
    # A changed window is a changed definition: the pending run is replaced with the new one.
    assert q.schedule("poll", "t", {"k": 1}, start_within_ms=5_000, every_ms=MIN_MS) == "updated"
    assert q.get_schedule("poll").start_within_ms == 5_000
    assert q.get_schedule("poll").pending == first
    assert q.get_job(first).start_by_ms == SLOT1 + 5_000
    # Dropped: no window, no deadline; and the definition without one is the old digest.
    assert q.schedule("poll", "t", {"k": 1}, every_ms=MIN_MS) == "updated"
    assert "start_within_ms" not in client.hgetall(q.keys.schedule("poll"))
    assert q.get_schedule("poll").start_within_ms is None
    assert q.get_job(first).start_by_ms is None
    assert q.schedule("poll", "t", {"k": 1}, every_ms=MIN_MS) == "unchanged"


def test_a_redefinition_keeps_a_due_run_with_its_own_deadline(tq: tuple[Queue, Clock]) -> None:
    """A run already due is kept by a redefinition (schedule_upsert.lua): it keeps the deadline
    it was written with; the new window applies from the next run."""
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    clock.set_ms(SLOT1 + 1_000)
    assert q.schedule("poll", "t", {"k": 1}, every_ms=MIN_MS, start_within_ms=500) == "updated"
    assert q.get_schedule("poll").pending == first
    assert q.get_job(first).start_by_ms == SLOT1 + WINDOW_MS
    assert _claim(q) == [first]
    nxt = q.get_schedule("poll").pending
    assert q.get_job(nxt).start_by_ms == slot_ms(nxt) + 500


def test_run_now_gets_its_deadline_from_now(tq: tuple[Queue, Clock], client: redis.Redis) -> None:
    q, clock = tq
    pending = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    clock.set_ms(T0 + 7)
    kept = client.hgetall(q.keys.schedule("poll"))
    jid = q.run_schedule_now("poll")
    assert q.get_job(jid).start_by_ms == T0 + 7 + WINDOW_MS
    assert client.hgetall(q.keys.schedule("poll")) == kept  # the schedule is not written
    clock.set_ms(T0 + 7 + WINDOW_MS + 1)
    assert _claim(q) == []
    assert q.get_job(jid).dead_reason == REASON
    assert q.get_schedule("poll").pending == pending  # its own next run stays
    in_time = q.run_schedule_now("poll")
    assert _claim(q) == [in_time]


def test_a_schedule_stored_without_the_field_keeps_working(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Stored data of the version before: a schedule hash without start_within_ms and an
    occurrence hash without start_by_ms read as no window, run late, and re-arm as before."""
    q, clock = tq
    first = _every_minute(q, clock)
    sched = client.hgetall(q.keys.schedule("poll"))
    assert "start_within_ms" not in sched
    assert "start_by_ms" not in client.hgetall(q.keys.job(first))
    s = q.get_schedule("poll")
    assert (s.start_within_ms, s.unreadable, s.as_dict()["start_within_ms"]) == (None, "", None)
    clock.set_ms(SLOT1 + MIN_MS - 1)  # long past any window a schedule could have given
    assert _claim(q) == [first]
    assert q.get_schedule("poll").pending == f"schedule:poll:{SLOT1 + MIN_MS}"
    # The same definition sent by this version is the same digest: nothing is written.
    before = dump_queue(client, q)
    assert q.schedule("poll", "t", {"k": 1}, every_ms=MIN_MS) == "unchanged"
    assert dump_queue(client, q) == before


def test_a_hand_edited_window_makes_the_schedule_unreadable(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """As every other definition field: the scripts read it as absent (lib/schedule.lua
    sched_load), get_schedule and doctor name the field; defining it again repairs it."""
    q, clock = tq
    first = _every_minute(q, clock, start_within_ms=WINDOW_MS)
    client.hset(q.keys.schedule("poll"), "start_within_ms", "0")
    assert q.get_schedule("poll").unreadable == "start_within_ms"
    clock.set_ms(SLOT1)
    assert _claim(q) == [first]  # run, not re-armed: absent to claim
    assert q.get_schedule("poll").pending == first
    kw = {"every_ms": MIN_MS, "start_within_ms": WINDOW_MS}
    assert q.schedule("poll", "t", {"k": 1}, **kw) == "updated"  # type: ignore[arg-type]
    assert q.get_schedule("poll").unreadable == ""


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10", 315_360_000_001])
def test_a_bad_window_is_refused_and_nothing_is_written(
    tq: tuple[Queue, Clock], client: redis.Redis, bad: object
) -> None:
    q, _ = tq
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="start_within_ms"):
        q.schedule("poll", "t", every_ms=MIN_MS, start_within_ms=bad)  # type: ignore[arg-type]
    assert dump_queue(client, q) == before


def test_the_script_refuses_a_bad_window_itself(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """schedule_upsert.lua checks its own argument (another client, a hand-made call)."""
    q, clock = tq
    clock.set_ms(T0)
    args = ["poll", "d" * 32, "every", "", "", str(MIN_MS), "0", "0", "run_once", "1", "t",
            "null", "5", "1000,2.0,60000,0.0", "0", ""]  # fmt: skip
    before = dump_queue(client, q)
    for bad in ("0", "-1", "1.5", "abc", "315360000001"):
        with pytest.raises(BadArgument, match="start_within_ms"):
            q._execute(Script("schedule_upsert", [*args, bad]))
    assert dump_queue(client, q) == before
    assert q._execute(Script("schedule_upsert", [*args, "250"]))[0] == "created"
    assert client.hget(q.keys.schedule("poll"), "start_within_ms") == "250"


def test_the_async_client_passes_the_window_on(tq: tuple[Queue, Clock], redis_url: str) -> None:
    q, clock = tq
    clock.set_ms(T0)

    async def define() -> str:
        aq = AsyncQueue(connect_async(redis_url), q.name, _clock="test")
        try:
            return await aq.schedule("a", "t", every_ms=MIN_MS, start_within_ms=1_500)
        finally:
            await aq.aclose()

    assert asyncio.run(define()) == "created"
    assert q.get_schedule("a").start_within_ms == 1_500


def test_the_partitioned_client_passes_the_window_on(pq: PartitionedQueue) -> None:
    assert pq.schedule("p", "t", every_ms=MIN_MS, start_within_ms=2_500) == "created"
    assert pq.get_schedule("p").start_within_ms == 2_500
    with pytest.raises(BadArgument, match="start_within_ms"):
        pq.schedule("p", "t", every_ms=MIN_MS, start_within_ms=0)


def test_cli_schedules_add_start_within(
    tq: tuple[Queue, Clock], client: redis.Redis, redis_url: str
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    base = ["schedules", "add", "poll", "t", "--every", "1m", "--url", redis_url, "-q", q.name]
    before = dump_queue(client, q)
    for bad in ("0s", "-5s", "soon"):
        run = CliRunner().invoke(main, [*base, "--start-within", bad])
        assert run.exit_code == 2, run.output
    assert dump_queue(client, q) == before
    run = CliRunner().invoke(main, [*base, "--start-within", "30s"])
    assert run.exit_code == 0, run.output
    assert run.stdout.strip() == "poll: created"
    assert q.get_schedule("poll").start_within_ms == 30_000
    again = CliRunner().invoke(main, [*base, "--start-within", "30s", "--json"])
    assert json.loads(again.stdout)["status"] == "unchanged"
    listed = CliRunner().invoke(main, ["schedules", "list", "--url", redis_url, "-q", q.name])
    assert listed.exit_code == 0, listed.output
    assert "start-within 30000ms" in listed.stdout
    as_json = CliRunner().invoke(
        main, ["schedules", "list", "--url", redis_url, "-q", q.name, "--json"]
    )
    assert json.loads(as_json.stdout)["schedules"][0]["start_within_ms"] == 30_000
    q.schedule("bare", "t", every_ms=MIN_MS)
    listed = CliRunner().invoke(main, ["schedules", "list", "--url", redis_url, "-q", q.name])
    [bare] = [line for line in listed.stdout.splitlines() if line.startswith("bare ")]
    assert "start-within" not in bare
