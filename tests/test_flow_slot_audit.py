"""Flow control's slot accounting, from an audit (docs/flow-control.md): a concurrency key's
held jobs must not wait while the key has a free slot and nothing leased. Each test failed on
the code it was written against."""

from __future__ import annotations

from typing import Any

import redis

from scheduler import Queue
from tests.conftest import Clock

EVERY_MS = 10_000
START_MS = 1_000 * EVERY_MS + 1  # just after a slot: the next one is EVERY_MS - 1 ms away
DAY_MS = 86_400_000


def ids(q: Queue, limit: int = 100) -> list[str]:
    return [j.id for j in q.claim("w", limit=limit, lease_ms=600_000).jobs]


def test_a_misfire_skip_of_an_occurrence_let_out_of_its_keys_hold_passes_the_slot_on(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    first = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    [running] = q.claim("w", limit=1, lease_ms=DAY_MS).jobs
    assert running.id == first
    opts: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}
    q.schedule("s", "report", every_ms=EVERY_MS, misfire="skip", **opts)
    clock.set_ms(START_MS + EVERY_MS)  # the occurrence is due: held by its key
    assert ids(q) == []
    later = q.enqueue("t", **opts)
    assert ids(q) == []  # held by its key too, behind the occurrence
    clock.set_ms(START_MS + 3 * EVERY_MS)  # the held occurrence missed a later slot
    q.complete(running.id, running.token)  # the key's one free slot goes to the occurrence
    # The claim drops the occurrence (misfire skip; the next one is 10 s away). Before, the
    # slot it was let out for went with it: `later` stayed held, key k with nothing leased,
    # until the next occurrence ran and ended (a day, for a daily schedule).
    assert ids(q) == [later]
    assert client.zcard(q.keys.prefix + "flow:ckheld:k") == 0


def test_a_job_let_out_of_its_keys_hold_and_rescheduled_later_passes_the_slot_on(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, _ = fq
    opts: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}
    q.enqueue("t", **opts)
    [running] = q.claim("w", limit=1, lease_ms=600_000).jobs
    moved = q.enqueue("t", **opts)
    waiting = q.enqueue("t", **opts)
    assert ids(q) == []  # both held by key k
    q.complete(running.id, running.token)  # the key's free slot goes to `moved`, due again
    assert q.reschedule(moved, delay_ms=DAY_MS) == "rescheduled"
    # Before, `moved` took the slot it was let out for to tomorrow: `waiting` stayed held,
    # key k with nothing leased, for a day.
    assert ids(q) == [waiting]
    assert client.zcard(q.keys.prefix + "flow:ckheld:k") == 0


def test_an_unreadable_job_let_out_of_its_keys_hold_and_parked_passes_the_slot_on(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, _ = fq
    opts: dict[str, Any] = {"concurrency_key": "k", "concurrency_limit": 1}
    q.enqueue("t", **opts)
    [running] = q.claim("w", limit=1, lease_ms=600_000).jobs
    broken = q.enqueue("t", **opts)
    waiting = q.enqueue("t", **opts)
    assert ids(q) == []  # both held by key k
    q.complete(running.id, running.token)  # the key's free slot goes to `broken`, due again
    client.set(q.keys.spec(broken), "not a record")  # edited by hand: claim parks it
    # Before, the park of a job claim cannot read freed nothing: `waiting` stayed held, key k
    # with nothing leased, until another job of the key was leased and ended.
    assert ids(q) == [waiting]
    assert q.dead_ids() == [broken]
