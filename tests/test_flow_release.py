"""release (lua/release.lua: a worker's graceful stop gives back the jobs it claimed and had not
started, and the runs its grace cut short) and flow control, as docs/flow-control.md says: the
key's slot is free at once, its held job runs; the claim's rate start stays in its window (a
run cut short may have reached the limited service), so the released job waits for the
window's next room."""

from __future__ import annotations

from scheduler import Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock


def claim_ids(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=10, lease_ms=60_000).jobs]


def test_a_release_frees_the_keys_slot_at_once(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    a = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    (lease,) = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert lease.id == a and q.get_job(b).fields["flow_reason"] == "limited by key k (1 leased)"
    clock.set_ms(T0 + 5)
    assert q.release([(a, lease.token)]) == ["released"]
    assert claim_ids(q) == [b]  # the held job, older than a's release, takes the slot


def test_a_released_job_keeps_its_rate_start(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    a = q.enqueue("t", rate_limit="1/1h", rate_key="r")
    (lease,) = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert q.release([(a, lease.token)]) == ["released"]
    clock.set_ms(T0 + 10)
    assert claim_ids(q) == []
    reason = q.get_job(a).fields["flow_reason"]
    assert reason == f"rate window r (1 per 3600000 ms) until {T0 + 3_600_000}"
    assert q.get_job(a).attempts == 0  # the released claim's attempt was given back
    clock.set_ms(T0 + 3_600_000)
    assert claim_ids(q) == [a]
