"""The worker's runtime, from a review (shutdown, error handling, metrics, start-up,
embedding): each test failed on the code it was written against. In-process workers on the
module's private redis-server, but for one `scheduler worker` process and one single-node
Redis Cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue
from scheduler._spawn_cluster import _cmd, _free_cluster_port
from scheduler.core import exits
from scheduler.core.connection import connect, connect_async
from scheduler.core.scripts import Scripts
from scheduler.worker import EXIT_OK, SettingsError, Worker, WorkerSettings, logs
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import new_queue
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess, require_server
from tests.workers.procs import ROOT, spawn_worker, stop_all, wait_for

registry = Registry()


class BadStr(Exception):
    """An exception whose message cannot be read (a __str__ that raises: a common slip)."""

    def __str__(self) -> str:
        raise AttributeError("no message attribute")


@registry.task(name="rv-bad-str", max_attempts=1)
async def bad_str(payload: Any, ctx: JobContext) -> None:
    raise BadStr()


@registry.task(name="rv-inner-cancel", max_attempts=1)
async def inner_cancel(payload: Any, ctx: JobContext) -> None:
    """Awaits a task something else cancelled: CancelledError reaches the handler's caller,
    though nobody cancelled the handler itself."""
    inner = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    inner.cancel()
    await inner


@registry.task(name="rv-deaf")
async def deaf(payload: Any, ctx: JobContext) -> None:
    """Cleanup that outlasts every cancellation (a library that shields its work)."""
    with redis.Redis.from_url(os.environ["TEST_REDIS_URL"]) as r:
        r.rpush(f"rv:started:{ctx.queue}", ctx.job_id)
    end = time.monotonic() + payload["s"]
    while (left := end - time.monotonic()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(left)


@registry.task(name="rv-sleep")
async def nap(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(payload["s"])


@registry.task(name="rv-sync")
def sync_job(payload: Any, ctx: JobContext) -> str:
    time.sleep(payload["s"])
    return "ok"


GATES: dict[str, asyncio.Event] = {}


@registry.task(name="rv-gate-fail")
async def gate_fail(payload: Any, ctx: JobContext) -> None:
    await GATES.setdefault(ctx.job_id, asyncio.Event()).wait()
    raise RuntimeError("failed after the gate")


def state(q: Queue, job: str) -> str:
    """The job's status and, while leased, how long its lease has left on the server."""
    c = q.client if isinstance(q.client, redis.Redis) else None
    assert c is not None
    until = c.zscore(q.keys.leased, job)
    now_s, now_us = c.time()
    left = "" if until is None else f", lease left {int(until - now_s * 1000 - now_us // 1000)} ms"
    return f"status {q.status(job)}{left}"


def with_worker(
    server: RedisProcess,
    q: Queue,
    body: Callable[[Worker], Awaitable[None]],
    client: Any = None,
    **kw: Any,
) -> int:
    """Run an in-process worker on q while body(worker) runs; stop it; its exit code."""
    kw = {"lease_ms": 3000, "heartbeat_ms": 100, "grace_s": 0, "concurrency": 4, **kw}

    async def main() -> int:
        c = client if client is not None else connect_async(server.url)
        w = Worker(c, registry, WorkerSettings(queues=(q.name,), **kw))
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await body(w)
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 15)
            await c.aclose()
            # A handler task that died (the unreadable exception's) logs at GC otherwise,
            # mid-report of the next failure: CPython 3.11's AST recursion check trips pytest.
            for r in [*w._held.values(), *w.running.values(), *w._abandoned.values()]:
                if r.task is not None and r.task.done() and not r.task.cancelled():
                    r.task.exception()
        return code

    return asyncio.run(main())


# -- a handler's failure that the worker cannot describe is still reported ---------------------
def test_an_exception_whose_str_raises_is_still_reported(module_server: RedisProcess) -> None:
    q = new_queue(module_server.client(), "rv-")
    job = bad_str.enqueue(q, None)  # with the task's max_attempts=1 (q.enqueue: the default 5)

    async def body(w: Worker) -> None:
        # max_attempts=1: the failure parks it. Before: _finish ended the run, then str(exc)
        # raised, so no outcome was queued and heartbeats kept the lease for good.
        await poll(lambda: q.status(job) == "dead", lambda: f"dead, {state(q, job)}", timeout_s=5)

    assert with_worker(module_server, q, body) == EXIT_OK


