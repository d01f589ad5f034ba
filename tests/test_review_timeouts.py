"""Review: a job's run timeout (`timeout_ms` per job, a task's `timeout_s`), end to end with real
workers on a private Redis server, as a user relying on it would test it.

What the docs promise (README "Timeouts", docs/limits.md, scheduler/worker/__init__.py): an
async handler past its timeout is cancelled; a sync one cannot be killed, so its thread is
abandoned, its slot freed, `ctx.stopped` set and whatever it returns later dropped; either way
the attempt fails with `JobTimeout` (retried per its backoff, parked after its last), counted
and logged under the one word `timeout`. `timeout_ms` 0 means none of the job's own (the task's,
else no limit), 0 .. 7 days, refused outside with BadArgument. A SIGTERM stop waits `grace_s`
for running handlers, a quota stop (`max_jobs`) a timed job's timeout whatever the grace.

Handlers wait on events the tests set (bounded), never on sleeps; the timeouts are tens of ms.
The pool test runs `scheduler worker --processes 2` on this module's registry."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, JobSpec, Queue
from scheduler.cli.main import main
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect_async
from scheduler.core.errors import LeaseExpired
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.fixtures.polling import poll
from tests.fixtures.pools import SUPERVISORS
from tests.redis_server import RedisProcess
from tests.workers.procs import ROOT, SCHEDULER, wait_for

REG = "tests.test_review_timeouts:registry"
registry = Registry()

BOUND_S = 20.0  # every wait's liveness bound (never a verdict)


class Gates:
    """Per test: what the handlers wait on (set at the test's end whatever happens) and what
    they saw."""

    sync = threading.Event()  # sync handlers' gate
    aio: asyncio.Event | None = None  # async handlers' gate, made in the test's loop
    seen: ClassVar[list[tuple[str, str, Any]]] = []  # (job id, what, detail)
    ctxs: ClassVar[dict[str, JobContext]] = {}
    thread_done = threading.Event()  # a sync hang handler returned


def _saw(ctx: JobContext, what: str, detail: Any = None) -> None:
    Gates.seen.append((ctx.job_id, what, detail))


def _aio_gate() -> asyncio.Event:
    if Gates.aio is None:  # in a pool child: no test sets it, the handler hangs until stopped
        Gates.aio = asyncio.Event()
    return Gates.aio


@registry.task(name="to-hang")
async def hang(payload: Any, ctx: JobContext) -> str:
    _saw(ctx, "start", ctx.attempt)
    _saw(ctx, "claimed_ms", ctx.claimed_ms)
    try:
        await _aio_gate().wait()
    except asyncio.CancelledError:
        _saw(ctx, "cancelled", ctx.stop_reason)
        raise
    return "gate"


@registry.task(name="to-sync-hang")
def sync_hang(payload: Any, ctx: JobContext) -> str:
    """Does not look at ctx.stopped: a blocking call that cannot be interrupted."""
    Gates.ctxs[ctx.job_id] = ctx
    _saw(ctx, "start", ctx.attempt)
    try:
        Gates.sync.wait(BOUND_S)
    finally:
        Gates.thread_done.set()
    _saw(ctx, "returned", ctx.stop_reason)
    return "late"


@registry.task(name="to-sync-polite")
def sync_polite(payload: Any, ctx: JobContext) -> str:
    """Waits on ctx.stopped, then asks raise_if_stopped what happened."""
    _saw(ctx, "start", ctx.attempt)
    ctx.stopped.wait(BOUND_S)
    try:
        ctx.raise_if_stopped()
    except Exception as exc:
        _saw(ctx, "raised", exc)
        raise
    return "not stopped"


@registry.task(name="to-swallow")
async def swallow(payload: Any, ctx: JobContext) -> str:
    """Catches every cancellation and keeps running until the gate opens."""
    _saw(ctx, "start", ctx.attempt)
    while True:
        try:
            await _aio_gate().wait()
            _saw(ctx, "returned", ctx.stop_reason)
            return "late"
        except asyncio.CancelledError:
            _saw(ctx, "swallowed", ctx.stop_reason)


@registry.task(name="to-quick")
async def quick(payload: Any, ctx: JobContext) -> str:
    _saw(ctx, "start", ctx.attempt)
    return "ok"


@registry.task(name="to-task-default", timeout_s=0.05)
async def task_default(payload: Any, ctx: JobContext) -> str:
    """Waits for the gate (the task's own time limit: 50 ms)."""
    _saw(ctx, "start", ctx.attempt)
    try:
        await _aio_gate().wait()
    except asyncio.CancelledError:
        _saw(ctx, "cancelled", ctx.stop_reason)
        raise
    return "gate"


@registry.task(name="to-first-hangs")
async def first_hangs(payload: Any, ctx: JobContext) -> str:
    """Attempt 1 hangs (its timeout stops it); attempt 2 awaits briefly and returns."""
    _saw(ctx, "start", ctx.attempt)
    if ctx.attempt == 1:
        await _aio_gate().wait()
    await asyncio.sleep(0.01)  # the second attempt's own work: it needs some of its timeout
    return f"attempt {ctx.attempt}"


@registry.task(name="to-wait-lease")
async def wait_lease(payload: Any, ctx: JobContext) -> str:
    """Runs until the test opens the gate (the test waits past several leases first)."""
    _saw(ctx, "start", ctx.attempt)
    await _aio_gate().wait()
    return "outlived the lease"


@registry.task(name="to-sync-wait-lease")
def sync_wait_lease(payload: Any, ctx: JobContext) -> str:
    _saw(ctx, "start", ctx.attempt)
    Gates.sync.wait(BOUND_S)
    return "outlived the lease"


@registry.on_outcome
def hook(outcome: Any) -> None:
    """Every outcome the worker counts, under its word, with the recorded error type."""
    Gates.seen.append((outcome.ctx.job_id, "hook", (outcome.outcome, outcome.error_type)))


# -- fixtures and the in-process worker ---------------------------------------------------------


@pytest.fixture
def admin(module_server: RedisProcess) -> Iterator[redis.Redis]:
    c = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def rq(admin: redis.Redis) -> Iterator[Queue]:
    Gates.sync = threading.Event()
    Gates.thread_done = threading.Event()
    Gates.aio = None
    Gates.seen = []
    Gates.ctxs = {}
    yield Queue(admin, f"to-{uuid.uuid4().hex[:10]}")
    Gates.sync.set()  # abandoned threads return


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, job_id: str) -> list[str]:
        return [r.__dict__["event"] for r in self.records
                if r.__dict__.get("job_id") == job_id and "event" in r.__dict__]  # fmt: skip

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def run_with_worker(
    url: str,
    settings: WorkerSettings,
    steps: Callable[[Worker], Awaitable[None]],
    lines: Lines | None = None,
    stop: bool = True,
) -> None:
    """An in-process worker runs while `steps` do; then it is asked to stop (bounded), the
    gates opened so every handler returns."""

    async def main() -> None:
        Gates.aio = asyncio.Event()
        log = logging.getLogger(f"to-test-{uuid.uuid4().hex[:6]}")
        log.setLevel(logging.DEBUG)
        log.propagate = False
        if lines is not None:
            log.addHandler(lines)
        client = connect_async(url)
        w = Worker(client, registry, settings, logger=log)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await steps(w)
        finally:
            Gates.aio.set()
            Gates.sync.set()
            if stop:
                w.request_stop()
            await asyncio.wait_for(task, BOUND_S)
            await client.aclose()

    asyncio.run(main())


def settings_for(q: Queue, **kw: Any) -> WorkerSettings:
    base: dict[str, Any] = dict(queues=(q.name,), concurrency=2, heartbeat_ms=50, lease_ms=1_000,
                                grace_s=0, prefetch=0)  # fmt: skip
    base.update(kw)
    return WorkerSettings(**base)


def sample(w: Worker, q: Queue, task: str, outcome: str) -> float:
    v = w.metrics.registry.get_sample_value(
        "scheduler_jobs_total", {"queue": q.name, "task": task, "outcome": outcome}
    )
    return 0.0 if v is None else v


def seen(job_id: str, what: str) -> list[Any]:
    return [d for j, w, d in Gates.seen if j == job_id and w == what]


# -- an async handler past its timeout ----------------------------------------------------------


def test_an_async_handler_past_its_timeout_is_cancelled_retried_with_backoff_then_parked(
    module_server: RedisProcess, rq: Queue, redis_url: str
) -> None:
    """Each attempt: cancelled (its ctx says timeout), failed with JobTimeout and the timeout
    in the text, retried after the backoff, parked after the last; counted and logged under
    the one word `timeout`, each followed by its attempt's retry / dead."""
    lines = Lines()
    backoff = Backoff(base_ms=300, factor=1.0, cap_ms=300, jitter=0.0)

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-hang", {}, timeout_ms=40, max_attempts=2, backoff=backoff)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        job = rq.get_job(jid)
        assert seen(jid, "start") == [1, 2]
        assert seen(jid, "cancelled") == ["timeout", "timeout"]
        assert job.attempts == 2
        assert [(e["type"], e["message"]) for e in job.errors] == [
            ("JobTimeout", "timed out after 0.04s"),
            ("JobTimeout", "timed out after 0.04s"),
        ]
        assert job.fields["last_error_type"] == "JobTimeout"
        # The retry waited out its backoff: claimed again no sooner than 300 ms after the
        # first attempt's failure (both are server times).
        first_fail = int(job.errors[0]["at_ms"])
        assert seen(jid, "claimed_ms")[1] - first_fail >= 300
        # The worker counts the last fail once its answer is read (after Redis has it).
        await poll(lambda: sample(w, rq, "to-hang", "dead") == 1, "dead counted", BOUND_S)
        assert sample(w, rq, "to-hang", "timeout") == 2
        assert sample(w, rq, "to-hang", "retry") == 1
        assert lines.events(jid) == ["claimed", "timeout", "retry", "claimed", "timeout", "dead"]
        assert seen(jid, "hook") == [("timeout", None), ("retry", "JobTimeout"),
                                     ("timeout", None), ("dead", "JobTimeout")]  # fmt: skip

    run_with_worker(module_server.url, settings_for(rq), steps, lines)


def test_jobs_show_names_the_timeout(module_server: RedisProcess, rq: Queue) -> None:
    """`scheduler jobs show` of a timed-out job: JobTimeout and its text, as stored."""

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-hang", {}, timeout_ms=30, max_attempts=1)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        Gates.seen.append((jid, "id", None))

    run_with_worker(module_server.url, settings_for(rq), steps)
    (jid,) = [j for j, w, _ in Gates.seen if w == "id"]
    runner = CliRunner(env={"COLUMNS": "200"})
    url = f"unix://{module_server.socket}"
    out = runner.invoke(main, ["jobs", "show", "-q", rq.name, jid, "--url", url])
    assert out.exit_code == 0, out.output
    assert "JobTimeout" in out.stdout and "timed out after 0.03s" in out.stdout
    data = json.loads(
        runner.invoke(main, ["jobs", "show", "--json", "-q", rq.name, jid, "--url", url]).stdout
    )
    assert data["last_error_type"] == "JobTimeout"
    assert data["last_error"] == "timed out after 0.03s"


# -- a sync handler past its timeout ------------------------------------------------------------


def test_a_sync_handler_past_its_timeout_is_abandoned_its_slot_freed_its_late_return_dropped(
    module_server: RedisProcess, rq: Queue
) -> None:
    """One slot. The thread cannot be killed: at its timeout the job fails (JobTimeout) and is
    parked (its last attempt) while the thread still runs, ctx.stopped is set (reason
    timeout), the thread is counted as abandoned and the slot runs the next job. When the
    thread returns at last, its result is dropped: the job stays parked with its one error, no
    result, no `done` counted or logged."""
    lines = Lines()

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-sync-hang", {}, timeout_ms=40, max_attempts=1)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        assert not Gates.thread_done.is_set()  # its thread still runs
        ctx = Gates.ctxs[jid]
        assert ctx.stopped.is_set() and ctx.stop_reason == "timeout"
        assert w.metrics.registry.get_sample_value("scheduler_abandoned_threads") == 1
        # The slot is free: the next job runs beside the abandoned thread.
        nxt = rq.enqueue("to-quick", {})
        await poll(lambda: rq.status(nxt) == "done", "the next job", BOUND_S)
        # No longer heartbeated: nothing of this worker holds it.
        assert all(r.job.id != jid for r in w._held.values())
        Gates.sync.set()
        await poll(lambda: bool(seen(jid, "returned")), "the thread's return", BOUND_S)
        await poll(lambda: not w._abandoned, "the thread no longer abandoned", BOUND_S)
        assert w.metrics.registry.get_sample_value("scheduler_abandoned_threads") == 0
        job = rq.get_job(jid)
        assert job.state == "dead" and job.result_json is None
        assert [e["type"] for e in job.errors] == ["JobTimeout"]
        assert sample(w, rq, "to-sync-hang", "done") == 0
        assert sample(w, rq, "to-sync-hang", "timeout") == 1
        assert sample(w, rq, "to-sync-hang", "dead") == 1
        assert lines.events(jid) == ["claimed", "timeout", "dead"]

    run_with_worker(module_server.url, settings_for(rq, concurrency=1), steps, lines)


def test_a_sync_handler_asking_raise_if_stopped_after_its_timeout_is_told_it_timed_out(
    module_server: RedisProcess, rq: Queue
) -> None:
    """A cooperative sync handler (README: `ctx.raise_if_stopped()  # lease expired, cancelled,
    timed out or shutting down`) gets an exception that says the run timed out. It gets
    LeaseExpired, whose doc is "The lease lapsed before the call; the job may be running
    elsewhere": neither is true at a timeout (the lease is held until the fail lands, and the
    retry waits its backoff), and a handler that cleans up on LeaseExpired on the grounds
    that another worker has the job does the wrong thing."""

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-sync-polite", {}, timeout_ms=40, max_attempts=1)
        await poll(lambda: bool(seen(jid, "raised")), "the handler's raise", BOUND_S)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        (exc,) = seen(jid, "raised")
        assert not isinstance(exc, LeaseExpired), repr(exc)
        assert "timed out" in str(exc), repr(exc)

    run_with_worker(module_server.url, settings_for(rq), steps)


# -- an async handler that swallows its cancellation --------------------------------------------


def test_an_async_handler_swallowing_its_timeout_is_failed_and_its_slot_freed(
    module_server: RedisProcess, rq: Queue
) -> None:
    """The handler catches the cancellation and keeps running: the job still fails at its
    timeout (JobTimeout, parked: one attempt), the slot runs the next job (the loop turns),
    the handler counts as abandoned; its late return is dropped."""

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-swallow", {}, timeout_ms=40, max_attempts=1)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        assert seen(jid, "swallowed") == ["timeout"]
        assert [e["type"] for e in rq.get_job(jid).errors] == ["JobTimeout"]
        nxt = rq.enqueue("to-quick", {})
        await poll(lambda: rq.status(nxt) == "done", "the next job", BOUND_S)
        assert w.metrics.registry.get_sample_value("scheduler_abandoned_threads") == 1
        assert Gates.aio is not None
        Gates.aio.set()
        await poll(lambda: bool(seen(jid, "returned")), "the handler's return", BOUND_S)
        await poll(lambda: not w._abandoned, "no handler abandoned", BOUND_S)
        job = rq.get_job(jid)
        assert job.state == "dead" and job.result_json is None and len(job.errors) == 1
        assert sample(w, rq, "to-swallow", "done") == 0

    run_with_worker(module_server.url, settings_for(rq, concurrency=1), steps)


def test_swallowed_timeouts_at_the_abandoned_cap_pause_claims_and_say_so(
    module_server: RedisProcess, rq: Queue
) -> None:
    """Cap 1: one handler that swallowed its timeout stops the claims (logged, the
    claim_paused gauge) until it ends; then the waiting job runs."""
    lines = Lines()

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-swallow", {}, timeout_ms=40, max_attempts=1)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        nxt = rq.enqueue("to-quick", {})
        paused = {"reason": "abandoned_threads"}
        await poll(
            lambda: w.metrics.registry.get_sample_value("scheduler_claim_paused", paused) == 1,
            "claims paused at the cap", BOUND_S,
        )  # fmt: skip
        assert rq.status(nxt) == "due"
        assert any("not claiming: 1 abandoned handlers" in m for m in lines.messages())
        assert Gates.aio is not None
        Gates.aio.set()
        await poll(lambda: rq.status(nxt) == "done", "the job after the cap", BOUND_S)
        assert any("claiming again" in m for m in lines.messages())

    capped = settings_for(rq, concurrency=2, max_abandoned_threads=1)
    run_with_worker(module_server.url, capped, steps, lines)


def test_the_abandoned_gauge_and_option_describe_what_they_count(
    module_server: RedisProcess, rq: Queue
) -> None:
    """scheduler_abandoned_threads counts every stopped handler still running, an async one
    that swallowed its timeout too (README: "async handlers that swallowed their cancellation
    count too"), and `--max-abandoned-threads` caps them all. Its help text says "Sync handler
    threads stopped (timeout, lease expired) but still running", the option's help "Timed-out
    sync handlers still running", WorkerSettings' docstring "sync handlers abandoned": an
    operator reading the gauge at 1 looks for a thread and finds none."""
    from scheduler.cli.worker import worker_cmd

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-swallow", {}, timeout_ms=40, max_attempts=1)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        assert w.metrics.registry.get_sample_value("scheduler_abandoned_threads") == 1
        help_text = w.metrics.abandoned_threads._documentation
        assert "sync handler threads" not in help_text.lower(), help_text

    run_with_worker(module_server.url, settings_for(rq), steps)
    (opt,) = [p for p in worker_cmd.params if p.name == "max_abandoned_threads"]
    assert "sync handlers" not in (getattr(opt, "help", "") or ""), opt


# -- the timeout against the lease and the heartbeat --------------------------------------------


@pytest.mark.parametrize("task", ["to-wait-lease", "to-sync-wait-lease"])
def test_a_timeout_longer_than_the_lease_is_the_limit_not_the_lease(
    module_server: RedisProcess, rq: Queue, task: str
) -> None:
    """lease 600 ms (heartbeat 100 ms), timeout 60 s: the run outlives its lease twice over
    (the heartbeats renew it) and completes on its first attempt, no lapse. (A lease of 200 ms
    lapsed now and then on this loaded machine: a stall, not the timeout's doing.)"""

    async def steps(w: Worker) -> None:
        jid = rq.enqueue(task, {}, timeout_ms=60_000, max_attempts=1)
        await poll(lambda: bool(seen(jid, "start")), "the run's start", BOUND_S)
        t0 = time.monotonic()
        await poll(lambda: time.monotonic() - t0 > 1.3, "two leases", BOUND_S)  # the scenario
        assert rq.status(jid) == "leased", rq.get_job(jid).fields
        assert Gates.aio is not None
        Gates.aio.set()
        Gates.sync.set()
        await poll(lambda: rq.status(jid) == "done", "the job done", BOUND_S)
        job = rq.get_job(jid)
        assert job.attempts == 1 and job.errors == []
        assert job.fields.get("lapses") in (None, "0")

    run_with_worker(module_server.url, settings_for(rq, lease_ms=600, heartbeat_ms=100), steps)


def test_a_timeout_shorter_than_a_heartbeat_fires_on_its_own_timer(
    module_server: RedisProcess, rq: Queue
) -> None:
    """heartbeat 5 s, timeout 30 ms: the timeout is its own timer, not checked at a beat. The
    job fails with JobTimeout well before the first heartbeat would have run (the handler saw
    its cancel while no heartbeat had been sent: the lease of 15 s is the claim's)."""
    lines = Lines()

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-hang", {}, timeout_ms=30, max_attempts=1)
        await poll(lambda: rq.status(jid) == "dead", "the job parked", BOUND_S)
        assert seen(jid, "cancelled") == ["timeout"]
        assert [e["type"] for e in rq.get_job(jid).errors] == ["JobTimeout"]

    slow_beats = settings_for(rq, heartbeat_ms=5_000, lease_ms=15_000)
    run_with_worker(module_server.url, slow_beats, steps, lines)


def test_the_timeout_applies_to_each_attempt_not_their_sum(
    module_server: RedisProcess, rq: Queue
) -> None:
    """timeout 1 s, no backoff: attempt 1 hangs and is stopped at 1 s; attempt 2 needs 10 ms
    of its own second and completes (a budget shared by the attempts was spent)."""

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-first-hangs", {}, timeout_ms=1_000, max_attempts=2,
                         backoff=Backoff(base_ms=0, factor=1.0, cap_ms=0, jitter=0.0))  # fmt: skip
        await poll(lambda: rq.status(jid) in ("done", "dead"), "the job's end", BOUND_S)
        job = rq.get_job(jid)
        assert job.state == "done" and job.attempts == 2
        assert json.loads(job.result_json or "null") == "attempt 2"
        assert seen(jid, "start") == [1, 2]

    run_with_worker(module_server.url, settings_for(rq), steps)


