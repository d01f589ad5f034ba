"""Review: features reviewed recently on one server, checked on a Redis Cluster.

The recent review modules were run under SCHEDULER_TEST_SERVER=cluster; those whose failures
there came from the test (a plain `redis.Redis.from_url` of the cluster URL, a monkeypatch of
`redis.Redis.zrange` the cluster client never calls, `connection_pool` of a RedisCluster, a
WAIT that the cluster's replicas do answer) or that ran on the module's private single server
whatever the run (async cancellation, refused settles) are checked here again on the cluster
itself: the asyncio cluster driver (scheduler/core/cluster_io.py) cancelled at any step or timed
out on a paused node, `jobs cancel --state` paging while a worker claims, doctor's findings
during a busy worker and on an undecodable pending job, the asyncio client's cancel retention
and result(), and a worker's complete / fail refused by a hand edit.

Runs on the cluster run's own cluster (SCHEDULER_TEST_SERVER=cluster), else on one started for
this module (~8 s), as tests/test_cluster.py does."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.cluster import RedisCluster

from scheduler import AsyncQueue, JobCancelled, JobSpec, Queue
from scheduler.admin.doctor import check_queue
from scheduler.cli.main import main
from scheduler.core.connection import connect, connect_async
from scheduler.core.models import JobState
from scheduler.worker import EXIT_OK, Worker, WorkerSettings, logs
from tests.conftest import delete_queue
from tests.test_doctor_fix_review2 import doctor_under_load
from tests.test_review_settle_refused import (
    EDITS,
    GATES,
    HOOKED,
    RUNS,
    Lines,
    _hash_made_string,
    outcomes,
    places,
    poll,
    registry,
)

HOUR = 3_600_000
Call = Callable[[], Awaitable[Any]]


@pytest.fixture
def cq(rc: Any) -> Iterator[Queue]:
    queue = Queue(rc, "rc-" + uuid.uuid4().hex[:10])
    yield queue
    delete_queue(rc, queue)


@pytest.fixture
def lines() -> Iterator[Lines]:
    RUNS.clear()
    HOOKED.clear()
    GATES.clear()
    log = logging.getLogger(logs.LOGGER)
    handler, level = Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def in_use(c: Any) -> int:
    """Connections taken from the asyncio cluster client's nodes and not given back."""
    return sum(len(node._connections) - len(node._free) for node in c.get_nodes())


async def settle(c: Any) -> int:
    for _ in range(100):
        if in_use(c) == 0:
            return 0
        await asyncio.sleep(0.01)
    return in_use(c)


async def outcome(task: asyncio.Task[Any]) -> Any:
    try:
        return await task
    except BaseException as exc:  # the outcome is what is checked
        return exc


async def three(aq: AsyncQueue) -> None:
    await aq.enqueue("t", {"who": "a"}, job_id="job-a")
    await aq.enqueue("t", {"who": "b"}, job_id="job-b")
    await aq.enqueue("t", {"who": "s"}, job_id="job-s", delay_ms=HOUR)


async def answers_are_their_own(aq: AsyncQueue) -> None:
    jb, st, counts, ja = await asyncio.gather(
        aq.get_job("job-b"), aq.status("job-s"), aq.counts(), aq.get_job("job-a")
    )
    assert (jb.id, jb.payload()) == ("job-b", {"who": "b"})
    assert (ja.id, ja.payload()) == ("job-a", {"who": "a"})
    assert st == JobState.SCHEDULED
    assert counts.scheduled == 1 and counts.leased == 0


# -- the asyncio cluster driver under cancellation (test_review_async_cancel ran on one server) --
def test_a_cancel_at_any_loop_step_on_a_cluster_leaves_the_next_calls_their_own_replies(
    cluster_url: str,
) -> None:
    async def go() -> None:
        c: Any = connect_async(cluster_url)
        aq = AsyncQueue(c, "rc-ac-" + uuid.uuid4().hex[:8])
        await three(aq)
        sent: set[str] = set()
        calls: dict[str, Callable[[int], Call]] = {
            "enqueue": lambda n: lambda: aq.enqueue("t", {"n": n}, job_id=f"e{n}"),
            "enqueue_many": lambda n: (
                lambda: aq.enqueue_many(
                    [JobSpec("t", {"m": n, "k": k}, job_id=f"m{n}-{k}") for k in range(3)],
                    batch_size=1,
                )
            ),
            "get_job": lambda n: lambda: aq.get_job("job-a"),
            "counts": lambda n: aq.counts,
        }
        for name, make in calls.items():
            for n in range(14):
                task = asyncio.ensure_future(make(n)())
                for _ in range(n):
                    await asyncio.sleep(0)
                task.cancel()
                got = await outcome(task)
                if name == "enqueue":
                    sent.add(f"e{n}")
                    assert isinstance(got, asyncio.CancelledError) or got == f"e{n}", got
                elif name == "enqueue_many":
                    sent.update(f"m{n}-{k}" for k in range(3))
                elif name == "get_job" and not isinstance(got, BaseException):
                    assert got.id == "job-a"
                await answers_are_their_own(aq)
        assert await settle(c) == 0
        for job_id in sorted(sent):
            assert await aq.enqueue("t", {"again": 1}, job_id=job_id) == job_id
        assert (await aq.counts()).due == 2 + len(sent)
        await c.aclose()

    asyncio.run(go())