def test_a_cancelled_error_the_handler_raises_itself_fails_the_job(
    module_server: RedisProcess,
) -> None:
    q = new_queue(module_server.client(), "rv-")
    job = inner_cancel.enqueue(q, None)  # with the task's max_attempts=1

    async def body(w: Worker) -> None:
        # Before: _run_async re-raised it (not ours: r not finished), the run stayed in
        # `running` with its slot, and heartbeats kept its lease while the worker lived.
        await poll(lambda: q.status(job) == "dead", lambda: f"dead, {state(q, job)}", timeout_s=5)
        assert not w.running

    assert with_worker(module_server, q, body) == EXIT_OK


# -- shutdown --------------------------------------------------------------------------------
class LoseClaimReplies(aredis.Redis):
    """Every claim runs on the server, then its reply is lost while `lose` is set (a dropped
    connection after the fact): the worker retries it with the same nonce."""

    claim_sha = Scripts().sha["claim"]
    lose = True
    lost = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if args[:2] == ("EVALSHA", self.claim_sha) and self.lose:
            self.lost += 1
            raise RedisConnectionError("reply lost")
        return reply


def test_a_stop_while_a_claims_answer_is_lost_gives_its_jobs_back(
    module_server: RedisProcess,
) -> None:
    q = new_queue(module_server.client(), "rv-")
    job = q.enqueue("rv-sleep", {"s": 30})
    client = LoseClaimReplies(unix_socket_path=module_server.socket, decode_responses=True)

    async def body(w: Worker) -> None:
        # The claim leased the job, its answers were lost; the loop backs off (200 ms and up).
        await poll(lambda: client.lost >= 3, lambda: f"lost claims, {client.lost}", timeout_s=5)
        client.lose = False  # Redis answers again: shutdown could replay the nonce now

    assert with_worker(module_server, q, body, client=client, lease_ms=30_000) == EXIT_OK
    # Before: the nonce's batch was neither replayed nor released: leased for the whole lease
    # (30 s here) though the worker had stopped cleanly.
    assert q.status(job) == "due", state(q, job)


def test_grace_bounds_the_exit_even_when_a_handler_ignores_its_cancel(
    module_server: RedisProcess,
) -> None:
    q = new_queue(module_server.client(), "rv-")
    # The handler outlasts its cancel by 60 s, the exit is given 20: a bound far from both
    # (under CI's load a 12 s handler and a 6 s bound flaked on the worker's own start).
    job = q.enqueue("rv-deaf", {"s": 60})
    w = spawn_worker(module_server.url, q.name, "--grace", "0.5", "--heartbeat-ms", "100",
                     "--lease-ms", "3000", registry=f"{__name__}:registry")  # fmt: skip
    try:
        wait_for(lambda: q.client.llen(f"rv:started:{q.name}") == 1, 60, "the handler started")
        w.send_signal(signal.SIGTERM)
        # README: each shutdown wait is bounded; grace 0.5 s, then flush and release (< 5 s).
        # Before: run() returned and released the job, then asyncio.run() waited for the
        # handler's task without a bound (its 60 s), its signal handlers already removed.
        try:
            code: int | None = w.wait(20)
        except subprocess.TimeoutExpired:
            code = None
        assert code == EXIT_OK, f"exit {code} (None: still running 20 s after SIGTERM)"
        assert q.status(job) == "due"
    finally:
        stop_all([w])


