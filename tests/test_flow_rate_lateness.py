"""Rate-held jobs come back when their window has room for them, not a window later. A claim
that let some of a key's held jobs back gave the key's other held jobs the slot `now + window`
(the room was just taken), though the window's older starts leave it sooner: at 2/500ms with
starts at 0 and 250 ms, a held job could start at 750 but waited until 1000, and the backlog
ran in bursts of two, a window late. Server time is the test clock (fq), so each slot is exact;
the claims poll every 50 ms as an idle worker would at its next_ms."""

from __future__ import annotations

from typing import Any

from scheduler import Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock

RATE: dict[str, Any] = {"rate_limit": "2/500ms", "rate_key": "api"}


def test_a_held_job_starts_when_the_window_has_room_for_it(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    q.enqueue("t", **RATE)
    starts: list[int] = []
    for step in range(0, 2001, 50):
        clock.set_ms(T0 + step)
        if step == 250:  # a backlog arrives between the window's starts
            for _ in range(10):
                q.enqueue("t", **RATE)
        batch = q.claim("w", limit=10, lease_ms=60_000)
        for job in batch.jobs:
            starts.append(step)
            q.complete(job.id, job.token, 1)
    # Never more than 2 in any 500 ms, and each as soon as the window allows it.
    assert all(b - a >= 500 for a, b in zip(starts, starts[2:], strict=False))
    assert starts == [0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000]


def test_next_ms_is_the_slot_where_the_window_has_room(fq: tuple[Queue, Clock]) -> None:
    # An idle worker sleeps until next_ms: it must name the earlier slot, not a window on.
    q, clock = fq
    q.enqueue("t", **RATE)
    assert len(q.claim("w", limit=10, lease_ms=60_000).jobs) == 1
    clock.set_ms(T0 + 250)
    for _ in range(3):
        q.enqueue("t", **RATE)
    assert len(q.claim("w", limit=10, lease_ms=60_000).jobs) == 1  # the window's second
    clock.set_ms(T0 + 500)
    batch = q.claim("w", limit=10, lease_ms=60_000)
    assert len(batch.jobs) == 1  # the start at T0 left the window
    assert batch.next_ms == T0 + 750  # the start at T0 + 250 leaves it next


def test_a_job_given_a_later_slot_says_so(fq: tuple[Queue, Clock]) -> None:
    # Its reason (jobs show, the dashboard's "next slot in ...") names the slot it waits for:
    # before, it kept the first one, which had passed.
    q, clock = fq
    one: dict[str, Any] = {"rate_limit": "1/1s", "rate_key": "api"}
    ids = [q.enqueue("t", **one) for _ in range(3)]
    assert len(q.claim("w", limit=10, lease_ms=60_000).jobs) == 1
    clock.set_ms(T0 + 1_000)
    assert len(q.claim("w", limit=10, lease_ms=60_000).jobs) == 1
    slot = q.client.zscore(q.keys.prefix + "flow:rheld", ids[2])
    assert slot == T0 + 2_000
    reason = q.get_job(ids[2]).fields["flow_reason"]
    assert reason == f"rate window api (1 per 1000 ms) until {T0 + 2_000}"
