"""A live resharding of a queue's slot (docs/cluster.md, "Moving a queue's slot"): the slot is
moved to another primary the way `redis-cli --cluster reshard` does it (SETSLOT IMPORTING /
MIGRATING, MIGRATE a few keys at a time, SETSLOT NODE on every primary). While the slot is
split every script call of the queue is refused whole with TRYAGAIN (its declared prefix key
exists on neither node), so nothing runs half on one node; core/cluster_io.py sends a refused
call again for about 0.5 s, then hands TRYAGAIN back; after SETSLOT NODE all is served from the
target.

Runs on the cluster run's own cluster (SCHEDULER_TEST_SERVER=cluster), else on one started for
this module (~8 s). Times are printed (`pytest -s`), never asserted."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
from redis.exceptions import TryAgainError

from scheduler import AsyncQueue, JobNotFound, JobSpec, Queue
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core import cluster_io
from scheduler.core.connection import connect, connect_async
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import delete_queue
from tests.fixtures.slot_move import SlotMove
from tests.workers.procs import wait_for

registry = Registry()
# (job id, token, run_at_ms, claimed_ms, local ms when the handler ran), in run order.
RUNS: list[tuple[str, str, int, int, int]] = []


@registry.task(name="rs-record")
async def record(payload: Any, ctx: JobContext) -> Any:
    RUNS.append((ctx.job_id, ctx.token, ctx.run_at_ms, ctx.claimed_ms, int(time.time() * 1000)))
    return None


def _keys_of(rc: Any, q: Queue, job_id: str) -> list[str]:
    return [k for k in rc.scan_iter(match=q.keys.pattern()) if k.endswith(f":{job_id}")]


class Reshard(threading.Thread):
    """A whole move in the background, 4 keys per MIGRATE, 20 ms apart (slower than redis-cli's
    default of 10 keys a call back to back, so the queue stays split for a while)."""

    def __init__(self, move: SlotMove) -> None:
        super().__init__(daemon=True)
        self.move = move
        self.done = threading.Event()
        self.seconds = float("nan")
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            self.move.split()
            self.move.migrate(batch=4, pause_s=0.02)
            self.move.finish()
            self.seconds = time.monotonic() - started
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.done.set()


class Producer(threading.Thread):
    """Enqueues p0, p1, ... (delays 0-2 s) until stopped. A call that still raised TRYAGAIN was
    refused whole: its id goes to `refused` and the next call uses a new id, so the test can
    check that the refused one left nothing behind."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(daemon=True)
        self.q = Queue(connect(url), name)
        self.accepted: list[str] = []
        self.refused: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd, i = random.Random(7), 0
        try:
            while not self.stop.is_set():
                job_id, i = f"p{i}", i + 1
                try:
                    self.q.enqueue("rs-record", None, job_id=job_id, delay_ms=rnd.randint(0, 2000))
                except TryAgainError:
                    self.refused.append(job_id)
                else:
                    self.accepted.append(job_id)
                time.sleep(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            self.q.client.close()


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()  # "redis error during claim: TryAgainError: ..."
        self.seen[text.split(" (", 1)[0][:80]] += 1


@pytest.mark.slow
def test_a_queue_survives_a_live_reshard_of_its_slot(
    rc: Any, cluster_url: str, queue_name: str
) -> None:
    """A worker drains and a producer enqueues while the queue's slot moves: every accepted
    job is done, once, never before its run_at; the worker never stops; a refused enqueue left
    nothing; the queue's keys end on the target."""
    RUNS.clear()
    q = Queue(rc, queue_name)
    rnd = random.Random(1)
    first = q.enqueue_many(
        [JobSpec("rs-record", None, delay_ms=rnd.randint(0, 2000)) for _ in range(300)]
    )
    move = SlotMove(rc, q.keys.prefix)
    reshard = Reshard(move)
    producer = Producer(cluster_url, queue_name)
    log = logging.getLogger(f"test-reshard-{queue_name}")
    warned = _Warnings()
    log.addHandler(warned)

    async def main() -> tuple[int, bool]:
        client = connect_async(cluster_url)
        settings = WorkerSettings(queues=(queue_name,), concurrency=8, lease_ms=30_000,
                                  heartbeat_ms=1_000, grace_s=1)  # fmt: skip
        w = Worker(client, registry, settings, logger=log)
        run = asyncio.create_task(w.run(install_signals=False))
        try:
            producer.start()
            await asyncio.to_thread(wait_for, lambda: len(RUNS) >= 20, 20, "the first runs")
            reshard.start()
            await asyncio.to_thread(reshard.done.wait, 60)
            n = len(producer.accepted)  # a little more after the move: the target serves all
            await asyncio.to_thread(
                wait_for, lambda: len(producer.accepted) >= n + 20, 20, "enqueues after"
            )
            producer.stop.set()
            await asyncio.to_thread(producer.join, 20)
            accepted = set(first) | set(producer.accepted)
            await asyncio.to_thread(
                wait_for, lambda: accepted <= {r[0] for r in RUNS} or run.done(), 30,
                "every accepted job run",
            )  # fmt: skip
            alive = not run.done()
            await asyncio.to_thread(
                wait_for, lambda: all(q.status(j) == "done" for j in accepted), 20, "all done"
            )
        finally:
            w.request_stop()
            code = await asyncio.wait_for(run, 20)
            await client.aclose()
        return code, alive

    try:
        code, alive = asyncio.run(main())
        assert reshard.error is None and producer.error is None, (reshard.error, producer.error)
        accepted = [*first, *producer.accepted]
        print(
            f"\nreshard: {move.moved} keys moved in {reshard.seconds:.2f}s (4 per MIGRATE, "
            f"20 ms apart); {len(accepted)} jobs accepted, {len(producer.refused)} enqueues "
            f"refused (TRYAGAIN after cluster_io's ~0.5 s of re-sends); worker warnings: "
            f"{dict(warned.seen)}"
        )
        assert alive and code == EXIT_OK
        assert {q.status(j) for j in accepted} == {"done"}
        ran = [r[0] for r in RUNS]
        assert len(ran) == len(set(ran)) == len(accepted), "a job ran twice or not at all"
        early = [r for r in RUNS if r[3] < r[2] or r[4] < r[2]]
        assert early == [], early[:5]
        for job_id in producer.refused:  # refused whole: no job, no key of its id
            with pytest.raises(JobNotFound):
                q.status(job_id)
            assert _keys_of(rc, q, job_id) == []
        assert rc.get_node_from_key(q.keys.prefix).name == move.target.name
        keys = list(rc.scan_iter(match=q.keys.pattern()))
        assert move.count(move.src) == 0 and move.count(move.dst) == len(keys) > 0
    finally:
        producer.stop.set()
        log.removeHandler(warned)
        delete_queue(rc, q)


def test_a_partitioned_worker_does_not_wait_out_a_moving_partitions_resends(
    rc: Any, cluster_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker over two partitions while one's slot is split: its claims there are refused
    (TRYAGAIN) and fail at once, without the driver's ~0.5 s of re-sends the other partition's
    claims would wait behind; the other is drained meanwhile, the moved one after the move."""
    RUNS.clear()
    pq = PartitionedQueue.create(rc, queue_name, partitions=2)
    moving, other = pq.parts
    moving.enqueue("rs-record", None, job_id="m0")
    drained = set(other.enqueue_many([JobSpec("rs-record", None) for _ in range(20)]))
    move = SlotMove(rc, moving.keys.prefix)
    move.split()
    move.migrate(batch=1, most=1)  # some keys on each node: TRYAGAIN from the source
    claim_pauses: list[int] = []

    async def apause() -> None:  # a re-send's pause, counted when a claim call waits it out
        if any(f.function == "claim" for f in inspect.stack()):
            claim_pauses.append(1)
        await asyncio.sleep(cluster_io._PAUSE_S)

    monkeypatch.setattr(cluster_io, "_wait_async", apause)
    log = logging.getLogger(f"test-reshard-{queue_name}")
    warned = _Warnings()
    log.addHandler(warned)

    async def main() -> None:
        client = connect_async(cluster_url)
        settings = WorkerSettings(queues=(moving.name, other.name), concurrency=8, grace_s=1)
        w = Worker(client, registry, settings, logger=log)
        run = asyncio.create_task(w.run(install_signals=False))
        try:
            await asyncio.to_thread(
                wait_for, lambda: drained <= {r[0] for r in RUNS} or run.done(), 20,
                "the other partition drained",
            )  # fmt: skip
            await asyncio.sleep(1.5)  # a few more refused claims (the skip grows to 1 s)
            assert "m0" not in {r[0] for r in RUNS}
            await asyncio.to_thread(move.migrate, 100)
            await asyncio.to_thread(move.finish)
            await asyncio.to_thread(wait_for, lambda: "m0" in {r[0] for r in RUNS}, 20, "m0")
        finally:
            w.request_stop()
            code = await asyncio.wait_for(run, 20)
            await client.aclose()
        assert code == EXIT_OK

    try:
        asyncio.run(main())
        claims = "redis error during claim: TryAgainError"
        refused = sum(n for text, n in warned.seen.items() if text.startswith(claims))
        assert refused >= 2, dict(warned.seen)
        assert claim_pauses == [], f"{len(claim_pauses)} claim re-send pauses"
        assert {other.status(j) for j in drained} == {moving.status("m0")} == {"done"}
    finally:
        log.removeHandler(warned)
        if move.count(move.src):
            move.end()
        for part in pq.parts:
            delete_queue(rc, part)
        rc.delete(f"sched:{{{queue_name}}}:partitions")


# -- cluster_io sends a TRYAGAIN-refused call again (the pause is the test's hook) -----------
@pytest.mark.parametrize("moved_all", [False, True], ids=["keys-split", "all-moved"])
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_an_enqueue_refused_with_tryagain_is_sent_again_until_the_move_ends(
    rc: Any, cluster_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch,
    flavour: str, moved_all: bool,
) -> None:  # fmt: skip
    """keys-split: the source has some of the queue's keys (TRYAGAIN from the source);
    all-moved: it has none (ASK, then TRYAGAIN from the target after ASKING). The move ends at
    the second pause: the enqueue returns, the job is there once, on the target."""
    q = Queue(rc, queue_name)
    before = q.enqueue_many([JobSpec("t", None) for _ in range(6)])
    move = SlotMove(rc, q.keys.prefix)
    move.split()
    move.migrate(batch=2, most=None if moved_all else 4)
    assert (move.count(move.src) == 0) is moved_all
    pauses: list[int] = []

    def pause() -> None:
        pauses.append(1)
        if len(pauses) == 2:  # the rest of the keys, then the move ends
            move.end()

    async def apause() -> None:
        pause()

    monkeypatch.setattr(cluster_io, "_wait_sync", pause)
    monkeypatch.setattr(cluster_io, "_wait_async", apause)
    try:
        job_id = _enqueue(flavour, cluster_url, q, "j-during")
        assert job_id == "j-during" and len(pauses) == 2
        assert q.status(job_id) == "due" and q.counts().due == 7
        assert {q.status(j) for j in before} == {"due"}
        assert move.count(move.src) == 0
        assert rc.get_node_from_key(q.keys.prefix).name == move.target.name
    finally:
        if len(pauses) < 2:
            move.end()
        delete_queue(rc, q)


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_tryagain_is_handed_back_after_the_bound_and_the_call_wrote_nothing(
    rc: Any, cluster_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch, flavour: str
) -> None:
    q = Queue(rc, queue_name)
    q.enqueue("t", None)
    move = SlotMove(rc, q.keys.prefix)
    move.split()
    pauses: list[int] = []

    async def apause() -> None:
        pauses.append(1)

    monkeypatch.setattr(cluster_io, "_wait_sync", lambda: pauses.append(1))
    monkeypatch.setattr(cluster_io, "_wait_async", apause)
    try:
        with pytest.raises(TryAgainError):
            _enqueue(flavour, cluster_url, q, "j-refused")
        assert len(pauses) == cluster_io._TRYAGAIN_ROUNDS
    finally:
        move.end()
    try:
        with pytest.raises(JobNotFound):
            q.status("j-refused")
        assert _keys_of(rc, q, "j-refused") == [] and q.counts().due == 1
    finally:
        delete_queue(rc, q)


def _enqueue(flavour: str, url: str, q: Queue, job_id: str) -> str:
    if flavour == "sync":
        return q.enqueue("t", None, job_id=job_id)

    async def main() -> str:
        client = connect_async(url)
        try:
            return await AsyncQueue(client, q.name).enqueue("t", None, job_id=job_id)
        finally:
            await client.aclose()

    return asyncio.run(main())


# -- which refused commands are sent again (no server) -----------------------------------------
class _Node:
    def __init__(self, name: str) -> None:
        self.name = name


_A, _B = _Node("a"), _Node("b")
_TRY = TryAgainError("Multiple keys request during rehashing of slot")


@pytest.mark.parametrize(
    ("cmds", "routes", "sent", "replies", "again"),
    [
        # the refused call and the WAIT after it, to the node and with the ASKING they had
        ([("EVALSHA", "x"), ("WAIT", 1, 0)], ["q", "q"], [(_A, [0, 1], True)],
         [_TRY, 0], {"a": [(0, True), (1, True)]}),
        # a later call of the same slot ran (the target took over in between): not re-sent
        ([("EVALSHA", "x"), ("EVALSHA", "y")], ["q", "q"], [(_A, [0, 1], False)],
         [_TRY, "ok"], None),
        # another slot's answer is no reason to keep this one's TRYAGAIN
        ([("EVALSHA", "x"), ("EVALSHA", "y")], ["q", "r"], [(_A, [0], False), (_B, [1], False)],
         [_TRY, "ok"], {"a": [(0, False)]}),
    ],
)  # fmt: skip
def test_which_tryagain_replies_are_sent_again(
    cmds: list[tuple[Any, ...]], routes: list[str], sent: list[tuple[_Node, list[int], bool]],
    replies: list[Any], again: dict[str, list[tuple[int, bool]]] | None,
) -> None:  # fmt: skip
    plan = [(node, [(i, asking, cmds[i]) for i in idx]) for node, idx, asking in sent]
    todo, got, pause = cluster_io._again(None, routes, cmds, replies, plan)
    if again is None:
        assert (todo, got, pause) == ([], None, False)
        return
    assert pause and got is not None
    assert {n.name: [(i, a) for i, a, _ in items] for n, items in got} == again
    assert todo == sorted(i for items in again.values() for i, _ in items)