def test_an_untimed_run_that_never_returns_after_a_stall_cannot_hold_its_job_for_good(
    module_server: RedisProcess, rq: Queue, admin: redis.Redis
) -> None:
    """No timeout (0 = none). A server stall (CLIENT PAUSE WRITE, as a failover's) outlasts the
    lease: the worker stops the run (expired), but its thread blocks on. The job, due again, is
    claimed by the same worker and held behind that thread; README: "Held a whole lease, it
    goes back: released with its attempt given back while the earlier run is within its
    timeout ..., else failed with StillRunning (retried by its backoff, parked after its last),
    so a handler that never returns cannot hold its job for good". With no timeout the earlier
    run is always "within" it: claim, hold, release, every lease, for ever (max_attempts 2)."""

    async def steps(w: Worker) -> None:
        jid = rq.enqueue("to-sync-hang", {}, max_attempts=2)
        await poll(lambda: jid in Gates.ctxs, "the run's start", BOUND_S)
        admin.client_pause(800, all=False)  # WRITE: a failover's pause
        ctx = Gates.ctxs[jid]
        await poll(ctx.stopped.is_set, "the run stopped at its lease's end", BOUND_S)
        assert ctx.stop_reason == "expired"

        def settled() -> bool:
            job = rq.get_job(jid)
            return job.state == "dead" or int(job.fields.get("fence", "0")) >= 10

        await poll(settled, "the job parked, or claimed 10 times", BOUND_S)
        job = rq.get_job(jid)
        assert job.state == "dead", (job.state, job.attempts, job.fields.get("fence"))

    run_with_worker(module_server.url, settings_for(rq, lease_ms=400, heartbeat_ms=100), steps)


