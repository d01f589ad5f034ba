"""Review of the session aaf3197..HEAD (keys edited by hand into another type: CorruptKey).

Each test below failed at d072852 and names the defect it showed (file:line there)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio as aredis

from scheduler import CorruptKey, Queue
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.execution import classify
from tests import test_worker_hardening
from tests.conftest import Clock
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess
from tests.test_worker_hardening import capture
from tests.workers import hardening

admin = test_worker_hardening.admin  # its fixture (a private server's admin client), shared

T0 = 10_000_000_000
HOUR_MS = 3_600_000


def _spoil(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.set(key, "hand-edited")


def _complete_around_a_spoiled_due(client: redis.Redis, q: Queue, job_id: str, token: str) -> None:
    """complete while due is of another type, then the operator fixes due (DEL). A refusal
    (CorruptKey, nothing written) is fine: the worker re-sends the complete after the fix."""
    _spoil(client, q.keys.due)
    try:
        q.complete(job_id, token, 1)
        refused = False
    except CorruptKey:
        refused = True
    client.delete(q.keys.due)  # the fix
    if refused:
        q.complete(job_id, token, 1)


def test_a_child_whose_parent_completes_while_due_is_spoiled_never_runs(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """lib/flow.lua flow_parent_done (lines 616-628): when flow_unhold returns false (due of
    another type) the child keeps `waiting_for` = 1 and its place in flow:waiting/flow:held,
    but the parent's flow:children set is DELeted anyway (line 627) and the parent is marked
    done. No parent is left to count the child down, doctor --fix never takes a waiting child
    out of its hold, so once due is fixed the child waits forever. complete.lua does not check
    due before its first write (it is the one script reaching flow_unhold that does not), so
    this is reached without any error. Before the session the child was left in no set, which
    doctor could put back; now it is unreachable."""
    q, clock = tq
    clock.set_ms(T0)
    parent = q.enqueue("t")
    child = q.enqueue("t", after=[parent])
    (job,) = q.claim("w", limit=10, lease_ms=HOUR_MS).jobs
    assert job.id == parent
    clock.set_ms(T0 + 1)
    _complete_around_a_spoiled_due(client, q, parent, job.token)
    clock.set_ms(T0 + 2)
    got = [j.id for j in q.claim("w", limit=10, lease_ms=HOUR_MS).jobs]
    assert got == [child], (
        f"parent {q.status(parent)}, child stuck: {client.hgetall(q.keys.job(child))}"
    )


def test_a_key_held_job_is_stranded_when_the_slot_frees_while_due_is_spoiled(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """lib/flow.lua flow_ck_promote (line 192): flow_unhold returns false (due of another
    type) and the held job stays in flow:ckheld:<key>, 'to be promoted later'; but the only
    later promotion is the next release of one of the key's leases, and the job that just
    completed was the key's last lease (complete.lua checks no due before its first write).
    Once due is fixed the key has no lease and a free slot, yet its held job is never claimed
    (until some other job of the key happens to be enqueued and finish); doctor does not look
    at flow:ckheld."""
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    (job,) = q.claim("w", limit=10, lease_ms=HOUR_MS).jobs
    assert job.id == a
    assert client.zscore(q.keys.flow_held, b) is not None
    clock.set_ms(T0 + 1)
    _complete_around_a_spoiled_due(client, q, a, job.token)
    clock.set_ms(T0 + 2)
    got = [j.id for j in q.claim("w", limit=10, lease_ms=HOUR_MS).jobs]
    assert got == [b], f"key k is free, b stuck: {client.hgetall(q.keys.job(b))}"


@pytest.mark.parametrize("key", ["due", "leased"])
def test_claim_with_due_or_leased_spoiled_is_not_a_passing_error(
    tq: tuple[Queue, Clock], client: redis.Redis, key: str
) -> None:
    """claim.lua:195 checks due only when a lease lapsed (and leased not at all): with no lapsed
    lease, flow_fill's ZRANGE of due (lib/flow.lua:456), or the reaper's ZRANGE of leased
    (claim.lua:190), raises a bare WRONGTYPE, not CorruptKey. worker/execution.py classify
    calls that 'refused', and a refused claim is fatal in the claim loop (core.py _loop_error):
    the worker stops with EXIT_REDIS_REFUSED and every other queue it serves stops too, which
    commit fb18555 says a hand-edited key no longer does (it holds for dead only)."""
    q, clock = tq
    clock.set_ms(T0)
    q.enqueue("t")
    _spoil(client, q.keys.prefix + key)
    with pytest.raises(redis.ResponseError) as exc:
        q.claim("w", limit=10, lease_ms=HOUR_MS)
    assert classify(exc.value) == "transient", f"{type(exc.value).__name__}: {exc.value}"


def test_a_fail_refused_with_corrupt_key_is_dropped_not_retried(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    """worker/reporting.py _failed (lines 163-172) never retries a fail reply that is a
    SchedulerError ('an answer read as an error'), and CorruptKey is now one
    (core/errors.py:98): so classify's new 'transient' for CorruptKey (execution.py:86) never
    applies to a fail. A handler's failure reported while dead (or due) is of another type is
    refused with nothing written, then dropped: the worker forgets the lease, the handler's
    error is lost and the job sits leased until its lease lapses (here an hour), then is reaped
    as 'lease expired' (or run again), instead of being re-sent after the fix as fb18555
    promises ('back off, retry ... the queue drains once the key is fixed')."""
    q = Queue(admin, "sr-" + uuid.uuid4().hex[:8])
    jid = q.enqueue("gate_fail", max_attempts=1)  # its failure parks it (writes dead)
    log, records = capture()

    async def main() -> None:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(q.name,), lease_ms=HOUR_MS, heartbeat_ms=100, grace_s=1),
            logger=log)  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: q.status(jid) == "leased", what="the job running")
            _spoil(admin, q.keys.dead)
            admin.set(hardening.gate_key(jid), "1")  # the handler raises now
            refused = w.metrics.redis_backoffs.labels("report", "CorruptKey")
            await poll(
                lambda: refused._value.get() >= 1 or any(jid in m for m in records if "fail" in m),
                what="the fail answered",
            )
            admin.delete(q.keys.dead)  # the fix
            await poll(lambda: q.status(jid) == "dead", timeout_s=10, what="the fail re-sent")
            assert admin.hget(q.keys.job(jid), "dead_reason") == "attempts exhausted"
        finally:
            w.request_stop()
            await task
            await client.aclose()

    asyncio.run(main())
