"""A stopping worker's calls refused until someone acts (REFUSED_UNTIL_FIXED: a queue a newer
version stores, a key edited by hand): nothing fixes either within a stop, so each is tried
once and given up for its queue (its leases lapse), where a dropped connection is still retried.
Before, classify() called them transient and the stop sent them again until the settle bound.
In-process workers on the module's private redis-server; counts of calls, never timings."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import Queue
from scheduler.core.connection import connect_async
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.worker import EXIT_OK, Worker, WorkerSettings, logs
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import delete_queue, new_queue
from tests.redis_server import RedisProcess

NEWER = str(STORAGE_GENERATION + 1)
registry = Registry()


@registry.task(name="rr-sleep")
async def nap(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(payload["s"])


@registry.task(name="rr-gate")
async def gated(payload: Any, ctx: JobContext) -> str:
    while not Path(payload["gate"]).exists():
        await asyncio.sleep(0.01)
    if payload["fail"]:
        raise ValueError("failed on purpose")
    return "ok"


async def poll(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.msgs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.msgs.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[Lines]:
    log = logging.getLogger(logs.LOGGER)
    handler, level = Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@pytest.fixture
def two(module_server: RedisProcess) -> Iterator[tuple[redis.Redis, Queue, Queue]]:
    admin = module_server.client()
    a, b = new_queue(admin, "rr-"), new_queue(admin, "rr-")
    yield admin, a, b
    delete_queue(admin, a)
    delete_queue(admin, b)
    admin.close()


def run(
    server: RedisProcess,
    queues: tuple[str, ...],
    body: Callable[[Worker], Awaitable[None]],
    setup: Callable[[Worker], None],
    **kw: Any,
) -> int:
    """An in-process worker of `queues` while body(worker) runs; then stopped; its exit code."""
    kw = {"lease_ms": 60_000, "heartbeat_ms": 200, "grace_s": 0, "concurrency": 4, **kw}

    async def main() -> int:
        c = connect_async(server.url)
        w = Worker(c, registry, WorkerSettings(queues=queues, **kw))
        setup(w)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await body(w)
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await c.aclose()
        return code

    return asyncio.run(main())


def dropped() -> Iterator[Any]:
    """An operation whose call fails as a dropped connection (Pipeline.run: that call's reply)."""
    raise RedisConnectionError("connection dropped")
    yield


def count_releases(w: Worker, calls: Counter[str], drop: frozenset[str] = frozenset()) -> None:
    """Count each queue's release calls; a queue of `drop` answers its first with a
    dropped connection (a cluster node's error comes back so, as that call's reply)."""
    for q in w.queues:
        real = q.ops.release

        def counted(leases: Any, real: Any = real, name: str = q.name) -> Any:
            calls[name] += 1
            return dropped() if name in drop and calls[name] == 1 else real(leases)

        q.ops.release = counted  # type: ignore[method-assign]


def test_a_release_a_newer_version_refuses_is_tried_once_and_the_others_go_through(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines
) -> None:
    admin, newer, other = two
    held = newer.enqueue("rr-sleep", {"s": 60})
    mine = other.enqueue("rr-sleep", {"s": 60})
    calls: Counter[str] = Counter()

    async def body(w: Worker) -> None:
        await poll(lambda: len(w.running) == 2, "both jobs running")
        admin.hset(newer.keys.config, "generation", NEWER)  # a newer version took it over

    code = run(module_server, (newer.name, other.name), body, lambda w: count_releases(w, calls))
    assert code == EXIT_OK
    # Before: the refusal read as transient, and both releases were sent again with backoff
    # until the settle bound (5 s): 7 or 8 calls each.
    assert calls == {newer.name: 1, other.name: 1}, calls
    assert other.status(mine) == "due"  # given back
    assert admin.zscore(newer.keys.leased, held) is not None  # its lease lapses on its own
    said = [m for m in lines.msgs if m.startswith(f"release of 1 jobs of {newer.name} failed")]
    assert len(said) == 1 and "NewerStorage: " in said[0] and "upgrade" in said[0], lines.msgs
    assert not [m for m in lines.msgs if "during release" in m], lines.msgs


def test_a_release_whose_connection_dropped_is_still_sent_again(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines
) -> None:
    _, dropped, other = two
    first = dropped.enqueue("rr-sleep", {"s": 60})
    second = other.enqueue("rr-sleep", {"s": 60})
    calls: Counter[str] = Counter()

    async def body(w: Worker) -> None:
        await poll(lambda: len(w.running) == 2, "both jobs running")

    def setup(w: Worker) -> None:
        count_releases(w, calls, frozenset({dropped.name}))

    assert run(module_server, (dropped.name, other.name), body, setup) == EXIT_OK
    # The dropped one once more; the other, answered the first time, is not sent again.
    assert calls == {dropped.name: 2, other.name: 1}, calls
    assert (dropped.status(first), other.status(second)) == ("due", "due")
    assert [m for m in lines.msgs if "during release" in m], lines.msgs


@pytest.mark.parametrize("outcome", ["complete", "fail"])
def test_an_outcome_refused_for_a_key_edited_by_hand_is_given_up_at_the_stop(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines,
    tmp_path: Path, outcome: str,
) -> None:  # fmt: skip
    admin, q, _ = two
    gate = tmp_path / "gate"
    job = q.enqueue("rr-gate", {"gate": str(gate), "fail": outcome == "fail"})
    rounds: list[bool] = []  # per report call: was the reporter stopped?
    seen: list[Worker] = []

    def setup(w: Worker) -> None:
        real = w._send_reports

        async def counted() -> None:
            rounds.append(w._stop_reporter.is_set())
            await real()

        w._send_reports = counted  # type: ignore[method-assign]

    async def body(w: Worker) -> None:
        seen.append(w)
        await poll(lambda: bool(w.running), "the job running")
        admin.delete(q.keys.leased)
        admin.set(q.keys.leased, "edited")  # complete, fail: CorruptKey until doctor's fix
        gate.touch()
        await poll(lambda: bool(rounds), f"its {outcome} sent (and refused)")

    assert run(module_server, (q.name,), body, setup) == EXIT_OK
    # Before: once stopped, the refused outcome was flushed again with backoff until the
    # settle bound (5 s: about ten calls), then "1 outcomes could not be reported".
    assert rounds.count(True) <= 1, rounds
    said = [m for m in lines.msgs if "given up at stop" in m]
    assert len(said) == 1, lines.msgs
    assert said[0].startswith(f"1 outcomes given up at stop: queue {q.name} has a key edited")
    assert "CorruptKey" in said[0] and "(at-least-once)" in said[0], said
    assert not [m for m in lines.msgs if "could not be reported" in m], lines.msgs
    labels = {"queue": q.name, "task": "rr-gate", "outcome": "stale"}
    assert seen[0].metrics.registry.get_sample_value("scheduler_jobs_total", labels) == 1
    assert admin.get(q.keys.leased) == "edited"
    assert admin.hget(q.keys.job(job), "state") not in ("done", "dead", "retry")


def test_a_claim_replay_a_newer_version_refuses_is_tried_once_at_the_stop(
    module_server: RedisProcess, two: tuple[redis.Redis, Queue, Queue], lines: Lines
) -> None:
    admin, newer, other = two
    admin.hset(newer.keys.config, "generation", NEWER)
    replays: Counter[str] = Counter()

    def setup(w: Worker) -> None:
        for wq in w.queues:
            real = wq.aq.claim

            def counted(*args: Any, real: Any = real, name: str = wq.name, **kw: Any) -> Any:
                replays[name] += kw.get("limit") == 0  # the stop's replay of a lost answer
                return real(*args, **kw)

            wq.aq.claim = counted  # type: ignore[method-assign]

    async def body(w: Worker) -> None:
        # Its claims refused, the claim's nonce stays pending: the stop replays it.
        await poll(lambda: newer.name in w._newer_storage, "the newer queue's claim refused")

    assert run(module_server, (newer.name, other.name), body, setup) == EXIT_OK
    # Before: the replay read NewerStorage as transient and was sent again until the settle
    # bound (5 s), which the release of the jobs never started then had no time left of.
    assert (replays[newer.name], replays[other.name]) == (1, 0), replays
    said = [m for m in lines.msgs if m.startswith(f"unanswered claim of {newer.name} not re-sent")]
    assert len(said) == 1 and "NewerStorage" in said[0], lines.msgs
