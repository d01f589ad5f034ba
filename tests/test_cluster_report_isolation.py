"""On a cluster, a node that is down fails only its own queues' reports: the outcomes of jobs
on the healthy nodes are written (before, one complete call for every queue failed whole and was
sent again whole, so while one node was down no job of any node was marked done). One private
redis-server, the cluster path forced (as tests/test_worker_lease_loss.py does), an in-process
worker over two queues whose calls to the "bad" one fail or hang."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.embedded_worker import until
from tests.redis_server import RedisProcess

registry = Registry()
ran: list[str] = []
ended: list[str] = []


@registry.task(name="iso-quick")
async def quick(payload: Any, ctx: JobContext) -> None:
    ran.append(ctx.job_id)
    await asyncio.sleep(0.05)
    ended.append(ctx.job_id)


def _two_nodes(server: RedisProcess, monkeypatch: pytest.MonkeyPatch) -> tuple[Queue, Queue]:
    """Queues "good" and "bad", as on two cluster nodes: the worker's cluster path forced."""
    from scheduler.worker import core as core_module
    from scheduler.worker import heartbeat as heartbeat_module

    ran.clear()
    ended.clear()
    tag = uuid.uuid4().hex[:8]
    admin = redis.Redis(unix_socket_path=server.socket, decode_responses=True)
    for module in (core_module, heartbeat_module):
        monkeypatch.setattr(module, "is_cluster", lambda client: True, raising=False)
    return Queue(admin, f"iso-good-{tag}"), Queue(admin, f"iso-bad-{tag}")


@pytest.mark.parametrize("bad_hangs", [False, True])
def test_a_node_that_is_down_does_not_hold_back_the_others_outcomes(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, bad_hangs: bool
) -> None:
    # Waited on conditions with 30 s liveness bounds, not fixed loop counts (2 s for the bad
    # job's start, 6 s for the good outcomes): a process stalled under load ran out of them.
    qg, qb = _two_nodes(module_server, monkeypatch)
    good, bad = qg.name, qb.name
    qb.enqueue("iso-quick", None, job_id="b1")
    later = [f"g{i}" for i in range(3)]
    down = False
    bad_reports = 0

    async def main() -> None:
        nonlocal down
        settings = WorkerSettings(queues=(good, bad), concurrency=4, grace_s=0)
        w = Worker(connect_async(module_server.url), registry, settings)
        real = w._pipe.run
        bad_keys = w._by_name[bad].script_keys

        async def run(items: Any) -> list[Any]:
            nonlocal bad_reports
            if down and any(keys == bad_keys for keys, _ in items):
                if "b1" in ended:  # nothing of it runs any more: its outcome's call
                    bad_reports += 1
                if bad_hangs:
                    await asyncio.sleep(60)
                raise RedisConnectionError("node of the bad queue is down")
            return await real(items)

        monkeypatch.setattr(w._pipe, "run", run)
        task = asyncio.create_task(w.run(install_signals=False))
        await until(lambda: "b1" in ran)  # its node goes down before its report
        down = True
        await until(lambda: bad_reports >= 1 or task.done())
        # Enqueued once the bad job's report has been sent to its down node (due 50 ms apart:
        # reports of their own): before, sent again with it, forever.
        for i, j in enumerate(later):
            qg.enqueue("iso-quick", None, job_id=j, delay_ms=50 * i)

        # Until the good outcomes are written while the node is down or hangs (a hanging
        # node's lone report is bounded by the claims' wait too: it held the reporter for
        # the socket timeout, and these outcomes waited for the shutdown's flush).
        def settled() -> bool:
            if not set(later) <= set(ended):
                return task.done()
            return all(qg.status(j) == "done" for j in later) or task.done()

        await until(settled)
        during.extend(qg.status(j) for j in later)
        w.request_stop()
        await task
        await w.client.aclose()

    during: list[str | None] = []
    asyncio.run(main())
    assert bad_reports >= 1  # the scenario: the bad job's outcome was sent while its node was down
    assert "b1" in ran and all(j in ran for j in later), ran
    assert during == ["done"] * 3  # written while the bad node was down or hung
    assert [qg.status(j) for j in later] == ["done"] * 3
    assert qb.status("b1") == "leased"  # its outcome never reached its node: the lease lapses