# -- where the limit comes from: 0 = none of its own -------------------------------------------


def test_zero_means_no_limit_of_its_own_the_tasks_applies_else_none(
    module_server: RedisProcess, rq: Queue
) -> None:
    """A job of timeout_ms 0 on a task with none runs for as long as it needs; one enqueued by
    name on a task with timeout_s 0.05 gets the task's; a job's own longer limit wins over the
    task's."""

    async def steps(w: Worker) -> None:
        untimed = rq.enqueue("to-wait-lease", {}, timeout_ms=0, max_attempts=1)
        by_task = rq.enqueue("to-task-default", {}, max_attempts=1)  # timeout_ms 0: the task's
        own = rq.enqueue("to-task-default", {}, timeout_ms=60_000, max_attempts=1)
        await poll(lambda: rq.status(by_task) == "dead", "the task's limit", BOUND_S)
        assert [e["message"] for e in rq.get_job(by_task).errors] == ["timed out after 0.05s"]
        await poll(lambda: bool(seen(untimed, "start")) and bool(seen(own, "start")),
                   "both runs started", BOUND_S)  # fmt: skip
        t0 = time.monotonic()
        await poll(lambda: time.monotonic() - t0 > 0.3, "past the task's limit", BOUND_S)
        assert rq.status(untimed) == "leased" and rq.status(own) == "leased"
        assert Gates.aio is not None
        Gates.aio.set()
        await poll(lambda: rq.status(untimed) == "done" and rq.status(own) == "done",
                   "both done", BOUND_S)  # fmt: skip

    run_with_worker(module_server.url, settings_for(rq, concurrency=4), steps)


