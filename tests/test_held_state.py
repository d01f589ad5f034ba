"""A waiting job set aside by flow control (parents not done, a concurrency key full, a rate
window: the flow:held ZSET) is reported as `JobState.HELD` ('held') by status() and get_job(),
the word cancel answers and `jobs list --state held` lists it under, whatever its run_at: not
DUE ("a worker may claim it now", false for it) nor SCHEDULED. The same from AsyncQueue, the
partitioned twins, `scheduler jobs show` and the dashboard's job page. Never stored: the job
hash keeps `due` (Job.stored_state). Earlier versions reported 'due' (or 'scheduled')."""

from __future__ import annotations

import asyncio
import json

import redis
from click.testing import CliRunner

from scheduler import AsyncQueue, JobState, PartitionedQueue, Queue
from scheduler.cli.job_cancel import WAITING
from scheduler.cli.main import main
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.dashboard.actions import CANCELLABLE
from scheduler.dashboard.reasons import CAN_CANCEL
from scheduler.dashboard.render import STATES
from scheduler.operations.inspecting import LISTABLE
from tests.conftest import delete_queue
from tests.fixtures.partitioned import delete_partitioned
from tests.test_dashboard import make_client

HOUR_MS = 3_600_000


def _held_jobs(q: Queue) -> dict[str, str]:
    """One job held each way flow control holds one, and a due and a scheduled one beside."""
    parent = q.enqueue("t", None, delay_ms=HOUR_MS)
    q.enqueue("c", None, concurrency_key="k", concurrency_limit=1)
    by_key = q.enqueue("c", None, concurrency_key="k", concurrency_limit=1)
    q.enqueue("r", None, rate_limit=(1, HOUR_MS), rate_key="r")
    by_rate = q.enqueue("r", None, rate_limit=(1, HOUR_MS), rate_key="r")
    assert len(q.claim("w1", limit=10).jobs) == 2  # one of key k, one of rate key r
    return {
        "parents": q.enqueue("t", None, after=[parent]),
        # Its run_at is later too: held, as `jobs list --state held` lists it.
        "parents-later": q.enqueue("t", None, after=[parent], delay_ms=HOUR_MS),
        "key": by_key,
        "rate": by_rate,
        "scheduled": parent,
        "due": q.enqueue("t", None),
    }


def _want(jobs: dict[str, str]) -> dict[str, str]:
    return {n: "held" for n in jobs} | {"scheduled": "scheduled", "due": "due"}


def test_status_and_get_job_report_a_held_job_as_held(q: Queue) -> None:
    jobs = _held_jobs(q)
    held = {j.id for j in q.list_jobs("held")}
    assert held == {jobs[n] for n in ("parents", "parents-later", "key", "rate")}
    assert {n: q.status(i) for n, i in jobs.items()} == _want(jobs)
    assert q.status(jobs["key"]) is JobState.HELD
    got = q.get_job(jobs["parents-later"])
    assert got.state == JobState.HELD and got.stored_state == "due"  # reported, never stored
    assert {j.id: j.state for j in q.list_jobs("held")} == dict.fromkeys(held, "held")
    assert {j.id: j.state for j in q._run(q.ops.get_jobs(list(jobs.values())))} == {
        i: _want(jobs)[n] for n, i in jobs.items()
    }
    assert q.cancel(jobs["rate"]) == "held" and q.status(jobs["rate"]) == "cancelled"


def test_a_released_hold_reads_due(q: Queue) -> None:
    first = q.enqueue("c", None, concurrency_key="k", concurrency_limit=1)
    second = q.enqueue("c", None, concurrency_key="k", concurrency_limit=1)
    (claimed,) = q.claim("w1", limit=10).jobs
    assert claimed.id == first and q.status(second) == "held"
    q.complete(claimed.id, claimed.token, None)  # the key's slot frees: the held job is due
    assert q.status(second) == "due"