@registry.task(name="iso-slow")
async def slow(payload: Any, ctx: JobContext) -> None:
    ran.append(ctx.job_id)
    await asyncio.sleep(30)


def test_at_shutdown_the_healthy_nodes_jobs_are_given_back(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both queues' jobs are running when the worker stops; the bad node is down. The good
    # node's job is released (due again at once), not left to its lease's end (before: one
    # release call for every queue failed whole).
    qg, qb = _two_nodes(module_server, monkeypatch)
    good, bad = qg.name, qb.name
    qg.enqueue("iso-slow", None, job_id="g1")
    qb.enqueue("iso-slow", None, job_id="b1")

    async def main() -> None:
        settings = WorkerSettings(queues=(good, bad), concurrency=4, grace_s=0)
        w = Worker(connect_async(module_server.url), registry, settings)
        real = w._pipe.run
        bad_keys = w._by_name[bad].script_keys
        down = False

        async def run(items: Any) -> list[Any]:
            if down and any(keys == bad_keys for keys, _ in items):
                raise RedisConnectionError("node of the bad queue is down")
            return await real(items)

        monkeypatch.setattr(w._pipe, "run", run)
        task = asyncio.create_task(w.run(install_signals=False))
        # Until both run (a 30 s liveness bound, not a fixed 3 s loop a stalled process ran out).
        await until(lambda: {"g1", "b1"} <= set(ran) or task.done())
        down = True
        w.request_stop()
        await task
        await w.client.aclose()

    asyncio.run(main())
    assert {"g1", "b1"} <= set(ran), ran
    assert qg.status("g1") == "due" and qb.status("b1") == "leased"


def test_the_presence_beat_on_the_healthy_nodes_goes_on(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's entry on the good queue (`scheduler workers`, the dashboard) is refreshed
    # while the bad node is down; before, one presence call for every queue failed whole and
    # the entry was never written (it would expire after 3 heartbeats).
    # Watched as beats written to the good node (its last-seen time moving on, the entry there
    # with it) until 6 were, two entries' lives (a 30 s liveness bound), not as the entry seen
    # at 8 samples 0.1 s apart: a process stalled past the entry's 300 ms life under load
    # let it expire between two beats, which is the load, not the code.
    qg, qb = _two_nodes(module_server, monkeypatch)
    good, bad = qg.name, qb.name
    beats: list[float] = []

    async def main() -> None:
        settings = WorkerSettings(
            queues=(good, bad), concurrency=4, grace_s=0, lease_ms=300, heartbeat_ms=100
        )
        w = Worker(connect_async(module_server.url), registry, settings)
        real = w._pipe.requests
        bad_keys = w._by_name[bad].script_keys

        async def requests(items: Any) -> list[Any]:
            if any(tuple(keys) == tuple(bad_keys) for keys, _ in items):
                raise RedisConnectionError("node of the bad queue is down")
            return await real(items)

        monkeypatch.setattr(w._pipe, "requests", requests)
        task = asyncio.create_task(w.run(install_signals=False))
        entry = qg.keys.prefix + f"worker:{w.id}"
        deadline = time.monotonic() + 30
        while len(beats) < 6 and time.monotonic() < deadline and not task.done():
            pipe = qg.client.pipeline(transaction=True)  # one read: the beat and its entry
            pipe.zscore(qg.keys.workers, w.id)
            pipe.exists(entry)
            seen_ms, there = pipe.execute()
            if seen_ms is not None and there and (not beats or seen_ms > beats[-1]):
                beats.append(seen_ms)
            await asyncio.sleep(0.01)
        w.request_stop()
        await task
        await w.client.aclose()

    asyncio.run(main())
    assert len(beats) >= 6, beats