def test_a_task_handle_job_carries_the_tasks_limit_and_a_call_of_its_own(
    module_server: RedisProcess, rq: Queue
) -> None:
    """TaskHandle.enqueue writes the task's timeout_s as the job's timeout_ms (50), a call's
    own timeout_ms wins; `jobs show` reads them back."""
    a = task_default.enqueue(rq, {})
    b = task_default.enqueue(rq, {}, timeout_ms=1234)
    assert rq.get_job(a).fields["timeout_ms"] == "50"
    assert rq.get_job(b).fields["timeout_ms"] == "1234"


# -- refused at the boundary -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 604_800_001, 10**30, True, 1.5, math.nan, "30", None])
def test_a_timeout_ms_out_of_range_is_refused_with_bad_argument_and_nothing_written(
    rq: Queue, bad: Any
) -> None:
    """A typed refusal naming the field and its range, from every way a job gets one (a
    handle's None is its default: the task's)."""
    with pytest.raises(BadArgument, match=r"timeout_ms must be .*\[0, 604800000\]"):
        rq.enqueue("to-quick", {}, timeout_ms=bad)
    with pytest.raises(BadArgument, match="timeout_ms"):
        rq.enqueue_many([JobSpec("to-quick", {}, timeout_ms=bad)])
    if bad is not None:
        with pytest.raises(BadArgument, match="timeout_ms"):
            task_default.enqueue(rq, {}, timeout_ms=bad)
    with pytest.raises(BadArgument, match="timeout_ms"):
        rq.schedule("to-timeouts-s", task="to-quick", every_ms=60_000, timeout_ms=bad)
    counts = rq.counts()
    assert (counts.due, counts.scheduled, counts.leased) == (0, 0, 0)
    assert rq.list_schedules() == []