def test_an_embedded_worker_whose_run_is_cancelled_stops_claiming(
    module_server: RedisProcess,
) -> None:
    """An app stops what it started by cancelling its task (lifespan exit, a TaskGroup, a
    wait_for): run() must not leave its claim / heartbeat / report loops behind."""
    q = new_queue(module_server.client(), "rv-")
    # The claim loop sleeps until then. 3 s, not 700 ms: a start stalled past the due time
    # (a loaded machine) had the worker claim it before the cancel.
    later = q.enqueue("rv-sleep", {"s": 0}, delay_ms=3000)

    async def main() -> list[str]:
        c = connect_async(module_server.url)
        w = Worker(c, registry, WorkerSettings(queues=(q.name,), lease_ms=3000,
                                               heartbeat_ms=100, grace_s=0))  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: w._idle.is_set(), "the worker idle", timeout_s=30)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Past the delayed job's due time (on the server's clock, a 30 s liveness bound), then
        # a second for a loop left behind to wake and claim it (a stall only lengthens it).
        await poll(lambda: q.status(later) != "scheduled", lambda: state(q, later), timeout_s=30)
        await asyncio.sleep(1.0)
        left = sorted(t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task())
        w.request_stop()  # let whatever is left end before the loop closes
        await asyncio.sleep(0.3)
        await c.aclose()
        return left

    left = asyncio.run(main())
    # Before: run()'s finally closed the thread pool and removed the exception handler, but
    # the loops it spawned ran on: the "stopped" worker claimed (and ran) the job due later.
    assert q.status(later) == "due", f"{state(q, later)}; loops still running: {left}"
    assert left == [], f"loops still running after run() was cancelled: {left}"


def test_an_embedded_worker_leaves_the_apps_exception_handler_in_charge(
    module_server: RedisProcess,
) -> None:
    """An app (its error reporter) set the loop's exception handler, then started the worker
    inside it (install_signals=False); the worker runs for the app's whole life."""
    q = new_queue(module_server.client(), "rv-")
    seen: list[str] = []

    async def app() -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: seen.append(str(context["message"])))
        c = connect_async(module_server.url)
        w = Worker(c, registry, WorkerSettings(queues=(q.name,), lease_ms=3000,
                                               heartbeat_ms=100, grace_s=0))  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: w._idle.is_set(), "the worker idle", timeout_s=5)
        loop.call_exception_handler({"message": "the app's own error"})
        w.request_stop()
        code = await task
        await c.aclose()
        return code

    assert asyncio.run(app()) == EXIT_OK
    # Before: run() set its own handler whatever install_signals said (for --json-logs):
    # the app's reports went to the worker's log as warnings for as long as it ran.
    assert seen == ["the app's own error"]


def fail_nth_thread(w: Worker, n: int) -> None:
    """The n-th handler thread cannot start: RuntimeError("can't start new thread"), what
    CPython raises at a pids limit (a container's pids.max). It says nothing about the job."""
    real, calls = w._threads.submit, [0]

    def submit(fn: Callable[[], None]) -> None:
        calls[0] += 1
        if calls[0] == n:
            raise RuntimeError("can't start new thread")
        real(fn)

    w._threads.submit = submit  # type: ignore[method-assign]


def test_a_thread_that_cannot_start_does_not_park_the_job(module_server: RedisProcess) -> None:
    q = new_queue(module_server.client(), "rv-")
    job = q.enqueue("rv-sync", {"s": 0})

    async def body(w: Worker) -> None:
        fail_nth_thread(w, 1)
        await poll(
            lambda: w.claimed == 1 and q.status(job) != "leased", lambda: state(q, job), timeout_s=5
        )
        # Before: _start's "one job's data must never take the worker down" caught it and
        # parked the job dead (InvalidJob, never retried) for a local, passing shortage.
        assert q.status(job) != "dead", q.get_job(job)

    assert with_worker(module_server, q, body) == EXIT_OK


