"""Review of 844b16b..HEAD from a user's side: the CLI's client closed with its click context
(scheduler/cli/common.py connect), the dashboard's client from a URL with the plain client's
retry (scheduler/dashboard/app.py create_app), and a `--burst` worker that drains for a
last-attempt suspect (scheduler/worker/alone.py). Private servers only."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import ExponentialWithJitterBackoff
from starlette.testclient import TestClient

from scheduler import AsyncQueue, Queue
from scheduler._spawn import RedisProcess
from scheduler.cli.main import main
from scheduler.core import connection
from scheduler.core.connection import connect_async
from scheduler.dashboard import Auth, create_app
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.fixtures.suspects import last_attempt_suspect
from tests.redis_server import require_server


# -- 1. the CLI's client, closed with its context -------------------------------------------------
def _open_sockets(client: Any) -> int:
    pool = client.connection_pool
    conns = [*pool._available_connections, *pool._in_use_connections]
    return sum(1 for c in conns if getattr(c, "_sock", None) is not None)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    built: list[Any] = []
    real = connection.connect

    def spy(url: str, **kwargs: Any) -> Any:
        client = real(url, **kwargs)
        built.append(client)
        return client

    monkeypatch.setattr(connection, "connect", spy)
    return built


def test_commands_invoked_twice_in_one_process_each_work_and_close_their_client(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, queue_name: str
) -> None:
    """A second in-process invoke is not handed a closed client, and each one closes its own:
    enqueue (a write) and stats --watch (a loop on its client)."""
    built = _spy(monkeypatch)
    url = module_server.url
    runner = CliRunner()
    runs = [
        ["enqueue", "t", "--payload", '{"a": 1}', "--queue", queue_name],
        ["enqueue", "t", "--payload", '{"a": 2}', "--queue", queue_name],
        ["stats", "--queue", queue_name, "--watch", "--count", "2", "--interval", "0.1", "--json"],
        ["stats", "--queue", queue_name, "--watch", "--count", "2", "--interval", "0.1", "--json"],
    ]
    for args in runs:
        result = runner.invoke(main, [*args, "--url", url])
        assert result.exit_code == 0, (args, result.output, result.exception)
    assert len(built) == len(runs)
    assert all(_open_sockets(c) == 0 for c in built)
    q = Queue(redis.Redis.from_url(url, decode_responses=True), queue_name)
    assert q.client.zcard(q.keys.due) == 2  # both enqueues landed
    watched = [r for r in runner.invoke(main, [*runs[2], "--url", url]).output.splitlines() if r]
    assert len(watched) == 2 and all('"due": 2' in line for line in watched)
    q.client.close()


def test_a_command_invoked_from_another_commands_context_gets_a_live_client(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, queue_name: str
) -> None:
    """An app embedding the CLI in its own click command (ctx.invoke): the scheduler command's
    client is closed when that invoke ends, not left to the outer context, and works within."""
    import click

    from scheduler.cli.admin import stats

    with Queue.from_url(module_server.url, queue_name) as q:
        q.enqueue("t", {})
    built = _spy(monkeypatch)

    @click.command()
    @click.pass_context
    def outer(ctx: click.Context) -> None:
        ctx.invoke(stats, url=module_server.url, queues=(queue_name,), as_json=True,
                   watch=False, interval=2.0, count=0)  # fmt: skip
        assert len(built) == 1 and _open_sockets(built[0]) == 0  # closed with the invoke
        ctx.invoke(stats, url=module_server.url, queues=(queue_name,), as_json=True,
                   watch=False, interval=2.0, count=0)  # fmt: skip

    result = CliRunner().invoke(outer, [])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.output.count(f'"queue": "{queue_name}"') == 2
    assert len(built) == 2 and _open_sockets(built[1]) == 0


# -- 2. the dashboard's retry while Redis is down -------------------------------------------------
def _backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff each re-send of redis-py's default Retry would have slept, recorded instead
    of slept (so the test takes no seconds of sleep; what a user waits is their sum)."""
    asked: list[float] = []
    real = ExponentialWithJitterBackoff.compute

    def compute(self: ExponentialWithJitterBackoff, failures: int) -> float:
        asked.append(real(self, failures))
        return 0.0

    monkeypatch.setattr(ExponentialWithJitterBackoff, "compute", compute)
    return asked


def test_a_page_with_redis_down_still_answers_the_503_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured (no patch, TCP, server killed): with 56402ee's plain-client retry a one-queue
    page took 2.9-4.7 s to answer 503 (before it: 0.0 s). Now one re-send, no backoff: it
    answers the error page, and no backoff is asked of redis-py's default Retry."""
    asked = _backoffs(monkeypatch)
    with RedisProcess(require_server("a private server to stop")) as server:
        Queue.from_url(server.url, "mail").enqueue("send", {"to": "a"})
        app = create_app(url=server.url, auth=Auth())
        with TestClient(app) as web:
            assert web.get("/queues/mail").status_code == 200
            server.kill()
            got = web.get("/queues/mail")
            assert got.status_code == 503 and "Redis unreachable" in got.text
    assert asked == []  # the dashboard's own Retry: one re-send at once (app.py)


