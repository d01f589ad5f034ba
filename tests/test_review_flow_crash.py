"""Review of flow control on the failure paths: crashed workers (lapsed leases, the reaper in
lua/claim.lua), the suspect rule (docs/durability.md) with concurrency keys, rate windows and
priorities, cancel and the dead letters. Each test runs the real scripts on the test clock."""

from __future__ import annotations

import pytest

from scheduler import Queue
from tests.conftest import Clock

T0 = 1_000_000
LEASE = 1_000


def _now(q: Queue) -> int:
    return int(q.client.get(q.keys.test_clock) or 0)


def _lapse_twice(q: Queue, clock: Clock) -> None:
    """Lease every due job to a worker that dies, twice: each job is a suspect (lapses 2)."""
    for _ in range(2):
        now = _now(q)
        assert q.claim("crashed", limit=100, lease_ms=LEASE).jobs
        clock.set_ms(now + LEASE + 1)
        q.claim("reaper", limit=0, lease_ms=LEASE)


def test_a_suspect_set_aside_by_its_key_does_not_take_the_workers_one_suspect(
    tq: tuple[Queue, Clock],
) -> None:
    # Two suspects: `a` of a key that is full, `b` plain. The worker holds no suspect, so it
    # may take `b`; `a`, set aside by its key, is not leased and must not count as its one.
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("t", job_id="s-a", concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", job_id="s-b")
    _lapse_twice(q, clock)
    assert [q.client.hget(q.keys.job(i), "lapses") for i in (a, b)] == ["2", "2"]
    # Another job of the key takes its one slot (priority 9: claimed ahead of the suspects).
    c = q.enqueue("t", concurrency_key="k", concurrency_limit=1, priority=9)
    assert [j.id for j in q.claim("x", limit=1, lease_ms=10 * LEASE).jobs] == [c]
    batch = q.claim("w", limit=100, lease_ms=LEASE)
    assert q.client.zscore(q.keys.prefix + "flow:ckheld:k", a) is not None  # set aside
    assert [j.id for j in batch.jobs] == [b]
    assert batch.suspect == b


def test_a_suspect_set_aside_by_its_rate_window_does_not_take_the_workers_one_suspect(
    tq: tuple[Queue, Clock],
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("t", job_id="s-a", rate_limit="2/1h", rate_key="r")
    b = q.enqueue("t", job_id="s-b")
    _lapse_twice(q, clock)  # the window's two starts: `a`'s crashed claims
    assert [q.client.hget(q.keys.job(i), "lapses") for i in (a, b)] == ["2", "2"]
    batch = q.claim("w", limit=100, lease_ms=LEASE)
    assert q.client.zscore(q.keys.prefix + "flow:rheld", a) is not None  # set aside
    assert [j.id for j in batch.jobs] == [b]
    assert batch.suspect == b


@pytest.mark.parametrize("end", ["complete", "cancel", "lapse"])
def test_a_limit_edited_by_hand_on_a_leased_job_does_not_strand_its_keys_held_jobs(
    tq: tuple[Queue, Clock], end: str
) -> None:
    # The key's one lease ends after its `climit` was edited by hand: the key must still let
    # its held job go, or nothing would ever bring it back (no lease of the key is left).
    q, clock = tq
    clock.set_ms(T0)
    a = q.enqueue("t", job_id="A", concurrency_key="K", concurrency_limit=1)
    b = q.enqueue("t", job_id="B", concurrency_key="K", concurrency_limit=1)
    (lease,) = q.claim("w", limit=100, lease_ms=LEASE).jobs
    assert lease.id == a
    assert q.get_job(b).fields["flow_reason"] == "limited by key K (1 leased)"
    q.client.hset(q.keys.job(a), "climit", "many")
    if end == "complete":
        q.complete(a, lease.token, 1)
    elif end == "cancel":
        assert q.cancel(a) == "leased"
    clock.set_ms(T0 + 10 * LEASE)  # a lapsed lease is reaped by this claim
    got = [j.id for j in q.claim("w", limit=100, lease_ms=LEASE).jobs]
    assert b in got and q.get_job(b).state == "leased"