def test_calls_timed_out_on_a_paused_cluster_node_leave_nothing_behind(
    cluster_url: str, rc: Any
) -> None:
    async def go() -> None:
        c: Any = connect_async(cluster_url)
        name = "rc-to-" + uuid.uuid4().hex[:8]
        aq = AsyncQueue(c, name)
        await three(aq)
        await asyncio.gather(*(c.ping(target_nodes=c.get_primaries()) for _ in range(8)))
        many = [JobSpec("t", {"k": k}, job_id=f"slow-m{k}") for k in range(3)]
        calls: list[Call] = [
            lambda: aq.get_job("job-a"),
            aq.counts,
            lambda: aq.enqueue("t", {"slow": 1}, job_id="slow-1"),
            lambda: aq.enqueue_many(many, batch_size=1),
        ]
        owner = rc.get_redis_connection(rc.get_node_from_key(f"sched:{{{name}}}:"))
        owner.client_pause(200)
        got = await asyncio.gather(
            *(asyncio.wait_for(call(), 0.03) for call in calls), return_exceptions=True
        )
        assert all(isinstance(g, TimeoutError) for g in got), got
        await asyncio.sleep(0.25)
        await answers_are_their_own(aq)
        assert await settle(c) == 0
        assert await aq.enqueue("t", {"slow": 2}, job_id="slow-1") == "slow-1"
        assert await aq.enqueue_many(many) == [s.job_id for s in many]
        assert (await aq.counts()).due == 2 + 1 + 3
        await c.aclose()

    asyncio.run(go())


# -- the asyncio client's retention and result() (test_retention_review used Redis.from_url) ---
def test_an_async_cancel_and_result_on_a_cluster_keep_the_retention(
    cluster_url: str, cq: Queue, rc: Any
) -> None:
    jid = cq.enqueue("t", {})
    done = cq.enqueue("t", {})
    (job,) = cq.claim("w", limit=1, lease_ms=60_000).jobs
    assert job.id == jid
    cq.complete(job.id, job.token, "out")
    gone = cq.enqueue("t", {})

    async def go() -> tuple[str, Any, bool]:
        c: Any = connect_async(cluster_url)
        try:
            aq = AsyncQueue(c, cq.name, result_ttl_ms=5 * HOUR)
            word = await aq.cancel(gone)
            got = await aq.result(jid, timeout_s=1)
            try:
                await aq.result(gone, timeout_s=1)
            except JobCancelled:
                return word, got, True
            return word, got, False
        finally:
            await c.aclose()

    assert asyncio.run(go()) == ("due", "out", True)
    assert 4 * HOUR < rc.pttl(cq.keys.job(gone)) <= 5 * HOUR
    assert cq.status(done) == JobState.DUE


