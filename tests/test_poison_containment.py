"""Contained failure: a job that kills its worker process (SIGKILL, OOM, segfault) must not take
its innocent batch-mates down with it. Each lapse is counted on the job (`lapses`, claim.lua's
reaper); a job with two or more is a suspect, and a worker holds at most one suspect lease at a
time (`<prefix>isolated`), so the poison job ends up running alone (docs/durability.md)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler.core import claim_reply
from scheduler.core.connection import connect_async
from scheduler.core.keys import QueueKeys
from scheduler.core.models import ClaimedJob
from scheduler.operations.ops import Commands, Ops, Settings
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import Clock
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess
from tests.test_worker_retry_wake import no_safety_nets
from tests.workers.procs import spawn_worker, stop_all, wait_for

POISON_REGISTRY = "tests.workers.poison:registry"


# -- real worker processes ------------------------------------------------------------------


def test_poison_job_does_not_kill_its_batch_mates(redis_url: str, q: Queue) -> None:
    innocents = [q.enqueue("innocent", {"i": i}) for i in range(6)]
    poison = q.enqueue("poison", {})
    args = ("--lease-ms", "1000", "--heartbeat-ms", "250", "--concurrency", "8",
            "--log-level", "WARNING")  # fmt: skip

    def state(job_id: str) -> str:
        return q.get_job(job_id).state

    def settled() -> bool:
        return state(poison) == "dead" and all(state(i) in ("done", "dead") for i in innocents)

    def ended(p: subprocess.Popen[bytes]) -> bool:
        return p.poll() is not None or settled()

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(10):
            p = spawn_worker(redis_url, q.name, *args, registry=POISON_REGISTRY)
            procs.append(p)
            wait_for(partial(ended, p), timeout_s=40,
                     what="the worker to crash or every job to settle")  # fmt: skip
            if settled():
                break
    finally:
        stop_all(procs)
    states = {i: state(i) for i in innocents}
    assert state(poison) == "dead", f"poison job not dead after {len(procs)} workers"
    assert all(s == "done" for s in states.values()), f"innocent jobs not done: {states}"


# -- the claim script, on a clock the test sets ----------------------------------------------

T0 = 1_000_000
LEASE = 1_000


def _lapse(q: Queue, clock: Clock, worker: str = "crashed") -> list[str]:
    """Lease every due job to `worker`, then let the lease lapse and reap it (limit 0)."""
    now = int(q.client.get(q.keys.test_clock) or 0)
    got = [j.id for j in q.claim(worker, limit=100, lease_ms=LEASE).jobs]
    clock.set_ms(now + LEASE + 1)
    q.claim("reaper", limit=0, lease_ms=LEASE)
    return got


def _suspects(q: Queue, clock: Clock, n: int) -> list[str]:
    clock.set_ms(T0)
    ids = [q.enqueue("t") for _ in range(n)]
    _lapse(q, clock)
    _lapse(q, clock)
    assert [q.client.hget(q.keys.job(i), "lapses") for i in ids] == ["2"] * n
    return ids


def _claim(q: Queue, worker: str) -> list[str]:
    return [j.id for j in q.claim(worker, limit=100, lease_ms=LEASE).jobs]


def test_the_reaper_counts_each_lapse(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    a, b = q.enqueue("t"), q.enqueue("t")
    assert sorted(_lapse(q, clock)) == sorted([a, b])
    assert q.client.hget(q.keys.job(a), "lapses") == "1"
    assert sorted(_lapse(q, clock)) == sorted([a, b])  # one lapse: not a suspect yet
    assert q.client.hget(q.keys.job(b), "lapses") == "2"
    # A completed lease is no lapse.
    (j,) = [j for j in q.claim("w", limit=1, lease_ms=LEASE).jobs]
    q.complete(j.id, j.token, 1)
    assert q.client.hget(q.keys.job(j.id), "lapses") == "2"


def test_a_worker_holds_one_suspect_and_others_take_the_rest(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    ids = _suspects(q, clock, 3)
    plain = q.enqueue("t")  # behind the suspects in due: still found
    q.client.delete(q.keys.wake)
    batch = q.claim("w1", limit=100, lease_ms=LEASE)
    got = [j.id for j in batch.jobs]
    assert len(got) == 2 and plain in got
    (first,) = set(got) & set(ids)
    assert batch.suspect == first  # the worker claims again when it ends
    assert q.client.llen(q.keys.wake) == 1  # suspects left: another idle worker may take one
    assert q.client.hget(q.keys.prefix + "isolated", "w1") == first
    assert q.client.pttl(q.keys.prefix + "isolated") > 0
    # Nothing else w1 may take: it is told to come back at its lease end, not now (no spin),
    # and wakes no one (workers holding a suspect each must not wake each other in turn).
    q.client.delete(q.keys.wake)
    again = q.claim("w1", limit=100, lease_ms=LEASE)
    assert again.jobs == [] and again.next_ms == batch.now_ms + LEASE > again.now_ms
    assert again.suspect is None and q.client.llen(q.keys.wake) == 0
    assert q.client.zcard(q.keys.due) == 2
    # Another worker takes one more, a third the last.
    (second,) = _claim(q, "w2")
    (third,) = _claim(q, "w3")
    assert {first, second, third} == set(ids)


def test_a_finished_or_lapsed_suspect_frees_its_worker(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    ids = _suspects(q, clock, 3)
    jobs = q.claim("w1", limit=100, lease_ms=LEASE).jobs
    assert len(jobs) == 1 and _claim(q, "w1") == []
    q.complete(jobs[0].id, jobs[0].token, 1)  # the recorded entry is stale now
    (second,) = _claim(q, "w1")
    assert second != jobs[0].id
    # Its lease lapses (the reaper puts it back, lapses 3): w1 is free again.
    clock.set_ms(T0 + 3 * (LEASE + 1))
    got = _claim(q, "w1")
    assert len(got) == 1 and got[0] in set(ids) - {jobs[0].id}
    assert q.client.hget(q.keys.job(second), "lapses") == "3"
    # A stale entry naming a job now leased to another worker does not count either.
    q.client.hset(q.keys.prefix + "isolated", "w9", got[0])
    assert len(_claim(q, "w9")) == 1


def test_a_garbage_lapses_field_reads_as_zero(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    clock.set_ms(T0)
    a, b = q.enqueue("t"), q.enqueue("t")
    q.claim("w", limit=100, lease_ms=LEASE)
    q.client.hset(q.keys.job(a), "lapses", "garbage")
    q.client.hset(q.keys.job(b), "lapses", "1e400")
    clock.set_ms(T0 + LEASE + 1)
    assert sorted(_claim(q, "w2")) == sorted([a, b])  # reaped (no error), neither parked
    assert q.client.hget(q.keys.job(a), "lapses") == "1"
    for v in ("x", "-3", "99999999999999999999999"):
        q.client.hset(q.keys.job(a), "lapses", v)
        clock.set_ms(int(q.client.get(q.keys.test_clock) or 0) + LEASE + 1)
        q.client.zrem(q.keys.leased, b)  # b out of the way: only a's lapse matters
        got = _claim(q, "w3")
        assert a in got and q.get_job(a).state == "leased"
    assert q.client.zcard(q.keys.dead) == 0


def test_an_isolated_key_of_another_type_does_not_break_claims(tq: tuple[Queue, Clock]) -> None:
    q, clock = tq
    ids = _suspects(q, clock, 2)
    q.client.set(q.keys.prefix + "isolated", "not a hash")
    got = _claim(q, "w1")
    assert len(got) == 1 and got[0] in ids  # still one suspect per call
    assert q.client.get(q.keys.prefix + "isolated") == "not a hash"  # left as it is
    assert len(_claim(q, "w1")) == 1  # the rule is lost while the key is broken, nothing else


def test_a_skipped_suspect_with_a_priority_leaves_its_index_and_stays_claimable(
    tq: tuple[Queue, Clock],
) -> None:
    # Out of its level's index (each claim's level pass would spend its budget on it again,
    # tests/test_suspect_starvation.py), still due: another worker takes it.
    q, clock = tq
    clock.set_ms(T0)
    ids = [q.enqueue("t", priority=5) for _ in range(2)]
    _lapse(q, clock)
    _lapse(q, clock)
    (got,) = _claim(q, "w1")
    (other,) = set(ids) - {got}
    assert q.client.zscore(q.keys.prefix + "flow:pdue:5", other) is None
    assert q.client.zscore(q.keys.due, other) is not None
    assert _claim(q, "w2") == [other]


# -- the worker: the next suspect when its own ends ----------------------------------------------

registry = Registry()


class Gate:
    release: asyncio.Event  # made in the test's event loop


@registry.task(name="pc-gated")
async def gated(payload: object, ctx: JobContext) -> str:
    await Gate.release.wait()
    return "ok"


@pytest.mark.parametrize("report_delay_s", [0.0, 0.3])
def test_a_worker_claims_the_next_suspect_when_its_own_ends(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, report_delay_s: float
) -> None:
    """The suspects a worker skips send it no wake-up, and its claim answers next_ms past them
    (its own suspect's lease end, an hour here, with the idle safety net an hour too): only the
    end of its suspect (ClaimBatch.suspect) makes it claim the next one. Second case, the
    outcome lands 0.3 s after the handler ended (a loaded machine; CI failed on it): a claim
    sent at the handler's end still found the suspect leased and slept for the hour."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"pc-next-{uuid.uuid4().hex[:8]}", _clock="test")
    clock = Clock(admin, q)
    clock.set_ms(T0)
    ids = [q.enqueue("pc-gated") for _ in range(2)]
    _lapse(q, clock)
    _lapse(q, clock)

    async def main() -> None:
        Gate.release = asyncio.Event()
        client = connect_async(module_server.url)
        settings = WorkerSettings(queues=(q.name,), concurrency=4, grace_s=0, lease_ms=3_600_000)
        w = Worker(client, registry, settings, _clock="test")
        real_send = w._send_reports

        async def late_send() -> None:
            await asyncio.sleep(report_delay_s)
            await real_send()

        monkeypatch.setattr(w, "_send_reports", late_send)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: sum(q.status(i) == "leased" for i in ids) == 1, "one suspect")
            await poll(w._idle.is_set, "the claim loop to wait")
            Gate.release.set()  # the first ends; the second must follow without a wake-up
            await poll(lambda: all(q.status(i) == "done" for i in ids), "both", timeout_s=10.0)
        finally:
            Gate.release.set()
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())


