"""Review of the session's changes (git diff 9b8633f..HEAD -- lua scheduler): each test failed
on the code before its fix. Real scripts on the test clock."""

from __future__ import annotations

import pytest

from scheduler import Queue
from scheduler.core.errors import CorruptKey
from tests.conftest import Clock, dump_queue

T0 = 1_000_000
MIN_MS = 60_000


def _pending(q: Queue, name: str) -> str:
    return str(q.client.hget(q.keys.prefix + "schedule:" + name, "pending"))


@pytest.mark.parametrize("how", ["remove", "pause"])
def test_a_withdrawal_that_would_park_children_with_leased_of_another_type_writes_nothing(
    tq: tuple[Queue, Clock], how: str
) -> None:
    # sched_unpend parks the occurrence's waiting children (dead_letter: ZREM leased) after
    # its first write: a leased key edited by hand must refuse the call whole, as a dead key
    # of another type does. It raised half-way: the child left flow:waiting and flow:held
    # but never reached the dead list (lost), the occurrence out of due but still pending.
    q, clock = tq
    clock.set_ms(T0)
    q.schedule("s", "t", every_ms=MIN_MS)
    occ = _pending(q, "s")
    q.enqueue("t", after=[occ])
    q.client.set(q.keys.leased, "x")
    before = dump_queue(q.client, q)
    with pytest.raises(CorruptKey):
        if how == "remove":
            q.remove_schedule("s")
        else:
            q.pause_schedule("s")
    assert dump_queue(q.client, q) == before
