"""Review of job dependencies and chains as an app developer uses them (docs/flow-control.md,
"Dependencies"; scheduler/client/chain.py): `after=[ids]` on enqueue, fan-out and fan-in, deep
chains, what a waiting child does when its parent completes, retries, dies, is moved by
`scheduler queue move`, and the per-call work bounds a fan-out or fan-in must keep.

Each xfail(strict=True) is a defect: it asserts the behaviour a user should get and fails
today. The unmarked tests guard behaviour checked correct here (10,000 children of one parent,
a child's own delay and priority, cycles refused, a parent's retries)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler import BadArgument, JobSpec, Queue
from scheduler.admin.queue_move import QueueMove
from scheduler.core.codec import ENQUEUE_FIELDS
from scheduler.core.limits import ENQUEUE_PER_CALL, ENQUEUE_WORK_PER_CALL, REQUEUE_LINKS_PER_CALL
from scheduler.core.models import JobState
from scheduler.core.scripts import lua_dir
from scheduler.operations.requests import Script, ScriptPipeline
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock, delete_queue, dump_queue, new_queue

FLOW_END_STEP = 300  # lua/lib/flow.lua: children one script reaches at a parent's end
REQUEUE_PER_CALL = 500  # operations/dead_letters.py requeue_dead's batch_size


def _ids(q: Queue, limit: int = 100, lease_ms: int = 10_000) -> list[str]:
    return [j.id for j in q.claim("w", limit=limit, lease_ms=lease_ms).jobs]


def _lease(q: Queue, job_id: str, lease_ms: int = 10_000) -> str:
    (job,) = q.claim("w", limit=1, lease_ms=lease_ms).jobs
    assert job.id == job_id
    return job.token


@pytest.fixture
def dst(client: redis.Redis) -> Iterator[Queue]:
    queue = new_queue(client, "chains-dst-")
    yield queue
    delete_queue(client, queue)


# -- Defects ----------------------------------------------------------------------------------


def test_a_child_of_a_job_a_queue_move_has_taken_is_not_left_waiting_forever(
    client: redis.Redis, q: Queue, dst: Queue
) -> None:
    """One batch of `scheduler queue move`, step by step (move_out, move_in, move_done), with
    an enqueue after=[the moving job] between the first two steps (a producer still on the
    source, or the window of an interrupted run, which can last hours). lib/flow.lua
    flow_parents reads the moving job as pending (its spec record is still here), so the
    child waits; move_done deletes the parent here (job_del) and it runs in the destination:
    nothing in the source ever ends it. Doctor then calls the child stuck-waiting "edited by
    hand". Refusing the child (BadArgument, nothing written) or parking it are both fine."""
    parent = q.enqueue("parent", None, job_id="moving-parent")
    move = QueueMove(client, q.name, dst.name)
    entries = move.take(move.src[0], [parent])  # step 1: the parent is in `moving`
    assert [e.id for e in entries] == [parent]
    before = dump_queue(client, q)
    try:
        child: str | None = q.enqueue("child", None, after=[parent], job_id="child-of-moving")
    except BadArgument:
        child = None
        assert dump_queue(client, q) == before  # refused: nothing written
    assert move.put(entries) == "c"  # step 2: written into the destination
    move.finish(move.src[0], [parent])  # step 3: deleted from the source
    dst.complete(parent, _lease(dst, parent))  # it runs and is done there
    assert client.zcard(q.keys.prefix + "moving") == 0
    if child is not None:
        assert q.status(child) != JobState.HELD, "still waiting for a job no longer here"


def test_a_freed_child_does_not_overtake_higher_priority_work_as_if_aged(
    fq: tuple[Queue, Clock],
) -> None:
    """docs/flow-control.md: a due job is overtaken by higher-priority work for at most
    priority_aging_ms (60 s), then served ahead of every priority. A priority-0 child of a
    parent that ran 2 minutes was not due (nothing overtook it), but flow_parent_done puts it
    into due at its own run_at (its enqueue time): claim's aged pass takes it ahead of the
    priority-9 jobs. A fan-out of 10,000 low-priority steps freed so jumps the whole urgent
    queue (the queue degrades to FIFO behind them)."""
    q, clock = fq
    parent = q.enqueue("export", None)
    child = q.enqueue("report", None, after=[parent])
    token = _lease(q, parent, lease_ms=600_000)
    clock.set_ms(T0 + 120_000)  # the parent ran 2 minutes
    urgent = [q.enqueue("password-reset", None, priority=9) for _ in range(3)]
    q.complete(parent, token)
    assert _ids(q, limit=3) == urgent
    assert _ids(q) == [child]