def test_the_refill_flag_is_read_past_unreadable_jobs_and_keeps_them() -> None:
    """The trailing values of claim's reply follow every job it leased, read or not: the
    schedules' refill flag was looked up after the readable jobs only, so a batch holding an
    unreadable one read a job field as the flag (a ValueError: the leased batch was lost to
    the caller); and a refill rebuilt the batch without its unreadable jobs and suspect."""
    ops = Ops(QueueKeys("pc-refill"), Settings())
    bad_job = ["job-1", "no token", "1", "5", "t", "{}", "1000", "", "0", "", ""]  # bad token
    op = ops.claim("w", limit=1, lease_ms=1000)
    next(op)  # the claim script
    with pytest.raises(StopIteration) as done:
        op.send(["1000", "-1", 1, *bad_job, 0, "job-1"])  # refill flag 0, then the suspect
    batch = done.value.value
    assert [u[0] for u in batch.unreadable] == ["job-1"] and batch.suspect == "job-1"
    # With a refill asked for: the rebuilt batch keeps both.
    op = ops.claim("w", limit=1, lease_ms=1000)
    next(op)
    assert isinstance(op.send(["1000", "-1", 1, *bad_job, 1, "job-1"]), Commands)  # refill
    with pytest.raises(StopIteration) as done:
        op.send([[]])  # no schedule to refill after all
    batch = done.value.value
    assert [u[0] for u in batch.unreadable] == ["job-1"] and batch.suspect == "job-1"