def test_the_range_ends_are_taken(rq: Queue) -> None:
    for ms in (0, 1, 604_800_000):
        jid = rq.enqueue("to-quick", {}, timeout_ms=ms)
        assert rq.get_job(jid).fields["timeout_ms"] == str(ms)


@pytest.mark.parametrize("bad", [0, -1, 0.0004, 604_801, math.inf, math.nan, True, "30"])
def test_a_tasks_timeout_s_out_of_range_is_refused_at_registration(bad: Any) -> None:
    reg = Registry()
    with pytest.raises(BadArgument, match="timeout_s"):

        @reg.task(name="to-bad-limit", timeout_s=bad)
        async def bad_limit(payload: Any, ctx: JobContext) -> None:
            return None


@pytest.mark.parametrize(
    "args",
    [["--timeout-ms", "-1"], ["--timeout-ms", "604800001"], ["--timeout", "8d"],
     ["--timeout", "-5s"], ["--timeout", "soon"], ["--timeout", "1s", "--timeout-ms", "5"]],
)  # fmt: skip
def test_the_cli_refuses_a_bad_timeout_with_a_usage_error(
    module_server: RedisProcess, rq: Queue, args: list[str]
) -> None:
    url = f"unix://{module_server.socket}"
    out = CliRunner().invoke(main, ["enqueue", "to-quick", "-q", rq.name, "--url", url, *args])
    assert out.exit_code == 2, (out.exit_code, out.output)
    assert "Traceback" not in out.output
    assert rq.counts().due == 0


