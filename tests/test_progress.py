"""A running job's progress: ctx.set_progress in a handler, written with the worker's heartbeat
(lua/progress.lua) only while its run holds the lease; Queue.set_progress for a hand-driven
worker; Job.progress reads it back. Bad values are refused before anything is sent."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
import redis

from scheduler import AsyncQueue, BadArgument, InvalidPayload, JobContext, Queue, Registry
from scheduler.core.limits import MAX_PROGRESS_BYTES
from scheduler.core.progress import ProgressText
from scheduler.core.scripts import lua_dir
from scheduler.worker import WorkerSettings
from tests.conftest import Clock, dump_queue
from tests.embedded_worker import run_until


def _leased(q: Queue) -> tuple[str, str]:
    job_id = q.enqueue("report.build", {"n": 1})
    (job,) = q.claim("w1", limit=1, lease_ms=10_000).jobs
    return job_id, job.token


def test_progress_of_a_held_lease_is_read_back_and_stays_once_done(q: Queue) -> None:
    job_id, token = _leased(q)
    assert q.get_job(job_id).progress is None
    assert q.set_progress(job_id, token, {"done": 40, "of": 100}) == "held"
    job = q.get_job(job_id)
    assert job.progress == {"done": 40, "of": 100}
    assert job.progress_ms is not None and job.progress_ms > 0
    assert q.set_progress(job_id, token, "rendering") == "held"  # any JSON value, latest wins
    q.complete(job_id, token, 7)
    assert q.get_job(job_id).progress == "rendering"


def test_a_lapsed_or_superseded_lease_writes_no_progress(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(1_000)
    job_id = q.enqueue("report.build", {})
    (first,) = q.claim("w1", limit=1, lease_ms=1_000).jobs
    clock.set_ms(2_500)  # the lease ended at 2,000 and is not yet reaped
    assert q.set_progress(job_id, first.token, 1) == "expired"
    (second,) = q.claim("w2", limit=1, lease_ms=1_000).jobs  # reaped and leased again
    assert second.token != first.token
    assert q.set_progress(job_id, first.token, 2) == "stale"
    assert q.get_job(job_id).progress is None
    assert q.set_progress(job_id, second.token, 3) == "held"
    assert q.get_job(job_id).progress == 3
    q.cancel(job_id)
    assert q.set_progress(job_id, second.token, 4) == "cancelled"
    assert q.set_progress("no-such-job-0001", second.token, 5) == "missing"
    assert q.get_job(job_id).progress == 3


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({1, 2}, InvalidPayload),  # not JSON
        (float("nan"), InvalidPayload),
        ("\ud800", InvalidPayload),  # not UTF-8
        ("x" * MAX_PROGRESS_BYTES, InvalidPayload),  # its JSON text has two quotes more
    ],
)
def test_a_bad_progress_is_refused_and_writes_nothing(
    client: redis.Redis, q: Queue, value: Any, error: type[Exception]
) -> None:
    job_id, token = _leased(q)
    before = dump_queue(client, q)
    with pytest.raises(error):
        q.set_progress(job_id, token, value)
    ctx = JobContext.for_test()
    with pytest.raises(error):
        ctx.set_progress(value)
    assert ctx.progress is None
    assert dump_queue(client, q) == before


def test_the_script_refuses_an_oversized_progress_before_any_write(
    client: redis.Redis, q: Queue
) -> None:
    """lua/progress.lua's own bound (the same number as limits.py): a client that skips the
    check (ProgressText is sent as it is) writes nothing, not even the first triple's."""
    text = (lua_dir() / "progress.lua").read_text()
    assert f"MAX_PROGRESS_BYTES = {MAX_PROGRESS_BYTES}" in text
    job_id, token = _leased(q)
    before = dump_queue(client, q)
    big = ProgressText('"' + "x" * MAX_PROGRESS_BYTES + '"')
    with pytest.raises(BadArgument, match="progress"):
        q._run(q.ops.progress([(job_id, token, ProgressText("1")), (job_id, token, big)]))
    assert dump_queue(client, q) == before


def test_a_handler_s_progress_reaches_the_job_while_it_runs(redis_url: str, q: Queue) -> None:
    """Sync (in a thread) and async handlers: the value shows in get_job while the handler
    still runs, written by the heartbeat; the handler ends once the test has seen it."""
    registry = Registry()
    seen = {"sync": threading.Event(), "async": threading.Event()}

    @registry.task("report.sync")
    def build_sync(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"step": 1})
        ctx.set_progress({"step": 2})  # only the latest is sent
        assert seen["sync"].wait(10)

    @registry.task("report.async")
    async def build_async(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress(["half", 0.5])
        while not seen["async"].is_set():
            await asyncio.sleep(0.01)

    ids = {"sync": q.enqueue("report.sync", {}), "async": q.enqueue("report.async", {})}
    want = {"sync": {"step": 2}, "async": ["half", 0.5]}

    def progressed() -> bool:
        for kind, job_id in ids.items():
            job = q.get_job(job_id)
            if job.state == "leased" and job.progress == want[kind]:
                seen[kind].set()
        return all(q.get_job(i).state == "done" for i in ids.values())

    # The progress goes with the 50 ms heartbeats; a lapse is not the scenario (a 30 s lease).
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=30_000, grace_s=0)
    assert run_until(redis_url, registry, settings, progressed)
    assert all(e.is_set() for e in seen.values())
    assert q.get_job(ids["sync"]).progress == {"step": 2}