def test_a_freed_child_started_at_once_is_not_reported_late(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """Each step of a chain is recorded in the per-minute start lateness (lib/lateness.lua,
    the dashboard's lateness chart and p99) as late by the run of the step before it, and
    `counts().oldest_due_ms` (`scheduler stats`' "late by") shows the queue minutes behind
    while every worker is idle: the lateness an operator alerts on says nothing of capacity
    once chains run. Same root as the aging above: the freed child keeps its enqueue-time
    run_at (lib/flow.lua flow_parent_done / flow_unhold)."""
    q, clock = fq
    parent = q.enqueue("step1", None)
    child = q.enqueue("step2", None, after=[parent])
    token = _lease(q, parent, lease_ms=600_000)
    clock.set_ms(T0 + 120_000)
    q.complete(parent, token)
    oldest = q.counts().oldest_due_ms
    assert oldest is not None and oldest >= T0 + 120_000, "reported 2 minutes overdue"
    assert _ids(q) == [child]  # claimed the moment it was freed
    stats = client.hgetall(f"{q.keys.prefix}stats:{(T0 + 120_000) // 60_000}")
    assert int(stats["late_max_ms"]) == 0, stats


def test_a_dead_parents_wide_subtree_is_parked_at_the_step_budget(
    q: Queue, client: redis.Redis
) -> None:
    """A parent of 1,500 two-step pipelines (child, then grandchild) dies: fail parks 300
    children; each child's own one-member set becomes its own `flow:ending` entry, and
    lib/flow.lua flow_ending_step takes `ZRANGE flow:ending 0 9`: 10 ends, so 10 grandchildren
    a claim while the budget is 300. 3,000 jobs need ~10 claims at the budget; it takes over
    150, and meanwhile (busy workers claim seldom) they read `waiting for 1 jobs` and keep
    appearing in the dead list long after an operator's "requeue all"."""
    n = 1_500
    parent = q.enqueue("prepare", None, job_id="root", max_attempts=1)
    kids = [f"c{i:04d}" for i in range(n)]
    q.enqueue_many([JobSpec("render", i, job_id=k, after=[parent]) for i, k in enumerate(kids)])
    q.enqueue_many([JobSpec("send", i, after=[k]) for i, k in enumerate(kids)])
    assert q.fail(parent, _lease(q, parent), ("E", "boom", "")).status == "dead"
    claims = 0
    while client.zcard(q.keys.flow_waiting) and claims < 400:  # bounded: ~160 today
        q.claim("w", limit=0)
        claims += 1
    assert client.zcard(q.keys.flow_waiting) == 0 and q.counts().dead == 2 * n + 1
    assert claims <= 2 * n // FLOW_END_STEP + 5, f"{claims} claims to park {2 * n} jobs"


def _record(q: Queue, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The requests the queue sends, each Script once (a pipeline's calls listed singly)."""
    sent: list[Any] = []
    execute = q._execute

    def recording(req: Any) -> Any:
        sent.extend(req.calls if isinstance(req, ScriptPipeline) else [req])
        return execute(req)

    monkeypatch.setattr(q, "_execute", recording)
    return sent


def _parent_links(args: list[str]) -> int:
    """Parents named by the jobs of one enqueue call (lua/enqueue.lua: 13 fields a job, the
    flow field last, its parents the 7th '|' part)."""
    links = 0
    for i in range(int(args[0])):
        flow = args[1 + i * ENQUEUE_FIELDS + ENQUEUE_FIELDS - 1]
        links += len(flow.split("|")[6].split()) if flow else 0
    return links


def test_a_fan_in_batch_is_sent_as_calls_of_bounded_work(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/limits.md: "The arguments' largest values no longer make one call longer: ... an
    enqueue call takes at most 1,000 jobs (10,000 held it 150-180 ms)". Parents are not
    counted: measured here (slowlog), a 1,000-job call took 9 ms plain, 46 ms with 1 parent
    each, 177 ms with 10, 1,370 ms with 100 (lib/flow.lua flow_parents + flow_wait: an HGET,
    a TYPE, a re-read, SADD, HSET and two ZSCOREs per parent per job), every client of the
    server waiting. Bound asserted: jobs + parents named per call at most 2 x 1,000 (a chain
    of 1,000 steps, 1,999, stays one call). AsyncQueue's enqueue batcher groups 1,000
    single enqueues the same way."""
    parents = q.enqueue_many([JobSpec("shard", i) for i in range(100)])
    sent = _record(q, monkeypatch)
    kids = q.enqueue_many([JobSpec("merge", i, after=parents) for i in range(1_000)])
    assert len(set(kids)) == 1_000 and q.counts().held_waiting == 1_000
    calls = [s for s in sent if isinstance(s, Script) and s.name == "enqueue"]
    work = [int(c.args[0]) + _parent_links(c.args) for c in calls]
    assert max(work) <= 2 * ENQUEUE_PER_CALL, f"one call: {max(work)} jobs + parents"


def _sadds(c: redis.Redis) -> int:
    """SADD commands the server ran (scripts' own included: INFO commandstats)."""
    return int(c.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0))


def test_requeue_of_parked_fan_in_children_is_sent_as_calls_of_bounded_work(
    private: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/limits.md: "requeue / purge of dead letters 500 per call, at most 22 ms". A child
    parked by one dead parent of its 100 and requeued waits again for the 99 still pending
    (lib/flow.lua flow_rewait -> flow_wait: reads, an SADD and an HSET per parent): 49,500
    parent links in one call, measured 470 ms. Bound asserted: the links one call writes
    (its SADDs into the parents' flow:children sets) at most 2 x its 500 ids. On the
    module's private server: its command statistics are this test's."""
    q = Queue(private, "requeue-fan-in")
    doomed = q.enqueue("a", None, max_attempts=1)
    others = q.enqueue_many([JobSpec("p", i, delay_ms=10**8) for i in range(99)])
    kids = q.enqueue_many([JobSpec("k", i, after=[doomed, *others]) for i in range(1_000)])
    assert q.fail(doomed, _lease(q, doomed), ("E", "boom", "")).status == "dead"
    for _ in range(10):  # the rest of the subtree's parking steps
        q.claim("w", limit=0)
    assert q.counts().dead == 1_001
    per_call: list[int] = []
    execute = q._execute

    def measured(req: Any) -> Any:
        before = _sadds(private)
        got = execute(req)
        if isinstance(req, Script) and req.name == "requeue_dead":
            per_call.append(_sadds(private) - before)
        return got

    monkeypatch.setattr(q, "_execute", measured)
    assert q.requeue_dead(kids) == 1_000
    assert q.counts().held_waiting == 1_000  # each waits again for its 99 pending parents
    assert max(per_call) <= 2 * REQUEUE_PER_CALL, f"parent links per call: {per_call}"


# -- Guards (checked correct) -----------------------------------------------------------------


def test_requeue_of_a_child_whose_parent_a_queue_move_has_taken_is_refused(
    client: redis.Redis, q: Queue, dst: Queue
) -> None:
    """A child parked at once (one parent dead) lists its other, pending parent but is in no
    set of it, so that parent can be taken by a move. Requeued then, the child would wait for
    a job the move deletes here: refused (BadArgument), nothing written; once the move is done
    the parent is gone here and the child runs."""
    doomed = q.enqueue("a", None, max_attempts=1)
    assert q.fail(doomed, _lease(q, doomed), ("E", "boom", "")).status == "dead"
    other = q.enqueue("p", None, job_id="moving-other")
    child = q.enqueue("k", None, after=[doomed, other])
    move = QueueMove(client, q.name, dst.name)
    entries = move.take(move.src[0], [other])
    assert [e.id for e in entries] == [other]
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match=r"after=moving-other \(being moved to another queue\)"):
        q.requeue_dead([child])
    assert dump_queue(client, q) == before
    assert move.put(entries) == "c"
    move.finish(move.src[0], [other])
    assert q.requeue_dead([child]) == 1
    assert _ids(q) == [child]


def test_the_requeue_link_bound_is_the_scripts() -> None:
    text = (lua_dir() / "requeue_dead.lua").read_text()
    m = re.search(r"LINKS_PER_CALL = (\d+)", text)
    assert m and int(m.group(1)) == REQUEUE_LINKS_PER_CALL


def test_ten_thousand_children_of_one_parent_are_all_freed_in_bounded_steps(
    q: Queue, client: redis.Redis
) -> None:
    """Every child freed, none lost or leased twice; no script reaches more than
    FLOW_END_STEP of them (complete's own, then one step per claim)."""
    parent = q.enqueue("parent", None)
    kids = q.enqueue_many([JobSpec("kid", i, after=[parent]) for i in range(10_000)])
    q.complete(parent, _lease(q, parent))
    assert client.zcard(q.keys.flow_waiting) == 10_000 - FLOW_END_STEP
    leased: list[str] = []
    for _ in range(100):  # 34 steps are needed
        waiting = client.zcard(q.keys.flow_waiting)
        leased += _ids(q, limit=1_000)
        assert waiting - client.zcard(q.keys.flow_waiting) <= FLOW_END_STEP
        if len(leased) >= 10_000 and not client.zcard(q.keys.flow_waiting):
            break
    assert sorted(leased) == sorted(kids)
    assert client.exists(q.keys.flow_ending) == 0


def test_a_childs_own_delay_and_priority_survive_its_wait(fq: tuple[Queue, Clock]) -> None:
    """Freed before its own run time, a child waits for it (never early), then is claimed by
    its own priority; a parent's retry and release keep it waiting."""
    q, clock = fq
    parent = q.enqueue("parent", None, max_attempts=3)
    child = q.enqueue("child", None, after=[parent], delay_ms=5_000, priority=9)
    token = _lease(q, parent)
    assert q.fail(parent, token, ("E", "m", ""), delay_ms=0).status == "retry"
    token = _lease(q, parent)
    assert q.release([(parent, token)]) == ["released"]
    assert q.status(child) == JobState.HELD
    token = _lease(q, parent)
    clock.set_ms(T0 + 1_000)
    q.complete(parent, token)
    assert q.status(child) == JobState.SCHEDULED
    low = q.enqueue("other", None)
    assert _ids(q) == [low]  # not early
    clock.set_ms(T0 + 5_000)
    q.enqueue("other", None)
    assert _ids(q, limit=1) == [child]  # its priority 9 first


def test_cycles_are_refused_typed_and_write_nothing(q: Queue, client: redis.Redis) -> None:
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="after=self"):
        q.enqueue("t", None, job_id="self", after=["self"])
    a_b = [JobSpec("t", None, job_id="a", after=["b"]), JobSpec("t", None, job_id="b", after=["a"])]
    with pytest.raises(BadArgument, match="after=b"):  # a parent must come first
        q.enqueue_many(a_b)
    with pytest.raises(BadArgument, match="no such job"):
        q.enqueue("t", None, after=["in-another-queue"])
    assert dump_queue(client, q) == before


def test_the_asyncio_batcher_groups_fan_in_children_by_jobs_and_parents(
    q: Queue, redis_url: str
) -> None:
    """The same bound for concurrent AsyncQueue.enqueue callers sharing calls
    (client/enqueue_batcher.py): it grouped up to 1,000 waiting callers into one call whatever
    the parents they named, 1,000 children of 100 parents each in one call (1.37 s). A call
    now takes at most ENQUEUE_WORK_PER_CALL jobs + parents named; every child still written."""
    from scheduler import AsyncQueue
    from scheduler.core.connection import connect_async

    parents = q.enqueue_many([JobSpec("shard", i) for i in range(100)])
    work: list[int] = []

    async def enqueue_at_once() -> list[str]:
        aclient = connect_async(redis_url)
        try:
            aq = AsyncQueue(aclient, q.name)
            send = aq._batcher._send

            async def recorded(args: list[str]) -> Any:
                work.append(int(args[0]) + _parent_links(args))
                return await send(args)

            aq._batcher._send = recorded
            specs = [aq.enqueue("merge", i, after=parents) for i in range(1_000)]
            return list(await asyncio.gather(*specs))
        finally:
            await aclient.aclose()

    kids = asyncio.run(enqueue_at_once())
    assert len(set(kids)) == 1_000 and q.counts().held_waiting == 1_000
    assert sum(w // 101 for w in work) == 1_000  # each call: its jobs of 1 + 100 each
    assert max(work) <= ENQUEUE_WORK_PER_CALL, f"jobs + parents per call: {work}"