def test_a_schedules_timeout_ms_limits_its_runs(module_server: RedisProcess, rq: Queue) -> None:
    """A schedule's timeout_ms is each run's."""

    async def steps(w: Worker) -> None:
        rq.schedule("to-every", task="to-hang", every_ms=3_600_000, timeout_ms=40, max_attempts=1)
        jid = rq.run_schedule_now("to-every")
        await poll(lambda: rq.status(jid) == "dead", "the run parked", BOUND_S)
        assert seen(jid, "cancelled") == ["timeout"]
        assert [e["message"] for e in rq.get_job(jid).errors] == ["timed out after 0.04s"]

    run_with_worker(module_server.url, settings_for(rq), steps)


# -- stopping ----------------------------------------------------------------------------------


def run_then_stop(
    url: str, settings: WorkerSettings, before_stop: Callable[[Worker], Awaitable[None]],
    request: bool = True,
) -> None:  # fmt: skip
    """The worker runs `before_stop`, then is asked to stop (if `request`) and must return on
    its own (bounded): the gates stay shut until it has."""

    async def main() -> None:
        Gates.aio = asyncio.Event()
        client = connect_async(url)
        w = Worker(client, registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await before_stop(w)
            if request:
                w.request_stop()
            done, _ = await asyncio.wait({task}, timeout=BOUND_S)
            assert task in done, "the worker did not return"
            assert task.result() == 0
        finally:
            Gates.aio.set()
            Gates.sync.set()
            w.request_stop()
            await asyncio.wait({task}, timeout=BOUND_S)
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("task", ["to-hang", "to-sync-hang"])
def test_a_stop_with_a_long_grace_ends_at_the_jobs_timeout_which_fails_it(
    module_server: RedisProcess, rq: Queue, task: str
) -> None:
    """grace 600 s, a running job of timeout 100 ms that never returns: the stop does not wait
    out the grace; the timeout ends the run within it (JobTimeout, retried per its backoff:
    not given back) and the worker returns."""
    jid = rq.enqueue(task, {}, timeout_ms=100, max_attempts=3)

    async def before_stop(w: Worker) -> None:
        await poll(lambda: bool(seen(jid, "start")), "the run's start", BOUND_S)

    run_then_stop(module_server.url, settings_for(rq, grace_s=600), before_stop)
    job = rq.get_job(jid)
    assert job.state in ("due", "scheduled") and job.attempts == 1
    assert [e["type"] for e in job.errors] == ["JobTimeout"]


@pytest.mark.parametrize("task", ["to-hang", "to-sync-hang"])
def test_a_stop_with_a_short_grace_gives_a_long_timed_job_back(
    module_server: RedisProcess, rq: Queue, task: str
) -> None:
    """grace 0, timeout 60 s: the run is stopped at the grace's end and the job released, its
    attempt given back, no error recorded."""
    jid = rq.enqueue(task, {}, timeout_ms=60_000, max_attempts=3)

    async def before_stop(w: Worker) -> None:
        await poll(lambda: bool(seen(jid, "start")), "the run's start", BOUND_S)

    run_then_stop(module_server.url, settings_for(rq, grace_s=0), before_stop)
    job = rq.get_job(jid)
    assert job.state == "due" and job.attempts == 0 and job.errors == []
    if task == "to-hang":
        assert seen(jid, "cancelled") == ["shutdown"]


def test_a_quota_stop_waits_for_a_timed_job_up_to_its_timeout_whatever_the_grace(
    module_server: RedisProcess, rq: Queue
) -> None:
    """max_jobs 1, grace 0 (docs/guide/workers.md: "A job with a timeout ... is waited for up
    to that timeout, whatever --grace"): the hung run is not given back at once; its timeout
    fails it (JobTimeout) and the worker then stops by itself."""
    jid = rq.enqueue("to-sync-hang", {}, timeout_ms=100, max_attempts=3)

    async def before_stop(w: Worker) -> None:
        await poll(lambda: bool(seen(jid, "start")), "the run's start", BOUND_S)

    run_then_stop(module_server.url, settings_for(rq, grace_s=0, max_jobs=1), before_stop,
                  request=False)  # fmt: skip
    job = rq.get_job(jid)
    assert job.attempts == 1 and [e["type"] for e in job.errors] == ["JobTimeout"]


def test_a_quota_stop_with_an_untimed_job_running_is_a_sigterm_stop(
    module_server: RedisProcess, rq: Queue
) -> None:
    """max_jobs 1, grace 0, a hung job of no timeout: the quota stop does not wait for ever;
    the job is given back (attempt returned, no error) and the worker returns."""
    jid = rq.enqueue("to-sync-hang", {}, max_attempts=3)

    async def before_stop(w: Worker) -> None:
        await poll(lambda: bool(seen(jid, "start")), "the run's start", BOUND_S)

    quota = settings_for(rq, grace_s=0, max_jobs=1)
    run_then_stop(module_server.url, quota, before_stop, request=False)
    job = rq.get_job(jid)
    assert job.state == "due" and job.attempts == 0 and job.errors == []


# -- a --processes pool ------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_pool_child_times_out_async_and_sync_handlers_alike(
    module_server: RedisProcess, rq: Queue, pool_log: Path
) -> None:
    """`scheduler worker --processes 2`: each kind of handler past its timeout fails its job
    with JobTimeout (parked after its one attempt), logged `timeout` by the child and counted
    `timeout` on the pool's one metrics endpoint; the pool then stops cleanly (SIGTERM, 0)
    although a thread is still blocked."""
    import urllib.request

    port = _free_port()
    env = dict(os.environ, TEST_REDIS_URL=module_server.url, REDIS_URL=module_server.url,
               PYTHONPATH=str(ROOT))  # fmt: skip
    with open(pool_log, "ab") as out:
        pool = subprocess.Popen(
            [SCHEDULER, "worker", REG, "--queue", rq.name, "--processes", "2", "--json-logs",
             "--metrics-port", str(port), "--grace", "1"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    SUPERVISORS.add(pool.pid)
    try:
        a = rq.enqueue("to-hang", {}, timeout_ms=50, max_attempts=1)
        b = rq.enqueue("to-sync-hang", {}, timeout_ms=50, max_attempts=1)
        wait_for(lambda: rq.status(a) == "dead" and rq.status(b) == "dead", BOUND_S, "parked")
        for jid in (a, b):
            assert [e["message"] for e in rq.get_job(jid).errors] == ["timed out after 0.05s"]

        def events() -> list[tuple[str, str]]:
            got = []
            for line in pool_log.read_text(errors="replace").splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("job_id") in (a, b):
                    got.append((d["job_id"], d.get("event", "")))
            return got

        wait_for(lambda: (a, "dead") in events() and (b, "dead") in events(), BOUND_S, "logs")
        for jid in (a, b):
            assert [e for j, e in events() if j == jid] == ["claimed", "timeout", "dead"]

        def timeouts() -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return -1.0
            n = 0.0
            for line in text.splitlines():
                if line.startswith("scheduler_jobs_total{") and f'queue="{rq.name}"' in line \
                        and 'outcome="timeout"' in line:  # fmt: skip
                    n += float(line.rsplit(" ", 1)[1])
            return n

        wait_for(lambda: timeouts() == 2, BOUND_S, "two timeouts counted on the pool endpoint")
    finally:
        if pool.poll() is None:
            pool.send_signal(signal.SIGTERM)
        try:
            code = pool.wait(BOUND_S + 10)
        except subprocess.TimeoutExpired:
            pool.kill()
            pool.wait()
            raise AssertionError("the pool did not stop") from None
    assert code == 0, pool_log.read_text(errors="replace")[-2000:]