def test_a_claim_pause_for_a_thread_that_cannot_start_is_in_the_metrics(
    module_server: RedisProcess,
) -> None:
    """scheduler_claim_paused says 'by reason', but only abandoned_threads was ever set: the
    pause after a handler thread could not start (a pids limit) left no trace an alert sees."""
    q = new_queue(module_server.client(), "rv-")
    job = q.enqueue("rv-sync", {"s": 0})

    async def body(w: Worker) -> None:
        gauge = w.metrics.claim_paused.labels("no_thread")
        fail_nth_thread(w, 1)
        await poll(lambda: gauge._value.get() == 1, lambda: state(q, job), timeout_s=5)
        await poll(lambda: q.status(job) == "done", lambda: state(q, job), timeout_s=10)
        await poll(lambda: gauge._value.get() == 0, "the pause ended", timeout_s=5)

    assert with_worker(module_server, q, body) == EXIT_OK


def test_a_thread_that_cannot_start_from_the_backlog_strands_no_job(
    module_server: RedisProcess,
) -> None:
    q = new_queue(module_server.client(), "rv-")

    async def body(w: Worker) -> None:
        warm = [q.enqueue("rv-sync", {"s": 0}) for _ in range(3)]  # short jobs: prefetch on
        await poll(lambda: all(q.status(j) == "done" for j in warm), "warm-up", timeout_s=30)
        fail_nth_thread(w, 2)
        ids = q.enqueue_many([registry.job_spec("rv-sync", {"s": 0.1}) for _ in range(3)])
        # Before: the first job's end ran _finish -> _end -> _pump -> _run, which raised inside
        # the loop callback: its complete was never queued, the second job sat in `running`
        # without a thread, the third in the backlog; all three leases heartbeated for good.
        await poll(
            lambda: w.claimed == 6 and all(q.status(i) != "leased" for i in ids),
            lambda: ", ".join(state(q, i) for i in ids),
            timeout_s=30,
        )

    assert with_worker(module_server, q, body, concurrency=1) == EXIT_OK