# -- `jobs cancel --state` pages (test_cli_bulk_review patched redis.Redis.zrange) ---------------
def test_cancel_scheduled_by_task_on_a_cluster_misses_none_while_a_worker_claims(
    cluster_url: str, cq: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    cq.enqueue_many([JobSpec("ok", {"i": i}) for i in range(1500)])
    bad = cq.enqueue_many([JobSpec("bad", {"i": i}, delay_ms=HOUR) for i in range(2500)])
    original = RedisCluster.zrange
    reads: list[int] = []

    def zrange(self: Any, *args: Any, **kwargs: Any) -> Any:
        got = original(self, *args, **kwargs)
        reads.append(len(got))
        if len(reads) == 1:
            for job in cq.claim("other-worker", limit=300).jobs:
                cq.complete(job.id, job.token)
        return got

    monkeypatch.setattr(RedisCluster, "zrange", zrange)
    res = CliRunner().invoke(main, ["jobs", "cancel", "--json", "--yes", "-q", cq.name,
                                    "--state", "scheduled", "--task", "bad",
                                    "--url", cluster_url])  # fmt: skip
    monkeypatch.undo()
    assert res.exit_code == 0, res.output
    assert len(reads) > 1  # the claim came between two page reads
    assert json.loads(res.stdout)["cancelled"] == len(bad)
    assert [j.id for j in cq.list_jobs("scheduled", limit=1000) if j.task == "bad"] == []


# -- doctor (test_doctor_fix_review2 used Redis.from_url and client.connection_pool) -----------
def test_doctor_names_the_spec_key_of_an_undecodable_pending_job_on_a_cluster(
    cluster_url: str, cq: Queue, rc: Any
) -> None:
    jid = cq.enqueue("t", {"a": "x"})
    node = rc.get_node_from_key(cq.keys.spec(jid))
    raw = redis.Redis(host=node.host, port=node.port)
    try:
        spec = raw.get(cq.keys.spec(jid))
        assert isinstance(spec, bytes)
        raw.set(cq.keys.spec(jid), spec.replace(b'"x"', b'"\xff"'))
    finally:
        raw.close()
    surrogates = connect(cluster_url, encoding_errors="surrogateescape")
    try:
        (issue,) = [i for i in check_queue(surrogates, cq.name) if i.code == "undecodable"]
    finally:
        surrogates.close()
    assert issue.fix is not None and f"GET '{cq.keys.spec(jid)}'" in issue.fix


def test_doctor_finds_nothing_while_a_worker_moves_keyed_and_rated_jobs_on_a_cluster(
    cluster_url: str, cq: Queue, rc: Any
) -> None:
    other = connect(cluster_url)
    try:
        moved = doctor_under_load(Queue(other, cq.name), rc, per_feed=10, checks=15, deadline_s=15)
    finally:
        other.close()
    assert moved > 0


# -- a worker's settle refused by a hand edit (test_review_settle_refused ran on one server) ---
def _run_worker(
    url: str, queues: tuple[str, ...], body: Callable[[Worker], Awaitable[None]]
) -> tuple[int, Worker]:
    settings = WorkerSettings(queues=queues, lease_ms=60_000, heartbeat_ms=5_000, grace_s=0,
                              concurrency=4)  # fmt: skip
    seen: list[Worker] = []

    async def go() -> int:
        c = connect_async(url)
        w = Worker(c, registry, settings)
        seen.append(w)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await body(w)
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await c.aclose()
        return code

    code = asyncio.run(go())
    return code, seen[0]


@pytest.mark.parametrize("edit", ["hash-made-string", "token-edited", "cancelled"])
def test_a_complete_refused_for_a_hand_edit_on_a_cluster_is_logged_and_loses_no_job(
    cluster_url: str, cq: Queue, rc: Any, lines: Lines, edit: str
) -> None:
    change, word, status = EDITS[edit]
    jid = cq.enqueue("sr-gate", {"gate": True})
    after: list[str] = []

    async def body(w: Worker) -> None:
        await poll(lambda: jid in RUNS, "the job running")
        change(rc, cq, jid)
        GATES[jid].set()
        await poll(lambda: bool(lines.of(jid)), "its complete answered")
        after.append(cq.enqueue("sr-gate", {}))
        await poll(lambda: cq.status(after[0]) == "done", "the next job done")

    code, w = _run_worker(cluster_url, (cq.name,), body)
    assert code == EXIT_OK
    (line,) = lines.of(jid)
    got = (line.levelno, line.__dict__.get("event"), line.__dict__.get("refused"))
    assert got == (logging.WARNING, word, "complete"), lines.messages()
    assert line.__dict__.get("status") == status
    assert outcomes(w, cq.name) == {word: 1, "done": 1}
    if rc.zscore(cq.keys.leased, jid) is not None:
        rc.zadd(cq.keys.leased, {jid: 1})
        cq.claim("sr-probe", limit=10, lease_ms=60_000)
    assert places(rc, cq, jid), f"job {jid} is in no place after {edit}"


def test_a_refused_complete_on_one_node_leaves_a_queue_on_another_node_done(
    cluster_url: str, rc: Any, lines: Lines
) -> None:
    """Two queues on two primaries, both jobs ending in the same tick (one pipeline per node):
    the refusal on one node is that job's alone."""
    names: dict[str, str] = {}
    for i in range(200):
        name = f"rc-2n-{uuid.uuid4().hex[:6]}-{i}"
        names.setdefault(rc.get_node_from_key(f"sched:{{{name}}}:").name, name)
        if len(names) == 2:
            break
    qa, qb = (Queue(rc, n) for n in names.values())
    try:
        gone = qa.enqueue("sr-gate", {"gate": True})
        kept = qb.enqueue("sr-gate", {"gate": True})

        async def body(w: Worker) -> None:
            await poll(lambda: gone in RUNS and kept in RUNS, "both jobs running")
            _hash_made_string(rc, qa, gone)
            GATES[gone].set()
            GATES[kept].set()
            await poll(lambda: bool(lines.of(gone)) and bool(lines.of(kept)), "both answered")

        code, w = _run_worker(cluster_url, (qa.name, qb.name), body)
        assert code == EXIT_OK
        assert qb.status(kept) == "done"
        assert [r.__dict__.get("event") for r in lines.of(kept)] == ["done"]
        assert outcomes(w, qa.name) == {"stale": 1}
        assert outcomes(w, qb.name) == {"done": 1}
    finally:
        delete_queue(rc, qa)
        delete_queue(rc, qb)
