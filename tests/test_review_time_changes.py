"""Review: the calls that change when an accepted job runs (reschedule, run now, a handler's
RetryLater through `fail(delay_ms=)`, a debounced enqueue, cancel), held against the product's
promises on a real Redis: no job runs before its run time, by the server's clock (a test
clock here: lib/clock_test.lua); a job accepted is never lost; a stale token (its lease lapsed
and reaped, or settled) neither moves nor settles the job; a job that is not waiting (leased,
held by flow control or a parent, dead, done, cancelled) is answered with why and nothing
changes; bad times are refused at the boundary of every client (sync, async, partitioned, the
CLI) with nothing written."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, BadArgument, JobCancelled, Queue, StaleToken
from scheduler.cli.main import main
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from tests.conftest import Clock, dump_queue
from tests.test_dashboard import csrf_of, make_client
from tests.test_dashboard_pause import post

HOUR_MS = 3_600_000
T0 = 1_000_000_000  # the test clock's start: 1970-01-12, far from the machine's clock
ERR = ("E", "boom", "")


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def run_now(q: Queue, job_id: str) -> str:
    """The CLI's `jobs reschedule --now` and the dashboard's Run now (ReschedulingOps.run_now)."""
    return str(q._run(q.ops.run_now(job_id)))


# -- server time ---------------------------------------------------------------------------


def test_a_reschedule_counts_its_delay_from_the_server_clock(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", {"n": 1}, delay_ms=HOUR_MS)
    assert q.reschedule(job_id, delay_ms=5_000) == "rescheduled"
    assert q.get_job(job_id).run_at_ms == T0 + 5_000  # the server's now, not the machine's
    clock.set_ms(T0 + 4_999)
    assert q.claim("w").jobs == []  # never before its run time
    clock.set_ms(T0 + 5_000)
    assert [j.id for j in q.claim("w").jobs] == [job_id]


def test_a_run_at_is_an_instant_and_run_now_is_the_servers_now(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("t", None, delay_ms=HOUR_MS)
    b = q.enqueue("t", None, delay_ms=HOUR_MS)
    assert q.reschedule(a, run_at=at(T0 + 7_000)) == "rescheduled"
    assert q.get_job(a).run_at_ms == T0 + 7_000
    clock.set_ms(T0 + 2_000)
    assert run_now(q, b) == "rescheduled"
    assert q.get_job(b).run_at_ms == T0 + 2_000
    assert run_now(q, b) == "due"  # due already: keeps its place, nothing moved
    assert q.get_job(b).run_at_ms == T0 + 2_000
    assert [j.id for j in q.claim("w", limit=5).jobs] == [b]
    clock.set_ms(T0 + 7_000)
    assert [j.id for j in q.claim("w", limit=5).jobs] == [a]


def test_a_debounced_call_moves_the_run_time_by_the_server_clock_both_ways(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    first = q.enqueue("digest", {"v": 1}, key="d", debounce=True, delay_ms=1_000)
    clock.set_ms(T0 + 900)
    assert q.enqueue("digest", {"v": 2}, key="d", debounce=True, delay_ms=1_000) == first
    clock.set_ms(T0 + 1_000)  # the first call's time: pushed back, not run
    assert q.claim("w").jobs == []
    clock.set_ms(T0 + 1_100)
    # A later call with a shorter delay brings it forward: the latest call wins.
    assert q.enqueue("digest", {"v": 3}, key="d", debounce=True, delay_ms=200) == first
    clock.set_ms(T0 + 1_299)
    assert q.claim("w").jobs == []
    clock.set_ms(T0 + 1_300)
    (job,) = q.claim("w").jobs
    assert (job.id, job.payload(), job.attempts) == (first, {"v": 3}, 1)


def test_a_retry_delay_counts_from_the_server_clock_and_a_reschedule_overrides_it(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", None, max_attempts=3)
    (job,) = q.claim("w").jobs
    clock.set_ms(T0 + 10)
    out = q.fail(job_id, job.token, ERR, delay_ms=90_000)  # what a RetryLater(90_000) sends
    assert (out.status, out.run_at_ms) == ("retry", T0 + 10 + 90_000)
    clock.set_ms(T0 + 90_009)
    assert q.claim("w").jobs == []
    assert q.reschedule(job_id, delay_ms=HOUR_MS) == "rescheduled"  # later than it asked
    clock.set_ms(T0 + 90_010)
    assert q.claim("w").jobs == []
    clock.set_ms(T0 + 90_009 + HOUR_MS)
    (again,) = q.claim("w").jobs
    assert (again.id, again.attempts, again.fence) == (job_id, 2, job.fence + 1)


def test_a_past_run_at_runs_a_job_with_a_start_window_instead_of_parking_it(
    tq: tuple[Queue, Clock],
) -> None:
    # Queue.reschedule: "run_at: ... (a past one: due now)"; README: "reschedule moves the
    # deadline with the run time". A reminder due at 10:00 with a 15-minute window, moved by an
    # operator to "09:00" (an hour ago) to run now: its deadline lands at 09:15, 45 minutes in
    # the past, and the next claim parks it as dead instead of running it.
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("remind", None, run_at=at(T0 + HOUR_MS), start_within_ms=900_000)
    assert q.reschedule(job_id, run_at=at(T0 - HOUR_MS)) == "rescheduled"
    assert q.status(job_id) == "due"
    # Due now, its 15-minute window counted from now (fixed: lua/reschedule.lua): still run on
    # the window's last millisecond.
    clock.set_ms(T0 + 900_000 - 1)
    assert [j.id for j in q.claim("w").jobs] == [job_id], q.get_job(job_id).dead_reason


def test_a_past_run_at_keeps_the_window_from_now_and_parks_after_it(
    tq: tuple[Queue, Clock],
) -> None:
    # The other side of the window above: past its end (from now), the job is parked unrun.
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("remind", None, run_at=at(T0 + HOUR_MS), start_within_ms=900_000)
    assert q.reschedule(job_id, run_at=at(T0 - HOUR_MS)) == "rescheduled"
    clock.set_ms(T0 + 900_000 + 1)
    assert q.claim("w").jobs == []
    assert q.status(job_id) == "dead"


# -- stale workers ---------------------------------------------------------------------------


def test_a_reaped_worker_cannot_settle_or_move_a_job_rescheduled_after_its_lapse(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", None, max_attempts=3)
    (old,) = q.claim("A", lease_ms=1_000).jobs
    clock.set_ms(T0 + 5_000)
    assert q.claim("B", limit=0).jobs == []  # reaps the lapsed lease: due again
    assert q.reschedule(job_id, delay_ms=HOUR_MS) == "rescheduled"
    run_at = T0 + 5_000 + HOUR_MS
    with pytest.raises(StaleToken):
        q.complete(job_id, old.token, "late")
    with pytest.raises(StaleToken):
        q.fail(job_id, old.token, ERR, delay_ms=0)  # would bring it back to now
    assert q.heartbeat([(job_id, old.token)])[1] == {job_id: "stale"}
    assert q.release([(job_id, old.token)]) == ["stale"]
    assert q.get_job(job_id).run_at_ms == run_at and q.status(job_id) == "scheduled"
    clock.set_ms(run_at - 1)
    assert q.claim("B").jobs == []
    clock.set_ms(run_at)
    (new,) = q.claim("B").jobs
    assert new.id == job_id and new.fence > old.fence


def test_a_resent_fail_does_not_undo_a_reschedule(client: redis.Redis, q: Queue) -> None:
    job_id = q.enqueue("t", None, max_attempts=3)
    (job,) = q.claim("A").jobs
    first = q.fail(job_id, job.token, ERR, delay_ms=HOUR_MS)
    assert first.status == "retry"
    assert q.reschedule(job_id, delay_ms=0) == "rescheduled"
    moved = client.zscore(q.keys.due, job_id)
    # The worker's answer was lost; it re-sends: the same answer, and the job stays moved.
    assert q.fail(job_id, job.token, ERR, delay_ms=HOUR_MS) == first
    assert client.zscore(q.keys.due, job_id) == moved and q.status(job_id) == "due"
    assert [j.id for j in q.claim("B").jobs] == [job_id]


def test_a_lapsed_lease_not_yet_reaped_is_not_moved_and_a_cancel_refuses_its_worker(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    job_id = q.enqueue("t", None)
    (old,) = q.claim("A", lease_ms=1_000).jobs
    clock.set_ms(T0 + 5_000)  # lapsed; no claim has reaped it
    before = dump_queue(client, q)
    assert q.reschedule(job_id, delay_ms=0) == "leased"
    assert run_now(q, job_id) == "leased"
    assert dump_queue(client, q) == before
    assert q.cancel(job_id) == "leased"
    with pytest.raises(JobCancelled):
        q.complete(job_id, old.token, "late")
    assert q.heartbeat([(job_id, old.token)])[1] == {job_id: "cancelled"}
    assert q.status(job_id) == "cancelled" and q.reschedule(job_id, delay_ms=0) == "cancelled"


def test_a_job_given_back_and_debounced_refuses_the_old_token(
    client: redis.Redis, q: Queue
) -> None:
    first = q.enqueue("digest", {"v": 1}, key="d", debounce=True)
    (old,) = q.claim("A").jobs
    assert q.release([(first, old.token)]) == ["released"]  # a graceful stop's prefetch
    assert q.enqueue("digest", {"v": 2}, key="d", debounce=True, delay_ms=HOUR_MS) == first
    scheduled = client.zscore(q.keys.due, first)
    with pytest.raises(StaleToken):
        q.complete(first, old.token, "late")
    with pytest.raises(StaleToken):
        q.fail(first, old.token, ERR, delay_ms=0)
    assert q.release([(first, old.token)]) == ["released"]  # a re-sent release: same answer
    assert client.zscore(q.keys.due, first) == scheduled and q.status(first) == "scheduled"
    assert q.claim("B").jobs == []


# -- refusals change nothing -------------------------------------------------------------------


def _not_waiting(q: Queue) -> dict[str, str]:
    """A job in each state a move refuses, by the word the refusal answers."""
    leased = q.enqueue("t", None, job_id="leased")
    done = q.enqueue("t", None, job_id="done")
    dead = q.enqueue("t", None, job_id="dead")
    cancelled = q.enqueue("t", None, job_id="cancelled", delay_ms=HOUR_MS)
    got = {j.id: j for j in q.claim("w", limit=3).jobs}
    assert set(got) == {leased, done, dead}
    q.complete(done, got[done].token)
    q.fail(dead, got[dead].token, ERR, retryable=False)
    q.cancel(cancelled)
    parent = q.enqueue("t", None, job_id="parent", delay_ms=HOUR_MS)
    child = q.enqueue("t", None, job_id="child", after=[parent])
    q.enqueue("t", None, job_id="k1", concurrency_key="k", concurrency_limit=1)
    by_key = q.enqueue("t", None, job_id="k2", concurrency_key="k", concurrency_limit=1)
    q.enqueue("t", None, job_id="r1", rate_limit="1/1h", rate_key="r")
    by_rate = q.enqueue("t", None, job_id="r2", rate_limit="1/1h", rate_key="r")
    assert {j.id for j in q.claim("w", limit=10).jobs} == {"k1", "r1"}
    assert {q.status(j) for j in (child, by_key, by_rate)} == {"held"}
    return {leased: "leased", done: "done", dead: "dead", cancelled: "cancelled",
            child: "held", by_key: "held", by_rate: "held"}  # fmt: skip


def test_every_move_of_a_job_that_is_not_waiting_answers_why_and_writes_nothing(
    client: redis.Redis, q: Queue
) -> None:
    words = _not_waiting(q)
    before = dump_queue(client, q)
    for job_id, word in words.items():
        asked = {
            "now": run_now(q, job_id),
            "delay 0": q.reschedule(job_id, delay_ms=0),
            "later": q.reschedule(job_id, delay_ms=HOUR_MS),
            "at": q.reschedule(job_id, run_at=datetime.now(UTC) + timedelta(days=1)),
        }
        assert set(asked.values()) == {word}, (job_id, asked)
    assert dump_queue(client, q) == before


def test_a_cancel_of_a_finished_job_answers_its_state_and_writes_nothing(
    client: redis.Redis, q: Queue
) -> None:
    words = {j: w for j, w in _not_waiting(q).items() if w in ("done", "dead", "cancelled")}
    before = dump_queue(client, q)
    assert {j: q.cancel(j) for j in words} == words
    assert dump_queue(client, q) == before


def test_a_child_rescheduled_once_its_parent_is_done_waits_for_its_new_time(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    parent = q.enqueue("t", None)
    child = q.enqueue("t", None, after=[parent])
    assert q.reschedule(child, delay_ms=0) == "held"  # its parent has not run
    (p,) = q.claim("w").jobs
    q.complete(parent, p.token)
    assert q.status(child) == "due"
    assert q.reschedule(child, delay_ms=10_000) == "rescheduled"
    clock.set_ms(T0 + 9_999)
    assert q.claim("w").jobs == []
    clock.set_ms(T0 + 10_000)
    assert [j.id for j in q.claim("w").jobs] == [child]


def test_a_debounced_call_never_replaces_a_job_still_waiting_for_its_parent(q: Queue) -> None:
    # The key names a job held by its parent: no attempt started, yet it is not replaced (its
    # wait would be lost); the call makes a new job and the held one still runs after its parent.
    parent = q.enqueue("t", None, delay_ms=HOUR_MS)
    child = q.enqueue("digest", {"v": 1}, key="d", after=[parent])
    newer = q.enqueue("digest", {"v": 2}, key="d", debounce=True)
    assert newer != child
    assert (q.status(child), q.status(newer)) == ("held", "due")
    assert q.reschedule(parent, delay_ms=0) == "rescheduled"
    (p, n) = sorted(q.claim("w", limit=5).jobs, key=lambda j: j.id != parent)
    assert (p.id, n.id) == (parent, newer)
    q.complete(parent, p.token)
    (c,) = q.claim("w").jobs
    assert (c.id, c.payload()) == (child, {"v": 1})


# -- every client refuses bad times alike -------------------------------------------------

BAD_WHEN: list[dict[str, Any]] = [
    {},
    {"delay_ms": True},
    {"delay_ms": False},
    {"delay_ms": float("nan")},
    {"delay_ms": 1.0},
    {"delay_ms": -1},
    {"delay_ms": 3650 * 86_400_000 + 1},
    {"delay_ms": 10**30},
    {"delay_ms": "0"},
    {"run_at": datetime(2030, 1, 1)},  # naive
    {"run_at": datetime(2300, 1, 1, tzinfo=UTC)},
    {"run_at": T0},  # epoch ms, not a datetime
    {"delay_ms": 0, "run_at": datetime.now(UTC)},
]


@pytest.mark.pq(partitions=2, suffix="-p")
def test_every_client_refuses_a_bad_time_and_moves_nothing(
    client: redis.Redis, redis_url: str, q: Queue, pq: PartitionedQueue
) -> None:
    job_id = q.enqueue("t", None, delay_ms=HOUR_MS)
    pid = pq.enqueue("t", None, delay_ms=HOUR_MS)
    before = (dump_queue(client, q), [dump_queue(client, p) for p in pq.parts])

    for when in BAD_WHEN:
        with pytest.raises(BadArgument):
            q.reschedule(job_id, **when)
        with pytest.raises(BadArgument):
            pq.reschedule(pid, **when)

    async def main() -> list[str]:
        ac = connect_async(redis_url)
        try:
            aq = AsyncQueue(ac, q.name)
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            refused = []
            for when in BAD_WHEN:
                for one, jid in ((aq, job_id), (apq, pid)):
                    try:
                        await one.reschedule(jid, **when)
                    except BadArgument:
                        refused.append("refused")
                    else:
                        refused.append(f"accepted {when}")
            return refused
        finally:
            await ac.aclose()

    assert asyncio.run(main()) == ["refused"] * (2 * len(BAD_WHEN))
    assert before == (dump_queue(client, q), [dump_queue(client, p) for p in pq.parts])


@pytest.mark.pq(partitions=2, suffix="-p")
def test_every_client_answers_the_same_words_for_a_move(
    redis_url: str, q: Queue, pq: PartitionedQueue
) -> None:
    def made(enqueue: Any) -> list[str]:
        parent = enqueue("t", None, delay_ms=HOUR_MS)
        return [parent, enqueue("t", None, after=[parent])]

    plain, parted = made(q.enqueue), made(pq.enqueue)
    sync = [q.reschedule(plain[1], delay_ms=0), pq.reschedule(parted[1], delay_ms=0)]

    async def main() -> list[str]:
        ac = connect_async(redis_url)
        try:
            aq = AsyncQueue(ac, q.name)
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            return [await aq.reschedule(plain[1], delay_ms=0),
                    await apq.reschedule(parted[1], delay_ms=0),
                    await aq.reschedule(plain[0], delay_ms=0),
                    await apq.reschedule(parted[0], delay_ms=0)]  # fmt: skip
        finally:
            await ac.aclose()

    assert sync + asyncio.run(main()) == ["held"] * 4 + ["rescheduled"] * 2
    assert {q.status(plain[0]), pq.status(parted[0])} == {"due"}


# -- the CLI ---------------------------------------------------------------------------------


def test_the_cli_says_why_a_held_job_is_not_moved_and_refuses_a_bad_delay(
    client: redis.Redis, redis_url: str, q: Queue
) -> None:
    parent = q.enqueue("t", None, delay_ms=HOUR_MS)
    child = q.enqueue("t", None, after=[parent])
    base = ["jobs", "reschedule", "--url", redis_url, "-q", q.name]
    before = dump_queue(client, q)
    r = CliRunner().invoke(main, [*base, child, "--now"])
    assert (r.exit_code, r.output) == (1, f"{child}: held\n")
    r = CliRunner().invoke(main, [*base, child, "--in", "5m", "--json"])
    assert r.exit_code == 1 and json.loads(r.output)["status"] == "held"
    for bad in (["--in", "3651d"], ["--in", "-5s"], ["--in", "nan"], ["--at", "2030-01-01T09:00"]):
        r = CliRunner().invoke(main, [*base, parent, *bad])
        assert r.exit_code == 2, (bad, r.output)
    assert dump_queue(client, q) == before


def test_fail_refuses_a_bad_retry_delay_and_the_lease_stands(client: redis.Redis, q: Queue) -> None:
    # What a RetryLater's delay becomes: checked again at `fail`, the job left leased.
    job_id = q.enqueue("t", None, max_attempts=3)
    (job,) = q.claim("w").jobs
    before = dump_queue(client, q)
    for bad in (True, False, float("nan"), 1.5, -1, 3650 * 86_400_000 + 1, 10**30, "0"):
        with pytest.raises(BadArgument, match="delay_ms"):
            q.fail(job_id, job.token, ERR, delay_ms=bad)  # type: ignore[arg-type]
    assert dump_queue(client, q) == before
    assert q.heartbeat([(job_id, job.token)])[1] == {job_id: "held"}


# -- the dashboard's Run now --------------------------------------------------------------------


def _run_now_page(web: Any, queue: str, job_id: str) -> tuple[str, str]:
    """(the redirect's location, the page it leads to) of a Run now with a valid token."""
    token = csrf_of(web.get(f"/queues/{queue}/dead").text)
    code, location = post(web, f"/queues/{queue}/jobs/{job_id}/run-now", token)
    assert code == 303, (code, location)
    return location, web.get(location).text


def test_run_now_in_a_paused_queue_says_so_and_no_claim_takes_it_until_resumed(
    client: redis.Redis, q: Queue
) -> None:
    job_id = q.enqueue("t", None, delay_ms=HOUR_MS)
    q.pause()
    with make_client(client, q) as web:
        location, shown = _run_now_page(web, q.name, job_id)
    assert "notice=moved-now-paused" in location and "the queue is paused" in shown
    assert q.status(job_id) == "due" and q.claim("w").jobs == []
    q.resume()
    assert [j.id for j in q.claim("w").jobs] == [job_id]


def test_run_now_of_a_job_waiting_for_its_parent_changes_nothing_and_says_held(
    client: redis.Redis, q: Queue
) -> None:
    parent = q.enqueue("t", None, delay_ms=HOUR_MS)
    child = q.enqueue("t", None, after=[parent])
    before = dump_queue(client, q)
    with make_client(client, q) as web:
        assert 'id="run-now"' not in web.get(f"/queues/{q.name}/jobs/{child}").text
        location, shown = _run_now_page(web, q.name, child)  # a stale page's button
    assert "notice=not-moved-held" in location and "flow control holds the job" in shown
    assert dump_queue(client, q) == before