def test_a_fail_refused_because_the_job_was_cancelled_says_cancelled(
    module_server: RedisProcess,
) -> None:
    q = new_queue(module_server.client(), "rv-")
    job = q.enqueue("rv-gate-fail", None)
    seen: list[Worker] = []
    events: list[str] = []

    class Events(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "job_id", None) == job:
                events.append(str(getattr(record, "event", "")))

    def count(w: Worker, outcome: str) -> float | None:
        labels = {"queue": q.name, "task": "rv-gate-fail", "outcome": outcome}
        return w.metrics.registry.get_sample_value("scheduler_jobs_total", labels)

    async def body(w: Worker) -> None:
        seen.append(w)
        await poll(lambda: job in GATES, "the handler waiting", timeout_s=5)
        assert q.cancel(job) == "leased"
        GATES[job].set()  # it fails before the next heartbeat (3 s) could notice the cancel
        await poll(lambda: not w._held, "the fail answered", timeout_s=5)

    log = logging.getLogger(logs.LOGGER)
    handler, level = Events(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        assert with_worker(module_server, q, body, heartbeat_ms=3000, lease_ms=9000) == EXIT_OK
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    # docs/glossary.md: one word per outcome for the metric label and the log event; a
    # complete refused for this reason counts `cancelled` (_completed). Before: _failed counted
    # every refused fail (JobCancelled, JobNotFound, LeaseExpired) as `stale`, and both paths
    # log the event `refused`, a word of neither.
    got = {o: count(seen[0], o) for o in ("cancelled", "stale")}
    assert (got, events[1:]) == ({"cancelled": 1.0, "stale": None}, ["cancelled"]), events


class FailReleases(aredis.Redis):
    """Every release is lost on the way (the connection drops)."""

    release_sha = Scripts().sha["release"]
    tried = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[:2] == ("EVALSHA", self.release_sha):
            self.tried += 1
            raise RedisConnectionError("connection dropped")
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def test_a_release_that_failed_is_not_counted_released(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("scheduler.worker.runtime._SETTLE_S", 0.3)  # give up on it sooner
    q = new_queue(module_server.client(), "rv-")
    job = q.enqueue("rv-sleep", {"s": 30})
    client = FailReleases(unix_socket_path=module_server.socket, decode_responses=True)
    seen: list[Worker] = []

    async def body(w: Worker) -> None:
        seen.append(w)
        await poll(lambda: bool(w.running), "the job running", timeout_s=5)

    assert with_worker(module_server, q, body, client=client) == EXIT_OK
    assert client.tried > 0 and q.status(job) == "leased"  # the release never reached Redis
    released = seen[0].metrics.registry.get_sample_value(
        "scheduler_jobs_total", {"queue": q.name, "task": "rv-sleep", "outcome": "released"}
    )
    # Before: _release counted (and logged "job released") every job it was given, whether
    # the call failed, timed out, or the server answered stale / cancelled / missing.
    assert released is None, f"scheduler_jobs_total{{outcome=released}} = {released}"


# -- Redis errors of every class are ridden out ------------------------------------------------
@pytest.fixture
def one_node_cluster() -> Iterator[RedisProcess]:
    """A Redis Cluster of one primary holding every slot (starts in well under a second)."""
    extra = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    node = RedisProcess(require_server("a one-node cluster"), extra, tcp=True,
                        port=_free_cluster_port())  # fmt: skip
    with node:
        c = redis.Redis(port=node.port, decode_responses=True)
        _cmd(c, "CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_for(lambda: "cluster_state:ok" in _cmd(c, "CLUSTER", "INFO"), 10, "ok")
        c.close()
        yield node


def test_a_cluster_that_drops_every_connection_for_a_moment_is_ridden_out(
    one_node_cluster: RedisProcess,
) -> None:
    node = one_node_cluster
    url = f"redis+cluster://127.0.0.1:{node.port}/"
    name = "rv-" + uuid.uuid4().hex[:10]

    async def body(w: Worker) -> None:
        q = Queue(producer, name)
        first = q.enqueue("rv-sleep", {"s": 0})
        await poll(
            lambda: q.status(first) == "done",
            lambda: f"first done, {q.status(first)}",
            timeout_s=10,
        )
        node.kill()  # a restart (or a network blip) of the whole cluster, ~0.5 s
        await asyncio.sleep(0.5)
        node.start()
        with redis.Redis(port=node.port, decode_responses=True) as up:
            await poll(
                lambda: "cluster_state:ok" in _cmd(up, "CLUSTER", "INFO"),
                "cluster ok",
                timeout_s=10,
            )
        # README: a dropped connection is logged, counted and retried with backoff. Before:
        # the retry re-read the topology, redis-py raised RedisClusterException ("Redis
        # Cluster cannot be connected"), not a RedisError: the loop died, the worker exited 1.
        second = q.enqueue("rv-sleep", {"s": 0})
        await poll(
            lambda: q.status(second) == "done" or w._exit_code != EXIT_OK,
            lambda: f"second done, {q.status(second)}",
            timeout_s=15,
        )
        assert w._exit_code == EXIT_OK, f"the worker stopped itself (exit {w._exit_code})"

    producer = connect(url)
    try:
        assert with_worker(node, Queue(producer, name), body, client=connect_async(url)) == 0
    finally:
        producer.close()


# -- start-up checks -------------------------------------------------------------------------
def test_settings_refuse_queues_given_as_one_str() -> None:
    """WorkerSettings(queues="emails") in an app embedding the worker (a classic slip)."""
    settings = WorkerSettings(queues="emails")  # type: ignore[arg-type]
    # Before: accepted; the worker claimed from queues 'e', 'm', 'a', 'i', 'l', 's' and never
    # from "emails": a live, healthy-looking worker that takes no job.
    with pytest.raises(SettingsError):
        settings.check()


# -- documented behaviour --------------------------------------------------------------------
def test_the_readme_workers_exit_codes_are_the_ones_the_worker_uses() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    line = text[text.index("Exit codes: 0 clean stop") :].split(". ")[0]
    said = {m[1].strip(): int(m[0]) for m in re.findall(r"(\d+) ([^,(]+)", line)}
    # Before: README said 3 registry not importable, 4 Redis unreachable; exits.py (the CLI's
    # help, `scheduler worker --help` and docs/security.md) has them the other way round.
    assert said["registry not importable"] == exits.EXIT_IMPORT, line
    assert said["Redis unreachable at start"] == exits.EXIT_UNREACHABLE, line
