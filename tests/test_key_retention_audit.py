"""Redis memory over time: after a workload of the features test_review_key_growth.py does not
drive (result waits that time out, progress, heartbeats, releases, re-sent claims, reschedules,
debounce, start deadlines, lapsed leases, runs now of a schedule, cron schedules, requeued dead
letters, worker presence), every key left either expires within its documented retention or is
one a queue keeps by design (README "Key schema"). Redis expires keys on its own clock: the test
checks each PTTL is set and bounded, it never waits for one."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from scheduler import Queue, ResultTimeout
from scheduler.operations.requests import Script
from tests.conftest import Clock
from tests.test_review_key_growth import drain

T0 = 1_800_000_000_000
LEASE = 1_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000

# The longest expiry each kind of key may have here (the workload's options are the defaults:
# result_ttl_ms 1 h, key_ttl_ms 24 h past run_at, leases of 1 s, worker ttl 30 s).
BOUND_MS = {
    "job": HOUR_MS,
    "spec": HOUR_MS,
    "finished": HOUR_MS,
    "result": HOUR_MS,
    "result_wait": 60_000,
    "idem": DAY_MS + 60_000,
    "claim": LEASE,
    "stats": 2 * HOUR_MS,
    "schedule_ran": 31 * DAY_MS,
    "worker": 30_000,
    "workers": 10 * 30_000,
    "flow:rate": 2_000,
}
# Kept without an expiry by design: the queue's own sets and lists, its settings.
KEPT = {"wake", "dead", "config"}


def _kind(rest: str) -> str:
    for kind in sorted(BOUND_MS, key=len, reverse=True):
        if rest == kind or rest.startswith(kind + ":"):
            return kind
    return rest


def test_every_key_left_after_a_workload_expires_or_is_kept_by_design(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    # A waiter there when its job ends: the wake-up list result:<id> is written.
    q.enqueue("t", job_id="waited")
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(q.result("waited", timeout_s=30)))
    waiter.start()
    deadline = time.monotonic() + 30
    while not client.exists(q.keys.result_wait("waited")) and time.monotonic() < deadline:
        time.sleep(0.005)
    drain(q)
    waiter.join(30)
    assert got == [1]
    assert 0 < client.pttl(q.keys.result_wake("waited")) <= HOUR_MS
    for i in range(20):
        q.enqueue(
            "t", {"i": i}, job_id=f"a{i}", key=f"once{i}", concurrency_key=f"c{i % 10}",
            concurrency_limit=1, rate_key=f"r{i % 10}", rate_limit="1/1s",
        )  # fmt: skip
        q.enqueue("t", key=f"deb{i % 5}", debounce=True, delay_ms=100)
    for i in range(5):
        with pytest.raises(ResultTimeout):
            q.result(f"a{i}", timeout_s=0.01)
    batch = q.claim("w2", limit=10, lease_ms=LEASE, nonce="resent")
    assert q.claim("w2", limit=10, lease_ms=LEASE, nonce="resent").jobs  # a replay
    for j in batch.jobs:
        q.set_progress(j.id, j.token, {"pct": 50})
    q.heartbeat([(j.id, j.token) for j in batch.jobs], lease_ms=LEASE)
    q.release([(j.id, j.token) for j in batch.jobs])
    q.enqueue("t", job_id="later", delay_ms=HOUR_MS)
    assert q.reschedule("later", delay_ms=0) == "rescheduled"
    q.enqueue("t", job_id="deadline", start_within_ms=10, delay_ms=0)
    q.enqueue("t", job_id="lapse", max_attempts=1)
    q.schedule("every", "t", every_ms=1_000, priority=3)
    q.schedule("cron", "t", cron="*/5 * * * * *", tz="Europe/Paris")
    q.run_schedule_now("every")
    q._execute(Script("worker_beat", ["wk", "30000", "beat", "h", "1", q.name, "0", "1"]))
    clock.set_ms(T0 + 100)
    lapse = q.claim("dying", limit=100, lease_ms=LEASE)
    assert "lapse" in [j.id for j in lapse.jobs]
    for j in lapse.jobs:
        if j.id != "lapse":
            q.complete(j.id, j.token, None)
    for step in range(1, 20):
        clock.set_ms(T0 + step * 1_000)
        drain(q)
    q.enqueue("t", job_id="bad", max_attempts=1)
    drain(q, ok=False)
    assert {"deadline", "lapse", "bad"} <= set(q.dead_ids())
    assert q.requeue_dead(["bad"]) == 1
    assert q.remove_schedule("every") == "removed"
    assert q.remove_schedule("cron") == "removed"
    clock.set_ms(T0 + 60_000)
    drain(q)
    dead = set(q.dead_ids())
    assert dead == {"deadline", "lapse"}

    left: list[tuple[str, int]] = []
    for key in client.scan_iter(match=q.keys.pattern(), count=1000):
        rest = key.removeprefix(q.keys.prefix)
        if rest == "test:now_ms":
            continue
        ttl = client.pttl(key)
        if ttl == -1:
            parts = rest.split(":", 1)
            if rest in KEPT or (parts[0] in ("job", "spec") and parts[1] in dead):
                continue
            left.append((rest, ttl))
        elif ttl > BOUND_MS.get(_kind(rest), 0):
            left.append((rest, ttl))
    assert left == [], "keys without an expiry, or kept longer than their retention"