def test_the_async_and_partitioned_clients_report_held(
    client: redis.Redis, redis_url: str, queue_name: str
) -> None:
    pq = PartitionedQueue.create(client, queue_name, partitions=2)
    try:
        later = pq.enqueue("t", None, delay_ms=HOUR_MS, key="a")
        child = pq.enqueue("t", None, after=[later])
        assert pq.status(child) == "held" and pq.get_job(child).state == "held"
        assert pq.status(later) == "scheduled"

        async def run() -> tuple[str, ...]:
            ac = connect_async(redis_url)
            aq = AsyncQueue(ac, queue_name + "-plain")
            try:
                apq = await AsyncPartitionedQueue.open(ac, queue_name)
                later = await apq.enqueue("t", None, delay_ms=HOUR_MS, key="b")
                child = await apq.enqueue("t", None, after=[later])
                parent = await aq.enqueue("t", None)
                plain = await aq.enqueue("t", None, after=[parent])
                return (await apq.status(child), (await apq.get_job(child)).state,
                        await aq.status(plain), (await aq.get_job(plain)).state,
                        await aq.status(parent))  # fmt: skip
            finally:
                delete_queue(client, Queue(client, queue_name + "-plain"))
                await ac.aclose()

        assert asyncio.run(run()) == ("held", "held", "held", "held", "due")
    finally:
        delete_partitioned(client, pq)


def test_jobs_show_says_held_with_its_flow_reason(redis_url: str, q: Queue) -> None:
    jobs = _held_jobs(q)
    runner = CliRunner(env={"COLUMNS": "200"})
    shown = {}
    for name in ("parents-later", "key", "due"):
        args = ["jobs", "show", "--json", "-q", q.name, jobs[name], "--url", redis_url]
        got = runner.invoke(main, args)
        assert got.exit_code == 0, got.output
        shown[name] = json.loads(got.stdout)
    assert shown["key"]["state"] == "held" and shown["key"]["stored_state"] == "due"
    assert shown["key"]["flow"] == "limited by key k (1 leased)"
    assert shown["parents-later"]["state"] == "held"
    assert shown["parents-later"]["flow"] == "waiting for 1 jobs"
    assert shown["due"]["state"] == "due" and shown["due"]["flow"] is None
    human = runner.invoke(main, ["jobs", "show", "-q", q.name, jobs["key"], "--url", redis_url])
    assert human.exit_code == 0, human.output
    assert "held" in human.stdout and "run in" not in human.stdout and "late by" in human.stdout


def test_the_dashboards_job_page_says_held_and_why(client: redis.Redis, q: Queue) -> None:
    jobs = _held_jobs(q)
    with make_client(client, q) as web:
        page = {n: web.get(f"/queues/{q.name}/jobs/{jobs[n]}").text for n in jobs}
    for name, code in (("parents", "waiting-for-parents"), ("parents-later", "waiting-for-parents"),
                       ("key", "limited-by-key"), ("rate", "rate-window")):  # fmt: skip
        assert 'class="state state-held">held<' in page[name], name
        assert f'data-reason="{code}"' in page[name], name
        assert 'data-reason="waiting-for-worker"' not in page[name], name
        assert 'data-reason="no-live-worker"' not in page[name], name
        assert "/cancel" in page[name], name  # a held job can be cancelled
        assert "/run-now" not in page[name], name  # reschedule moves no held job
    assert 'data-reason="scheduled"' in page["parents-later"]  # its run_at is later too
    assert 'data-reason="scheduled"' not in page["parents"]
    assert 'class="state state-due">due<' in page["due"]
    assert 'class="state state-scheduled">scheduled<' in page["scheduled"]


def test_the_waiting_words_are_one_set() -> None:
    """JobState's waiting words are the ones cancel answers, `jobs list --state` and the
    dashboard's Cancel take, and the dashboard has a badge for each state."""
    waiting = {JobState.DUE, JobState.SCHEDULED, JobState.HELD}
    assert waiting <= set(LISTABLE)
    assert set(WAITING) == waiting
    assert CANCELLABLE == waiting | {JobState.LEASED} == CAN_CANCEL
    assert {s.value for s in JobState} <= STATES
