"""Review of job dependencies (`after=`) and idempotency on the paths where a parent leaves
without completing: each test runs the real scripts on the test clock (docs/flow-control.md
'Dependencies': a parent that ends dead or cancelled parks its waiting children)."""

from __future__ import annotations

import pytest

from scheduler import Queue
from scheduler.core.errors import CorruptKey
from tests.conftest import Clock, dump_queue

T0 = 1_000_000
MINUTE = 60_000


def _pending(q: Queue, name: str) -> str:
    return str(q.client.hget(q.keys.prefix + "schedule:" + name, "pending"))


def _assert_parked_by(q: Queue, child: str, parent: str) -> None:
    job = q.get_job(child)
    assert job.state == "dead"
    assert job.dead_reason == f"parent cancelled: {parent}"
    assert q.client.zscore(q.keys.prefix + "flow:waiting", child) is None
    assert q.client.exists(q.keys.prefix + "flow:children:" + parent) == 0
    # Parked for a human, who can run it (docs: requeue of a parked child runs it at once).
    assert q.requeue_dead([child]) == 1
    assert [j.id for j in q.claim("w", limit=10).jobs] == [child]


@pytest.mark.parametrize("how", ["remove", "pause", "redefine"])
def test_a_child_of_an_occurrence_withdrawn_from_its_schedule_is_parked(
    tq: tuple[Queue, Clock], how: str
) -> None:
    # The pending occurrence is deleted (lib/rearm.lua sched_unpend): it never ends done, so a
    # child left waiting for it would wait for ever, neither run nor in the dead list.
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=MINUTE)
    occ = _pending(q, "s")
    child = q.enqueue("t", after=[occ])
    assert q.status(child) == "held"  # waiting for its parent
    if how == "remove":
        assert q.remove_schedule("s") == "removed"
    elif how == "pause":
        assert q.pause_schedule("s") == "paused"
    else:
        q.schedule("s", "t", every_ms=2 * MINUTE)
    _assert_parked_by(q, child, occ)


def test_a_child_of_an_occurrence_dropped_by_the_misfire_policy_is_parked(
    tq: tuple[Queue, Clock],
) -> None:
    # Claimed late, the occurrence is dropped (state cancelled, skipped=misfire): a cancelled
    # parent parks its waiting children.
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=MINUTE, misfire="skip")
    occ = _pending(q, "s")
    child = q.enqueue("t", after=[occ])
    clock.set_ms(T0 + 10 * MINUTE)
    assert [j.id for j in q.claim("w", limit=10).jobs] == []
    assert q.get_job(occ).state == "cancelled"
    _assert_parked_by(q, child, occ)


def test_a_withdrawal_that_would_park_children_into_a_dead_key_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock],
) -> None:
    # The children's park writes the dead key after the withdrawal's first write: checked
    # before it, so a dead key edited by hand refuses the pause whole.
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=MINUTE)
    occ = _pending(q, "s")
    child = q.enqueue("t", after=[occ])
    q.client.set(q.keys.dead, "x")
    before = dump_queue(q.client, q)
    with pytest.raises(CorruptKey):
        q.pause_schedule("s")
    assert dump_queue(q.client, q) == before
    q.client.delete(q.keys.dead)
    assert q.pause_schedule("s") == "paused"
    _assert_parked_by(q, child, occ)
