"""Review: combinations of enqueue options on the app developer's API (Queue, AsyncQueue,
enqueue_many, task handles, partitioned queues): the same input must give the same jobs on every
path, bulk and one call at a time alike, and a combination refused is refused with a typed
error, writing nothing.

Failing on the code reviewed (defects):
- test_a_debounced_call_after_a_plain_job_of_its_key_in_one_call_replaces_it
- test_a_plain_call_after_a_debounced_new_job_in_one_call_gets_the_new_job
- test_a_parent_id_written_by_a_later_job_of_the_call_is_that_job_not_the_keys
- test_a_debounced_job_not_durable_can_be_re_sent_with_its_id_as_the_docs_say
- test_a_rate_held_job_past_its_start_window_leaves_the_room_to_the_next_one
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest
import redis

from scheduler import (
    AsyncQueue,
    Backoff,
    BadArgument,
    InvalidPayload,
    JobSpec,
    NotDurable,
    Queue,
    Registry,
)
from scheduler.client.partitioned import PartitionedQueue
from scheduler.core.connection import connect_async
from tests.conftest import Clock, dump_queue

T0 = 1_000_000


def _payload(q: Queue, job_id: str) -> Any:
    return json.loads(q.get_job(job_id).payload_json)


def _claim_ids(q: Queue, limit: int = 10) -> list[str]:
    return [j.id for j in q.claim("w", limit=limit, lease_ms=100_000).jobs]


# -- debounce beside a plain call of its key, in one enqueue_many ------------------------------


def test_a_debounced_call_after_a_plain_job_of_its_key_in_one_call_replaces_it(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """Two calls (or one enqueue_many with batch_size=1): the debounced call replaces the plain
    job its key names (the latest data, its run time). In one script call the debounced job is
    answered 'e' with the first job and its payload and run time are dropped silently
    (enqueue.lua: `j.first = r or keyed[...]`, the debounce branch only looks at `r`, the key as
    stored before the call). Refusing the pair (as two debounced calls of a key are refused)
    would do too, if it wrote nothing."""
    q, clock = tq
    clock.set_ms(T0)
    specs = [
        JobSpec("digest", {"n": 1}, key="k", delay_ms=1_000),
        JobSpec("digest", {"n": 2}, key="k", debounce=True, delay_ms=5_000),
    ]
    # The reference: the same two jobs in two calls.
    ref = [q.enqueue_many([s])[0] for s in specs]
    assert ref[0] == ref[1]
    assert _payload(q, ref[0]) == {"n": 2}
    assert q.get_job(ref[0]).run_at_ms == T0 + 5_000

    q2 = Queue(client, q.name + "-b", _clock="test")
    Clock(client, q2).set_ms(T0)
    try:
        before = dump_queue(client, q2)
        try:
            ids = q2.enqueue_many(specs)
        except BadArgument:
            assert dump_queue(client, q2) == before
            return
        assert ids[0] == ids[1]
        assert _payload(q2, ids[0]) == {"n": 2}  # got {"n": 1}: the latest call lost
        assert q2.get_job(ids[0]).run_at_ms == T0 + 5_000
    finally:
        for key in client.scan_iter(match=q2.keys.pattern()):
            client.delete(key)


def test_a_plain_call_after_a_debounced_new_job_in_one_call_gets_the_new_job(
    tq: tuple[Queue, Clock],
) -> None:
    """The key's job was claimed, so the debounced call makes a new job N and the key names N.
    A plain call of the key after it is answered with N by a second call (and with
    batch_size=1), but within one script call with the old, already running job: its caller
    waits on (q.result) the wrong job and the key's new job looks unrequested
    (enqueue.lua: `j.first = r or keyed[...]` prefers the key's value from before the call)."""
    q, clock = tq
    clock.set_ms(T0)
    specs = [
        JobSpec("d", {"n": 1}, key="k", debounce=True, delay_ms=9_000),
        JobSpec("d", {"n": 2}, key="k", delay_ms=9_000),
    ]
    old = q.enqueue("d", {"n": 0}, key="k", debounce=True)
    assert _claim_ids(q) == [old]
    ref = q.enqueue_many(specs, batch_size=1)
    assert ref[0] != old and ref[1] == ref[0]

    old2 = q.enqueue("d", {"n": 0}, key="k2", debounce=True)
    assert _claim_ids(q) == [old2]
    specs2 = [JobSpec(s.task, s.payload, key="k2", debounce=s.debounce, delay_ms=9_000)
              for s in specs]  # fmt: skip
    ids = q.enqueue_many(specs2)
    assert ids[0] != old2
    assert ids[1] == ids[0]  # got old2, the job claimed before the call


def test_a_parent_id_written_by_a_later_job_of_the_call_is_that_job_not_the_keys(
    tq: tuple[Queue, Clock],
) -> None:
    """One enqueue_many gives id x twice: first with a key already taken (not written, it
    stands for the key's job Y), then without a key (written: job x). A child after=["x"]
    names a job that exists: as three separate calls do, it must wait for x. It waits for Y
    instead (its `parents` is Y; x done leaves it held until Y, 50 s later, is done):
    enqueue.lua's parents loop keeps `alias[x] = Y` after a later job of the call wrote x
    (flow_parents reads `alias[named] or named`). The same holds with the two specs in the
    other order."""
    q, clock = tq
    clock.set_ms(T0)
    y = q.enqueue("y", None, key="K", delay_ms=50_000)
    ids = q.enqueue_many(
        [
            JobSpec("p", None, job_id="x", key="K"),
            JobSpec("q", None, job_id="x"),
            JobSpec("c", None, after=["x"]),
        ]
    )
    assert ids[:2] == [y, "x"]
    (got,) = q.claim("w", limit=5, lease_ms=100_000).jobs
    assert got.id == "x"
    q.complete("x", got.token)
    assert q.get_job(ids[2]).fields.get("parents") != y
    assert q.status(ids[2]) == "due"  # got 'held': waiting for the key's job y


# -- held: the same combination stored alike on every path -------------------------------------

COMBOS: list[dict[str, Any]] = [
    {"delay_ms": 5_000, "start_within_ms": 1_000, "max_attempts": 3,
     "backoff": Backoff(base_ms=10, factor=2, cap_ms=100), "timeout_ms": 700, "jitter_ms": 0},
    {"priority": 7, "concurrency_key": "ck", "concurrency_limit": 2, "result_ttl_ms": 5_000,
     "keep_payload": True},
    {"rate_limit": "5/1s", "rate_key": "rk", "priority": 3, "start_within_ms": 60_000},
    {"after": ["PARENT"], "priority": 9, "delay_ms": 2_000, "start_within_ms": 10_000},
    {"key": "KEY", "key_ttl_ms": 60_000, "delay_ms": 3_000, "start_within_ms": 5},
    {"key": "KEY", "debounce": True, "delay_ms": 3_000, "keep_payload": True},
]  # fmt: skip


def _opts(combo: dict[str, Any], parent: str, tag: str) -> dict[str, Any]:
    out = dict(combo)
    if "after" in out:
        out["after"] = [parent]
    if "key" in out:
        out["key"] = f"key-{tag}"
    return out


def _seen(q: Queue, job_id: str) -> dict[str, str]:
    job = q.get_job(job_id)
    fields = dict(job.fields)
    fields.pop("enqueued_ms", None)
    return {"state": str(q.status(job_id)), "payload": job.payload_json, **fields}


@pytest.mark.parametrize("combo", COMBOS)
def test_every_path_stores_the_same_job_for_one_combination(
    redis_url: str, tq: tuple[Queue, Clock], combo: dict[str, Any]
) -> None:
    """Queue.enqueue, Queue.enqueue_many, AsyncQueue.enqueue and AsyncQueue.enqueue_many given
    one combination of options store the same job (every field but its enqueue time)."""
    q, clock = tq
    clock.set_ms(T0)
    parent = q.enqueue("parent", None)
    ids = {
        "one": q.enqueue("t", {"x": 1}, **_opts(combo, parent, "one")),
        "many": q.enqueue_many([JobSpec("t", {"x": 1}, **_opts(combo, parent, "many"))])[0],
    }

    async def main() -> None:
        aq = AsyncQueue(connect_async(redis_url), q.name, _clock="test")
        try:
            ids["aone"] = await aq.enqueue("t", {"x": 1}, **_opts(combo, parent, "aone"))
            spec = JobSpec("t", {"x": 1}, **_opts(combo, parent, "amany"))
            ids["amany"] = (await aq.enqueue_many([spec]))[0]
        finally:
            await aq.client.aclose()

    asyncio.run(main())
    seen = {path: _seen(q, i) for path, i in ids.items()}
    assert "task" in seen["one"] and seen["one"]["task"] == "t"
    for path in ("many", "aone", "amany"):
        assert seen[path] == seen["one"], path


def test_a_task_handle_gives_the_same_job_on_every_path(
    redis_url: str, tq: tuple[Queue, Clock]
) -> None:
    """handle.enqueue, handle.aenqueue, registry.job_spec through enqueue_many: the task's
    defaults (attempts, backoff, timeout, keep_payload, start window, priority, key limit) and
    a per-call override land alike."""
    q, clock = tq
    clock.set_ms(T0)
    registry = Registry()

    @registry.task(name="crawl", max_attempts=3, timeout_s=2, keep_payload=True,
                   start_within_ms=9_000, priority=4, concurrency_limit=2,
                   backoff=Backoff(base_ms=50, factor=3, cap_ms=500))  # fmt: skip
    def crawl(payload: Any, ctx: Any) -> None: ...

    ids = {
        "handle": crawl.enqueue(q, {"u": 1}, delay_ms=100, priority=6),
        "spec": q.enqueue_many([registry.job_spec("crawl", {"u": 1}, delay_ms=100, priority=6)])[0],
    }

    async def main() -> None:
        aq = AsyncQueue(connect_async(redis_url), q.name, _clock="test")
        try:
            ids["ahandle"] = await crawl.aenqueue(aq, {"u": 1}, delay_ms=100, priority=6)
        finally:
            await aq.client.aclose()

    asyncio.run(main())
    seen = {path: _seen(q, i) for path, i in ids.items()}
    one = seen["handle"]
    assert one["priority"] == "6" and one["ckey"] == "crawl" and one["climit"] == "2"
    assert one["max_attempts"] == "3" and one["timeout_ms"] == "2000"
    assert int(one["start_by_ms"]) == T0 + 100 + 9_000
    assert seen["spec"] == one and seen["ahandle"] == one


# -- held: combinations that behave as documented ----------------------------------------------


def test_a_start_window_shorter_than_the_delay_counts_from_the_run_time(
    tq: tuple[Queue, Clock],
) -> None:
    """start_within_ms=5 with a 10 s delay: the deadline is run_at + 5 ms, never before run_at."""
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("a", None, delay_ms=10_000, start_within_ms=5)
    b = q.enqueue("b", None, delay_ms=10_000, start_within_ms=5)
    assert q.get_job(a).start_by_ms == T0 + 10_005
    clock.set_ms(T0 + 9_999)
    assert _claim_ids(q) == []
    clock.set_ms(T0 + 10_005)
    assert _claim_ids(q, limit=1) == [a]
    clock.set_ms(T0 + 10_006)
    assert _claim_ids(q) == []
    assert q.status(b) == "dead" and q.get_job(b).dead_reason == "start deadline passed"


def test_a_child_of_priority_9_released_by_its_parent_overtakes_older_plain_jobs(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    p = q.enqueue("parent", None)
    q.enqueue("other", None)
    c = q.enqueue("child", None, priority=9, after=[p])
    (got,) = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert got.id == p
    q.complete(p, got.token)
    clock.set_ms(T0 + 10)
    assert _claim_ids(q, limit=1) == [c]


def test_a_child_whose_parent_ends_after_its_start_window_is_parked_not_run(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    p = q.enqueue("p", None)
    c = q.enqueue("c", None, after=[p], start_within_ms=100)
    (got,) = q.claim("w", limit=5, lease_ms=100_000).jobs
    clock.set_ms(T0 + 1_000)
    q.complete(p, got.token)
    assert _claim_ids(q) == []
    assert q.status(c) == "dead" and q.get_job(c).dead_reason == "start deadline passed"


def test_a_job_held_by_its_key_past_its_window_is_parked_and_the_next_one_runs(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("a", None, concurrency_key="ck", concurrency_limit=1)
    (ga,) = q.claim("w", limit=1, lease_ms=100_000).jobs
    b = q.enqueue("b", None, concurrency_key="ck", concurrency_limit=1, start_within_ms=100)
    c = q.enqueue("c", None, concurrency_key="ck", concurrency_limit=1)
    assert _claim_ids(q) == []
    assert q.status(b) == q.status(c) == "held"
    clock.set_ms(T0 + 1_000)
    q.complete(a, ga.token)
    assert _claim_ids(q) == [c]
    assert q.get_job(b).dead_reason == "start deadline passed"


def test_a_debounced_replace_keeps_the_children_waiting_and_takes_the_new_window(
    tq: tuple[Queue, Clock],
) -> None:
    """The replacement keeps the id (children still wait for it) and takes this call's options:
    a window the new call does not give is gone, the run time is the new one."""
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("d", 1, key="k", debounce=True, delay_ms=1_000, start_within_ms=500)
    kid = q.enqueue("kid", None, after=[a])
    clock.set_ms(T0 + 100)
    assert q.enqueue("d", 2, key="k", debounce=True, delay_ms=5_000) == a
    job = q.get_job(a)
    assert (job.start_by_ms, job.run_at_ms) == (None, T0 + 5_100)
    assert q.status(kid) == "held"
    clock.set_ms(T0 + 5_200)
    (got,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert (got.id, json.loads(got.payload_json)) == (a, 2)
    q.complete(a, got.token)
    assert q.status(kid) == "due"


def test_a_child_named_before_its_parent_in_one_call_is_refused_and_nothing_written(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    before = dump_queue(client, q)
    with pytest.raises(BadArgument, match="no such job"):
        q.enqueue_many([JobSpec("c", after=["pp"]), JobSpec("p", job_id="pp")])
    assert dump_queue(client, q) == before


def test_one_id_twice_in_one_call_keeps_the_first_as_two_calls_do(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    ids = q.enqueue_many(
        [JobSpec("t", {"n": 1}, job_id="same", priority=3),
         JobSpec("t", {"n": 2}, job_id="same", delay_ms=9_000)]
    )  # fmt: skip
    assert ids == ["same", "same"]
    job = q.get_job("same")
    assert _payload(q, "same") == {"n": 1} and job.fields.get("priority") == "3"
    assert job.run_at_ms == T0


def _partitions(client: redis.Redis, pq: PartitionedQueue) -> dict[str, object]:
    out: dict[str, object] = {}
    for p in pq.parts:
        out.update(dump_queue(client, p))
    return out


@pytest.mark.parametrize("bad", ["debounce twice", "payload"])
def test_a_partitioned_call_refused_in_one_partition_writes_in_none(
    client: redis.Redis, pq: PartitionedQueue, bad: str
) -> None:
    """'Every spec is checked before anything is sent': also when the bad spec goes to another
    partition than the good ones."""
    k = pq.layout.partition_of_key("dk")
    specs = [JobSpec("t", 1, job_id=f"p{(k + i) % pq.layout.n}.a{i}") for i in range(3)]
    if bad == "payload":
        specs.append(JobSpec("t", {1, 2}, key="dk"))
    else:
        specs += [
            JobSpec("t", 2, key="dk", debounce=True),
            JobSpec("t", 3, key="dk", debounce=True),
        ]
    before = _partitions(client, pq)
    with pytest.raises((BadArgument, InvalidPayload)):
        pq.enqueue_many(specs)
    assert _partitions(client, pq) == before


def test_a_debounced_job_not_durable_can_be_re_sent_with_its_id_as_the_docs_say(
    client: redis.Redis, tq: tuple[Queue, Clock]
) -> None:
    """NotDurable (and docs/durability.md): 're-send the same JobSpecs with these job_ids
    later: idempotent'. For a debounced spec that re-send was refused ('debounce takes no
    job_id', codec._flags) and no other was named; re-sent as it was (by its key alone) once a
    worker claimed the job, debounce makes a second job and the work runs twice. The docs now
    name the re-send that works: its key and id, without debounce."""
    q, clock = tq
    clock.set_ms(T0)
    dq = Queue(client, q.name, wait_replicas=1, wait_timeout_ms=10, _clock="test")
    spec = JobSpec("digest", {"n": 1}, key="d", debounce=True)
    with pytest.raises(NotDurable) as err:
        dq.enqueue_many([spec])
    (job_id,) = err.value.job_ids
    assert _claim_ids(q) == [job_id]
    # A debounced spec takes no job_id ('each call a re-send'): the documented re-send is its
    # key and id without debounce (NotDurable's docstring, docs/durability.md).
    with pytest.raises(BadArgument, match="debounce takes no job_id"):
        q.enqueue_many([replace(spec, job_id=job_id)])
    again = q.enqueue_many([replace(spec, job_id=job_id, debounce=False)])
    assert again == [job_id]
    assert q.counts().due == 0


def test_a_rate_held_job_past_its_start_window_leaves_the_room_to_the_next_one(
    tq: tuple[Queue, Clock],
) -> None:
    """rate_limit 1/10s and start_within_ms: a runs at T0; b (window 1 s) and c wait for the
    window. At T0+10 s the window has room for one: flow_rate_due (lib/flow.lua) sends b back
    and gives c the next slot, T0+20 s; the claim then parks b (start deadline passed), so
    nothing started and the window has room, yet c waits a whole window more (an hour at
    '1/1h'). The same happens to a job whose key is full, and flow-control.md says the room is
    left to a job that can start (key_full: tests/test_flow_rate_room.py)."""
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("r", None, rate_limit="1/10s", start_within_ms=1_000)
    b = q.enqueue("r", None, rate_limit="1/10s", start_within_ms=1_000)
    c = q.enqueue("r", None, rate_limit="1/10s")
    assert _claim_ids(q) == [a]
    assert q.status(b) == q.status(c) == "held"
    clock.set_ms(T0 + 10_001)
    first = _claim_ids(q)
    assert q.get_job(b).dead_reason == "start deadline passed"
    clock.set_ms(T0 + 10_002)
    assert first + _claim_ids(q) == [c]  # got []: c's slot is T0+20,001


def test_a_worker_runs_a_chain_with_shared_options_in_order_and_a_debounced_parent_once(
    redis_url: str, q: Queue
) -> None:
    """A real worker: chain() steps given priority, a key limit, a start window and attempts
    (step b fails once, retried) run a, b, b, c; a debounced digest replaced twice runs once
    with the latest payload, and its child after it."""
    from scheduler.client.chain import chain
    from scheduler.worker import WorkerSettings
    from tests.embedded_worker import run_until

    registry = Registry()
    ran: list[tuple[str, Any]] = []

    @registry.task(name="step", backoff=Backoff(base_ms=1, factor=1, cap_ms=1))
    def step(payload: Any, ctx: Any) -> None:
        ran.append(("step", payload["payload"]))
        if payload["payload"] == "b" and ctx.attempt == 1:
            raise RuntimeError("once")

    @registry.task(name="digest")
    def digest(payload: Any, ctx: Any) -> None:
        ran.append(("digest", payload))

    @registry.task(name="after_digest")
    def after_digest(payload: Any, ctx: Any) -> None:
        ran.append(("after_digest", payload))

    ids = chain(q, [("step", "a"), ("step", "b"), ("step", "c")], priority=5,
                concurrency_key="chain", concurrency_limit=1, start_within_ms=600_000,
                max_attempts=2)  # fmt: skip
    d = q.enqueue("digest", 1, key="dg", debounce=True, delay_ms=60_000)
    q.enqueue("after_digest", "x", after=[d])
    assert q.enqueue("digest", 2, key="dg", debounce=True, delay_ms=60_000) == d
    assert q.enqueue("digest", 3, key="dg", debounce=True) == d
    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=1_000)
    assert run_until(redis_url, registry, settings, lambda: len(ran) >= 6, timeout_s=30)
    steps = [p for t, p in ran if t == "step"]
    assert steps == ["a", "b", "b", "c"]
    assert [(t, p) for t, p in ran if t != "step"] == [("digest", 3), ("after_digest", "x")]
    assert all(q.status(i) == "done" for i in [*ids, d])
