"""Dependencies and cancellation, from an audit (docs/flow-control.md 'Dependencies'): what
happens to a job others wait for (after=[it]) when something else than its own end touches it,
against the real scripts."""

from __future__ import annotations

import json

from scheduler import Queue


def _claim(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=100, lease_ms=10_000).jobs]


def test_a_debounced_job_other_jobs_wait_for_is_still_replaced(q: Queue) -> None:
    """A child enqueued after=[the debounced job] marks that job's hash (`kids`): the next
    debounced call took the mark for a claim and wrote a second job, so the digest ran twice,
    once with the stale data, against 'while the job the key names has not been claimed, the
    call replaces it' (README)."""
    first = q.enqueue("d", {"n": 1}, key="d", debounce=True, delay_ms=0)
    child = q.enqueue("c", after=[first])
    assert q.enqueue("d", {"n": 2}, key="d", debounce=True, delay_ms=0) == first
    leases = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [(j.id, j.payload()) for j in leases] == [(first, {"n": 2})]
    assert q.get_job(child).fields["flow_reason"] == "waiting for 1 jobs"
    q.complete(first, leases[0].token, None)
    assert _claim(q) == [child]
    assert json.loads(q.get_job(first).payload_json or "null") in ({"n": 2}, None)
