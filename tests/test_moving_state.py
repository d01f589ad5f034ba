"""A job in a source queue's `moving` set (`scheduler queue move` took it out of `due`: for a
moment, or until an interrupted move is rerun; scheduler/admin/queue_move.py) reads the one word
`moving` everywhere a state is shown: status() / get_job() (JobState.MOVING: reported, never
stored), `counts` (QueueCounts.moving), `scheduler stats`, `scheduler jobs show` and the
dashboard's queue and job pages; the same from AsyncQueue and the partitioned twins.
`reschedule` answers `moving` (it moves nothing, as for `held`); `cancel` still answers
`missing` (tests/test_queue_move_audit.py). Before, a job never claimed raised BadArgument (an
unreadable state `?`), a retried one read `due`, and the counts counted neither."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from scheduler import AsyncQueue, JobNotFound, JobState, PartitionedQueue, Queue
from scheduler.admin.queue_move import QueueMove
from scheduler.cli.main import main
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.ids import new_job_id
from scheduler.dashboard import Auth, create_app
from tests.fixtures.move_queues import made_queues
from tests.fixtures.partitioned import MakePq
from tests.test_dashboard import make_client
from tests.test_dashboard_run_now import run_now

HOUR_MS = 3_600_000


@pytest.fixture
def queues(client: redis.Redis) -> Iterator[tuple[Queue, Queue]]:
    with made_queues(client, "mvs-src-", "mvs-dst-") as (src, dst):
        yield src, dst


def _moving(client: redis.Redis, src: Queue, dst: Queue) -> tuple[QueueMove, dict[str, str]]:
    """Step 1 of a move (its batch in the source's `moving` set): a job never claimed, a retried
    one (its hash stores `due`), one scheduled later; a due and a leased one stay."""
    src.enqueue("mvs.task", job_id="leased")
    assert [j.id for j in src.claim("w", limit=1).jobs] == ["leased"]
    src.enqueue("mvs.task", job_id="retried", max_attempts=3)
    (lease,) = src.claim("w", limit=1).jobs
    src.fail("retried", lease.token, ("E", "boom", ""), delay_ms=0)  # a retry, due now
    src.enqueue("mvs.task", job_id="fresh")
    src.enqueue("mvs.task", job_id="later", delay_ms=HOUR_MS)
    src.enqueue("mvs.task", job_id="stays")
    ids = {n: n for n in ("fresh", "retried", "later", "leased")}
    m = QueueMove(client, src.name, dst.name)
    taken = m.take(m.src[0], ["fresh", "retried", "later"])
    assert [e.id for e in taken] == ["fresh", "retried", "later"]
    return m, ids


def test_status_and_get_job_report_a_moving_job_as_moving(
    client: redis.Redis, queues: tuple[Queue, Queue]
) -> None:
    src, dst = queues
    m, ids = _moving(client, src, dst)
    for name in ("fresh", "retried", "later"):
        assert src.status(ids[name]) is JobState.MOVING, name
        job = src.get_job(ids[name])
        assert job.state == "moving", name
        assert job.run_at_ms is not None, name  # its run time is still read
    assert src.get_job(ids["retried"]).stored_state == "due"  # reported, never stored
    assert src.status(ids["leased"]) is JobState.LEASED
    assert {
        j.id: j.state for j in src._run(src.ops.get_jobs([ids["fresh"], ids["retried"], "stays"]))
    } == {
        ids["fresh"]: "moving",
        ids["retried"]: "moving",
        "stays": "due",
    }
    # Not here to cancel, as before; reschedule moves nothing and says why.
    for name in ("fresh", "retried"):
        with pytest.raises(JobNotFound):
            src.cancel(ids[name])
        assert src.reschedule(ids[name], delay_ms=HOUR_MS) == "moving", name
        assert src._run(src.ops.run_now(ids[name])) == "moving", name
    assert src._run(src.ops.run_now("later")) == "moving"
    assert client.zscore(src.keys.prefix + "moving", "later") is not None  # nothing moved
    # Once the move finished: gone from the source, waiting on the destination.
    taken = [ids["fresh"], ids["retried"], "later"]
    entries = m.take(m.src[0], taken)
    assert m.put(entries) == "ccc"
    assert m.finish(m.src[0], taken) == 3
    with pytest.raises(JobNotFound):
        src.status(ids["fresh"])
    with pytest.raises(JobNotFound):
        src.reschedule(ids["retried"], delay_ms=1)
    assert dst.status(ids["fresh"]) is JobState.DUE and dst.status("later") is JobState.SCHEDULED


def test_counts_count_moving_jobs_apart(client: redis.Redis, queues: tuple[Queue, Queue]) -> None:
    src, dst = queues
    _moving(client, src, dst)
    c = src.counts()
    assert (c.due, c.scheduled, c.leased, c.moving) == (1, 0, 1, 3)
    assert dst.counts().moving == 0


def test_a_moving_set_of_another_type_reads_as_none(
    client: redis.Redis, queues: tuple[Queue, Queue]
) -> None:
    # Edited by hand (doctor names it `moving-damaged`): the queue's counts and jobs still read.
    src, _ = queues
    src.enqueue("mvs.task", job_id="j")
    client.set(src.keys.prefix + "moving", "x")
    assert src.counts().moving == 0
    assert src.status("j") is JobState.DUE


def test_stats_shows_moving_only_when_there_are_some(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue]
) -> None:
    src, dst = queues
    _moving(client, src, dst)
    dst.enqueue("mvs.task", job_id="d")
    runner = CliRunner(env={"COLUMNS": "250"})
    for q, n in ((src, 3), (dst, 0)):
        got = runner.invoke(main, ["stats", "--json", "-q", q.name, "--url", redis_url])
        assert got.exit_code == 0, got.output
        (row,) = json.loads(got.stdout)["queues"]
        assert row["moving"] == n
        human = runner.invoke(main, ["stats", "-q", q.name, "--url", redis_url])
        assert human.exit_code == 0, human.output
        assert ("(3 moving)" in human.stdout) == (n == 3), human.stdout
        assert ("moving" in human.stdout) == (n == 3), human.stdout


def test_jobs_show_says_moving(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue]
) -> None:
    src, dst = queues
    _, ids = _moving(client, src, dst)
    runner = CliRunner(env={"COLUMNS": "200"})
    for name in ("fresh", "retried"):
        args = ["jobs", "show", "--json", "-q", src.name, ids[name], "--url", redis_url]
        got = runner.invoke(main, args)
        assert got.exit_code == 0, got.output
        shown = json.loads(got.stdout)
        assert shown["state"] == "moving" and shown["places"] == ["moving"], name
    human = runner.invoke(main, ["jobs", "show", "-q", src.name, ids["fresh"], "--url", redis_url])
    assert human.exit_code == 0, human.output
    assert "moving" in human.stdout and "late by" not in human.stdout
    args = ["jobs", "reschedule", "-q", src.name, ids["retried"], "--now", "--url", redis_url]
    again = runner.invoke(main, args)
    assert again.exit_code == 1 and again.stdout == f"{ids['retried']}: moving\n", again.output


def test_the_dashboard_shows_moving_jobs(client: redis.Redis, queues: tuple[Queue, Queue]) -> None:
    src, dst = queues
    _, ids = _moving(client, src, dst)
    with make_client(client, src) as web:
        page = web.get(f"/queues/{src.name}").text
        api = web.get(f"/queues/{src.name}/api").json()
        job = web.get(f"/queues/{src.name}/jobs/{ids['retried']}").text
        fresh = web.get(f"/queues/{src.name}/jobs/{ids['fresh']}").text
    assert api["moving"] == 3
    assert 'id="moving"' in page and 'data-live="moving">3<' in page
    assert 'id="moving" data-moving-show hidden' not in page
    for text in (job, fresh):
        assert 'class="state state-moving">moving<' in text
        assert 'data-reason="moving"' in text
        assert 'data-reason="waiting-for-worker"' not in text
        assert "/cancel" not in text and "/run-now" not in text
    with make_client(client, dst) as web:
        other = web.get(f"/queues/{dst.name}").text
    assert 'id="moving" data-moving-show hidden' in other


def test_a_run_now_posted_for_a_moving_job_says_it_is_moving(
    client: redis.Redis, queues: tuple[Queue, Queue]
) -> None:
    # The job page drawn before the move took it (a stale Run now): nothing changes, and the
    # notice names the state, rather than an error page for an answer it did not know.
    src, dst = queues
    _moving(client, src, dst)
    with make_client(client, src) as web:
        code, location, shown = run_now(web, src.name, "later")
    assert code == 303 and "notice=not-moved" in location and "state=moving" in location
    assert "Nothing changed: the job is moving." in shown
    assert client.zscore(src.keys.prefix + "moving", "later") is not None


def test_the_async_and_partitioned_clients_report_moving(
    client: redis.Redis, redis_url: str, queues: tuple[Queue, Queue], make_pq: MakePq
) -> None:
    plain, dst = queues
    pq: PartitionedQueue = make_pq(partitions=2, suffix="-p")
    ids = [pq.enqueue("mvs.task", None, job_id=f"p{i % 2}.{new_job_id()}") for i in range(4)]
    m = QueueMove(client, pq.name, dst.name)
    for part in m.src:
        part_ids = [i for i in ids if pq.part_of(i).name == part.name]
        assert len(m.take(part, part_ids)) == len(part_ids) == 2  # both partitions
    plain.enqueue("mvs.task", job_id="a")
    m2 = QueueMove(client, plain.name, dst.name)
    assert len(m2.take(m2.src[0], ["a"])) == 1
    assert {pq.status(i) for i in ids} == {JobState.MOVING}
    assert {pq.get_job(i).state for i in ids} == {"moving"}
    assert pq.counts().moving == 4 and pq.counts().due == 0
    assert pq.reschedule(ids[0], delay_ms=1) == "moving"

    async def run() -> tuple[object, ...]:
        ac = connect_async(redis_url)
        try:
            aq = AsyncQueue(ac, plain.name)
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            return (
                await aq.status("a"),
                (await aq.get_job("a")).state,
                (await aq.counts()).moving,
                await aq.reschedule("a", delay_ms=1),
                {await apq.status(i) for i in ids},
                (await apq.counts()).moving,
                await apq.reschedule(ids[1], delay_ms=1),
            )
        finally:
            await ac.aclose()

    assert asyncio.run(run()) == ("moving", "moving", 1, "moving", {"moving"}, 4, "moving")
    with TestClient(create_app(client=client, queues=[pq.name], auth=Auth())) as web:
        assert web.get(f"/queues/{pq.name}/api").json()["moving"] == 4
        page = web.get(f"/queues/{pq.name}/jobs/{ids[0]}").text
    assert 'class="state state-moving">moving<' in page


def test_the_worker_metrics_export_moving_as_a_state_of_the_queue_gauge() -> None:
    # scheduler_queue_jobs{state} is a queue's depth per place; a queue move's jobs are in
    # none of the others, so without their own state a dashboard sum showed them nowhere.
    from prometheus_client import generate_latest

    from scheduler.core.models import QueueCounts
    from scheduler.worker.metrics import WorkerMetrics

    m = WorkerMetrics()
    m.set_depth("q", QueueCounts(10, 1, 0, 0, 0, None, 0, moving=3))
    text = generate_latest(m.registry).decode()
    assert 'scheduler_queue_jobs{queue="q",state="moving"} 3.0' in text
