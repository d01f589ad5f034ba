"""Review of key growth: memory must stay bounded by what users keep (pending jobs, outcome
records for their TTL, dead letters under their retention), never grow with time or with
traffic that has ended. Each test drives the public API on the test clock, then checks what is
left. Redis key TTLs run on real time: a test checks PTTL > 0 and bounded, never waits."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.operations.requests import Script
from tests.conftest import Clock, dump_queue

T0 = 1_000_000
LEASE = 1_000
DAY_MS = 86_400_000


def _now(q: Queue) -> int:
    return int(q.client.get(q.keys.test_clock) or 0)


def _make_suspects(q: Queue, clock: Clock, *job_ids: str) -> None:
    """Jobs leased to a worker that dies, twice: lapses 2, suspects (docs/durability.md)."""
    for jid in job_ids:
        q.enqueue("t", job_id=jid)
    for _ in range(2):
        now = _now(q)
        leased = q.claim("crashed", limit=len(job_ids), lease_ms=LEASE).jobs
        assert sorted(j.id for j in leased) == sorted(job_ids)
        clock.set_ms(now + LEASE + 1)
        q.claim("reaper", limit=0, lease_ms=LEASE)


def test_isolated_holds_only_workers_whose_suspect_is_still_leased(
    tq: tuple[Queue, Clock],
) -> None:
    # Worker ids are per process (host:pid:random): each one that took a suspect and then
    # finished it, or was killed by it, must not leave its entry behind. Before: every entry
    # stayed, and each later suspect refreshed the hash's one-day expiry, so it grew with
    # every worker process that ever held a suspect.
    q, clock = tq
    clock.set_ms(T0)
    for n in range(6):
        jid = f"p{n}"
        _make_suspects(q, clock, jid)
        batch = q.claim(f"w{n}", limit=1, lease_ms=LEASE)
        assert batch.suspect == jid
        if n % 2:
            q.complete(jid, batch.jobs[0].token, 1)
        else:  # killed by it: the lease lapses, the reaper puts it back; then withdrawn
            clock.set_ms(_now(q) + LEASE + 1)
            q.claim("reaper", limit=0, lease_ms=LEASE)
            assert q.cancel(jid) == "due"
    _make_suspects(q, clock, "last")
    assert q.claim("w-last", limit=1, lease_ms=LEASE).suspect == "last"
    assert q.client.hgetall(q.keys.isolated) == {"w-last": "last"}
    assert 0 < q.client.pttl(q.keys.isolated) <= DAY_MS


def test_isolated_keeps_a_live_suspect_of_another_worker(tq: tuple[Queue, Clock]) -> None:
    # The pruning must not free a worker that still holds its suspect (one per worker).
    q, clock = tq
    clock.set_ms(T0)
    _make_suspects(q, clock, "a", "b")
    assert q.claim("wa", limit=1, lease_ms=10 * LEASE).suspect == "a"
    assert q.claim("wb", limit=1, lease_ms=10 * LEASE).suspect == "b"
    assert q.client.hgetall(q.keys.isolated) == {"wa": "a", "wb": "b"}


def _retried(q: Queue, jid: str) -> None:
    (job,) = q.claim("w", limit=1, lease_ms=LEASE).jobs
    out = q.fail(jid, job.token, ("E", "m", ""), delay_ms=DAY_MS)
    assert out.status == "retry"


def test_cancel_takes_the_job_out_of_its_priority_index(tq: tuple[Queue, Clock]) -> None:
    # Claim drops a stale index entry only once its run_at has passed: a prioritized job
    # cancelled days ahead (a fresh one, or a retry backing off) stayed in flow:pdue:<p>,
    # with no expiry, long after its record expired.
    q, clock = tq
    clock.set_ms(T0)
    fresh = q.enqueue("t", job_id="fresh", priority=3, delay_ms=DAY_MS)
    retry = q.enqueue("t", job_id="retry", priority=3)
    _retried(q, retry)
    pdue = q.keys.prefix + "flow:pdue:3"
    assert q.client.zscore(pdue, fresh) is not None
    assert q.client.zscore(pdue, retry) is not None
    assert q.cancel(fresh) == "scheduled"
    assert q.cancel(retry) == "scheduled"
    assert q.client.zrange(pdue, 0, -1) == []


def test_jobs_claimed_by_the_aged_pass_leave_their_priority_index(
    tq: tuple[Queue, Clock],
) -> None:
    # A backlog older than the aging bound (60 s) fills every batch from the aged pass, and a
    # full batch never scans the level indexes, the one place that dropped a taken job's
    # entry: a queue always behind grew flow:pdue:<p> by every prioritized job it ran.
    q, clock = tq
    pdue = q.keys.prefix + "flow:pdue:2"
    for r in range(3):
        clock.set_ms(T0 + r * 200_000)
        for i in range(20):
            q.enqueue("t", job_id=f"j{r}-{i}", priority=2)
        clock.set_ms(T0 + r * 200_000 + 120_000)
        for _ in range(2):
            batch = q.claim("w", limit=10, lease_ms=LEASE)
            assert len(batch.jobs) == 10
            for j in batch.jobs:
                q.complete(j.id, j.token, 1)
        assert q.client.zcard(q.keys.due) == 0
        assert q.client.zcard(pdue) == 0


def _beat(q: Queue, worker: str, ttl_ms: int) -> None:
    q._execute(Script("worker_beat", [worker, str(ttl_ms), "beat", "h", "1", q.name, "0", "1"]))


def test_the_workers_registry_expires_after_its_last_beat(q: Queue) -> None:
    # A worker killed (SIGKILL) never removes its entry; another worker's beat prunes it after
    # 10 ttls, but after the last worker of a queue nothing did: the ZSET stayed for ever.
    _beat(q, "w1", 30_000)
    assert q.client.zscore(q.keys.workers, "w1") is not None
    assert 0 < q.client.pttl(q.keys.worker("w1")) <= 30_000
    assert 0 < q.client.pttl(q.keys.workers) <= 10 * 30_000


def drain(q: Queue, ok: bool = True) -> None:
    """Claim and settle every due job: completed (result 1), or failed for good."""
    for _ in range(50):
        batch = q.claim("w", limit=100, lease_ms=LEASE)
        if not batch.jobs:
            return
        for j in batch.jobs:
            if ok:
                q.complete(j.id, j.token, 1)
            else:
                q.fail(j.id, j.token, ("E", "m", ""), retryable=False)


def test_a_finished_workload_leaves_only_keys_that_expire(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    # Every flow feature, schedules, idempotency keys, cancels, parks and a purge: once all
    # is finished and the dead letters purged, nothing is kept without an expiry but the
    # wake-up list (at most 8 tokens).
    q, clock = tq
    clock.set_ms(T0)
    p = q.enqueue("t", job_id="P", concurrency_key="K", concurrency_limit=1, priority=2)
    q.enqueue("t", job_id="C1", after=[p], rate_key="R", rate_limit="1/1s")
    q.enqueue("t", job_id="C2", after=[p], priority=5)
    q.enqueue("t", job_id="C3", after=[p])
    assert q.cancel("C3") == "held"
    for i in range(5):
        q.enqueue("t", job_id=f"k{i}", concurrency_key="K", concurrency_limit=1, key=f"i{i}")
        q.enqueue("t", job_id=f"r{i}", rate_key="R", rate_limit="2/1s", priority=1)
    q.enqueue("t", job_id="far", priority=4, delay_ms=DAY_MS)
    assert q.cancel("far") == "scheduled"
    q.schedule("s1", "t", every_ms=1000, priority=3, concurrency_key="K", concurrency_limit=1)
    q.schedule("s2", "t", cron="* * * * *")
    for step in range(30):
        clock.set_ms(T0 + step * 1000)
        drain(q, ok=True)
    d = q.enqueue("t", job_id="D", priority=4)
    q.enqueue("t", job_id="DC", after=[d])
    clock.set_ms(T0 + 100_000)
    drain(q, ok=False)
    assert q.remove_schedule("s1") == "removed"
    assert q.remove_schedule("s2") == "removed"
    clock.set_ms(T0 + 200_000)
    drain(q, ok=True)
    dead = q.dead_ids()
    assert {"D", "DC"} <= set(dead)
    assert q.purge_dead(dead) == len(dead)
    kept = {k.removeprefix(q.keys.prefix) for k in dump_queue(client, q) if client.pttl(k) < 0}
    assert kept == {"wake"}
    assert client.llen(q.keys.wake) <= 8