def test_the_overview_with_redis_down_answers_without_seconds_of_backoff_per_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = ("a", "b", "c", "d", "e")
    asked = _backoffs(monkeypatch)
    with RedisProcess(require_server("a private server to stop")) as server:
        for n in names:
            Queue.from_url(server.url, n).enqueue("send", {})
        app = create_app(url=server.url, queues=names, auth=Auth())
        with TestClient(app) as web:
            assert web.get("/").status_code == 200
            server.kill()
            got = web.get("/")
            assert got.status_code == 503 and "Redis unreachable" in got.text
    # A one-server dashboard whose Redis is down: at most one call's worth of re-sends (what
    # a single-queue page costs, ~2.6 s expected), not one per queue shown.
    assert sum(asked) < 6.0, (len(asked), round(sum(asked), 1))


# -- 4. a --burst worker that drains for a last-attempt suspect ----------------------------------
EARLIER = datetime.fromtimestamp(1_000, tz=UTC)
_started: list[str] = []
_gate: asyncio.Event | None = None
burst_registry = Registry()


@burst_registry.task(name="d8-long")
async def _long(payload: Any, ctx: JobContext) -> None:
    _started.append(ctx.job_id)
    assert _gate is not None
    await _gate.wait()


@burst_registry.task(name="d8-quick")
async def _quick(payload: Any, ctx: JobContext) -> None:
    _started.append(ctx.job_id)


def test_a_burst_worker_that_drains_runs_the_suspect_and_everything_then_exits(
    redis_url: str, queue_name: str, client: redis.Redis
) -> None:
    _started.clear()
    q = Queue(client, queue_name)
    suspect = last_attempt_suspect(q, "d8-quick")
    long = q.enqueue("d8-long", {}, run_at=EARLIER)  # ahead of it: the worker is busy

    async def go() -> int:
        global _gate
        _gate = asyncio.Event()
        aclient = connect_async(redis_url)
        settings = WorkerSettings(queues=(queue_name,), concurrency=4, lease_ms=4000,
                                  heartbeat_ms=500, grace_s=5, burst=True)  # fmt: skip
        worker = Worker(aclient, burst_registry, settings)
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            end = time.monotonic() + 12
            while long not in _started:
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
            later = [await AsyncQueue(aclient, queue_name).enqueue("d8-quick", {})
                     for _ in range(2)]  # fmt: skip
            while client.hget(q.keys.job(suspect), "drainer") is None:  # told to drain
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
            assert not task.done()  # draining is not "nothing claimable"
            _gate.set()
            code = await asyncio.wait_for(task, 12)
            assert all(q.status(j) == "done" for j in [long, suspect, *later]), [
                q.status(j) for j in [long, suspect, *later]
            ]
            return int(code or 0)
        finally:
            if not task.done():
                worker.request_stop()
                await asyncio.wait_for(task, 10)
            await aclient.aclose()

    assert asyncio.run(go()) == 0
    assert _started[:2] == [long, suspect]


def test_a_drainer_whose_drained_queue_is_refused_still_claims_its_other_queues(
    redis_url: str, client: redis.Redis
) -> None:
    _started.clear()
    qa, qb = (Queue(client, f"d8{x}-{time.monotonic_ns()}") for x in "ab")
    last_attempt_suspect(qa, "d8-quick")  # its drain stops at the refused claims
    long = qa.enqueue("d8-long", {}, run_at=EARLIER)

    async def go() -> str:
        global _gate
        _gate = asyncio.Event()
        aclient = connect_async(redis_url)
        settings = WorkerSettings(queues=(qa.name, qb.name), concurrency=4, lease_ms=4000,
                                  heartbeat_ms=500, grace_s=5)  # fmt: skip
        worker = Worker(aclient, burst_registry, settings)
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            end = time.monotonic() + 12
            while long not in _started or worker._drain_for is None:  # busy, told to drain
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
            client.delete(qa.keys.due)
            client.set(qa.keys.due, "edited by hand")  # queue a's claims: CorruptKey now
            _gate.set()
            while (qa.name, long) in worker.running or (qa.name, long) in worker._held:
                assert time.monotonic() < end and not task.done()
                await asyncio.sleep(0.02)
            other = qb.enqueue("d8-quick", {})
            end = time.monotonic() + 5  # a free worker claims it at once (its wake-up)
            while qb.status(other) != "done" and time.monotonic() < end and not task.done():
                await asyncio.sleep(0.05)
            return str(qb.status(other))
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 10)
            await aclient.aclose()
            client.delete(qa.keys.due)

    try:
        assert asyncio.run(go()) == "done"
    finally:
        for q in (qa, qb):
            keys = list(client.scan_iter(match=q.keys.pattern()))
            if keys:
                client.delete(*keys)