def test_async_queue_set_progress(redis_url: str, queue_name: str) -> None:
    async def main() -> tuple[str, Any]:
        async with AsyncQueue.from_url(redis_url, queue_name) as aq:
            job_id = await aq.enqueue("report.build", {})
            (job,) = (await aq.claim("w1", limit=1)).jobs
            status = await aq.set_progress(job_id, job.token, {"rows": 12})
            progress = (await aq.get_job(job_id)).progress
            await aq.cancel(job_id)
            return status, progress

    assert asyncio.run(main()) == ("held", {"rows": 12})


def test_jobs_show_and_the_dashboard_show_the_progress(
    redis_url: str, client: redis.Redis, q: Queue
) -> None:
    """`jobs show --json` gives it decoded with its time; the table prints it; the dashboard's
    job page renders it as text (a hostile value is escaped, never markup)."""
    from click.testing import CliRunner

    from scheduler.cli.main import main
    from tests.test_dashboard import HOSTILE, RAW_MARKERS, make_client

    job_id, token = _leased(q)
    assert q.set_progress(job_id, token, {"note": HOSTILE, "done": 3}) == "held"
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["jobs", "show", "-q", q.name, job_id, "--url", redis_url]
    shown = runner.invoke(main, [*args, "--json"], catch_exceptions=False)
    data = json.loads(shown.stdout)
    assert data["progress"] == {"note": HOSTILE, "done": 3}
    assert data["progress_ms"] == q.get_job(job_id).progress_ms
    table = runner.invoke(main, args, catch_exceptions=False).stdout
    assert "progress" in table and '"done": 3' in table
    with make_client(client, q) as web:
        page = web.get(f"/queues/{q.name}/jobs/{job_id}").text
        listed = web.get(f"/queues/{q.name}?state=leased").text  # a column of the leased tab
    cell = listed.split('class="mono progress">', 1)[1].split("</td>", 1)[0]
    assert cell.startswith("{&#34;note&#34;:&#34;&lt;script&gt;") and cell.endswith("...")
    assert not any(m in cell for m in RAW_MARKERS)
    row = page.split('id="job-progress"', 1)[1].split("</tr>", 1)[0]
    assert "&#34;done&#34;: 3" in row and "&lt;script&gt;" in row and "reported" in row
    assert not any(m in page for m in RAW_MARKERS)


def test_the_progress_set_last_before_the_handler_returns_is_kept(redis_url: str, q: Queue) -> None:
    """Sent ahead of the run's complete or fail: a job shorter than a heartbeat interval got no
    progress at all, a longer one kept an older value."""
    registry = Registry()

    @registry.task("quick")
    def quick(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress("step 1 of 2")
        ctx.set_progress("finished")

    @registry.task("broken")
    async def broken(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"failed_at": 3})
        raise RuntimeError("no")

    done, dead = q.enqueue("quick", {}), q.enqueue("broken", {}, max_attempts=1)
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=5_000, lease_ms=30_000, grace_s=0)
    assert run_until(
        redis_url, registry, settings, lambda: (q.status(done), q.status(dead)) == ("done", "dead")
    )
    assert q.get_job(done).progress == "finished"
    assert q.get_job(dead).progress == {"failed_at": 3}


def test_a_failed_heartbeat_leaves_the_progress_for_the_next_one(redis_url: str, q: Queue) -> None:
    """It was marked sent before the call: one round trip that failed lost it for the run."""
    registry = Registry()
    seen = threading.Event()

    @registry.task("long")
    async def long(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.set_progress({"stage": "download"})
        while not seen.is_set():
            await asyncio.sleep(0.01)

    failed: list[bool] = []

    def fail_the_first_progress(worker: Any) -> None:
        real = worker._send_parts

        async def send(parts: Any, ends: Any) -> Any:
            carries = any(len(p) > 2 for p in parts)  # heartbeat, counts, progress
            if carries and not failed:
                failed.append(True)
                raise redis.ConnectionError("a blip")
            return await real(parts, ends)

        worker._send_parts = send

    job_id = q.enqueue("long", {})

    def progressed() -> bool:
        job = q.get_job(job_id)
        if job.state == "leased" and job.progress == {"stage": "download"}:
            seen.set()
        return q.status(job_id) == "done"

    # The progress goes with the 50 ms heartbeats; a lapse is not the scenario (a 30 s lease).
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=30_000, grace_s=0)
    assert run_until(redis_url, registry, settings, progressed, setup=fail_the_first_progress)
    assert failed and seen.is_set()  # written while it ran, by a heartbeat after the failed one