def test_suspects_beyond_the_scan_budget_do_not_make_a_worker_claim_in_a_loop(
    tq: tuple[Queue, Clock],
) -> None:
    """More suspects than one claim may look at (limit + FLOW_HOLD_BUDGET, 200): a worker
    holding one takes nothing; it comes back at once only while its scans still move suspects
    due before it took its own (jobs behind them may be plain), then at its lease end, not
    "due now" for ever (it claimed again every millisecond, each call reading ~200 job
    hashes)."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue_many([JobSpec("t") for _ in range(1_100)])
    for _ in range(2):
        now = int(q.client.get(q.keys.test_clock) or 0)
        assert len(q.claim("crashed", limit=1_000, lease_ms=LEASE).jobs) == 1_000
        assert len(q.claim("crashed", limit=1_000, lease_ms=LEASE).jobs) == 100
        clock.set_ms(now + LEASE + 1)
        while q.client.zcard(q.keys.leased):  # a claim reaps 500 at most
            q.claim("reaper", limit=0, lease_ms=LEASE, reap_limit=10_000)
    first = q.claim("w1", limit=1, lease_ms=LEASE)
    assert len(first.jobs) == 1 and first.suspect == first.jobs[0].id
    calls = 0
    while True:  # the clock stands still: only the scans' moves can end this
        calls += 1
        again = q.claim("w1", limit=1, lease_ms=LEASE)
        assert again.jobs == []
        if again.next_ms > again.now_ms:
            break
        assert calls < 7, "a worker holding a suspect claims in a loop"
    assert calls == 6  # 1,099 suspects ahead: five budgets' scans (201 each), then the 94 left
    assert again.next_ms == first.now_ms + LEASE
    assert q.claim("w1", limit=1, lease_ms=LEASE).next_ms == first.now_ms + LEASE


def test_a_requeued_dead_suspect_starts_afresh(tq: tuple[Queue, Clock]) -> None:
    # A suspect parked after its last attempt, requeued once its handler is fixed, is no
    # suspect any more: its worker may take other jobs' leases alongside it.
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("t", max_attempts=3)
    _lapse(q, clock)
    _lapse(q, clock)
    (j,) = q.claim("w", limit=1, lease_ms=LEASE).jobs
    assert q.fail(j.id, j.token, ("E", "boom", "")).status == "dead"
    assert q.client.hget(q.keys.job(a), "lapses") == "2"
    assert q.requeue_dead([a]) == 1
    assert q.client.hget(q.keys.job(a), "lapses") is None
    b, c = q.enqueue("t"), q.enqueue("t")
    q.client.hset(q.keys.job(b), "lapses", "2")  # a suspect beside it
    batch = q.claim("w1", limit=100, lease_ms=LEASE)
    assert sorted(j.id for j in batch.jobs) == sorted([a, b, c])
    assert batch.suspect == b


def test_an_unreadable_suspect_frees_its_worker_once_failed(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspect the worker cannot read is failed (parked) at once, never started: that end
    must free the worker for the next suspect as a handler's end does (it claimed no more:
    the suspect it skipped sends no wake-up, and its next_ms was its lease end, an hour)."""
    no_safety_nets(monkeypatch)
    admin = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    q = Queue(admin, f"pc-bad-{uuid.uuid4().hex[:8]}", _clock="test")
    clock = Clock(admin, q)
    clock.set_ms(T0)
    bad = q.enqueue("pc-gated", job_id="a-bad")
    good = q.enqueue("pc-gated", job_id="b-good")
    _lapse(q, clock)
    _lapse(q, clock)
    # One field this client cannot read that claim.lua let through (another server version):
    real = claim_reply._claimed_job

    def unreadable(raw: Sequence[Any], now_ms: int) -> ClaimedJob:
        if raw[0] == bad:
            raise claim_reply._Unreadable("task")
        return real(raw, now_ms)

    monkeypatch.setattr(claim_reply, "_claimed_job", unreadable)
    admin.zadd(q.keys.due, {bad: T0 - 1})  # claimed first

    async def main() -> None:
        Gate.release = asyncio.Event()
        Gate.release.set()
        client = connect_async(module_server.url)
        settings = WorkerSettings(queues=(q.name,), concurrency=4, grace_s=0, lease_ms=3_600_000)
        w = Worker(client, registry, settings, _clock="test")
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: q.status(bad) == "dead", "the unreadable suspect parked")
            await poll(lambda: q.status(good) == "done", "the next suspect", timeout_s=10.0)
            assert admin.hget(q.keys.job(bad), "dead_reason") == "non-retryable error"
            # The unreadable one's entry is not kept for ever; the good one's goes when the
            # worker reads its complete's answer, just after the server wrote it.
            await poll(lambda: not w._suspects, "no suspect entry left", timeout_s=5.0)
        finally:
            w.request_stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()

    asyncio.run(main())
