"""The schedule scripts against a queue-level key edited by hand into another type: a call either
succeeds or raises having written nothing (Redis keeps the writes of a script that fails half
way), and no occurrence loses its place. The schedules index is advisory (a call goes on
without it); due, leased and a schedule hash of another type are refused before the first write
(`CORRUPT <key> ...`). Each test failed on the code before this change."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import Queue
from scheduler.operations.requests import Script
from tests.conftest import Clock, dump_queue

MIN_MS = 60_000
EVERY_MS = 10_000
START_MS = 1_000 * EVERY_MS + 1
HOUR_MS = 3_600_000
# schedule_upsert's ARGV for an interval schedule (flow last), as tests/test_schedule_flow.py.
ARGS = ["d" * 32, "every", "", "", str(EVERY_MS), "0", "0", "run_once", "1", "t", "null", "5",
        "1000,2.0,60000,0.0", "0"]  # fmt: skip


def _hand_edit(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.set(key, "hand-edited")


def _upsert(q: Queue, name: str, flow: str = "", digest: str = "d" * 32) -> list[Any]:
    return list(q._execute(Script("schedule_upsert", [name, digest, *ARGS[1:], flow])))


# -- schedules (the listing index): advisory, the call goes on -------------------------------


def test_a_new_schedule_is_created_when_the_index_is_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    _hand_edit(client, q.keys.schedules)
    assert q.schedule("s2", "t", every_ms=MIN_MS) == "created"
    pending = q.get_schedule("s2").pending
    assert pending and client.zscore(q.keys.due, pending) is not None
    assert client.get(q.keys.schedules) == "hand-edited"  # left for an operator


def test_a_redefinition_replaces_its_occurrence_when_the_index_is_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    q.schedule("s", "t", every_ms=MIN_MS)
    old = q.get_schedule("s").pending
    _hand_edit(client, q.keys.schedules)
    assert q.schedule("s", "t", every_ms=2 * MIN_MS) == "updated"
    new = q.get_schedule("s")
    assert new.pending and client.zscore(q.keys.due, new.pending) is not None
    assert new.pending == old or client.zscore(q.keys.due, old) is None
    assert client.hget(q.keys.schedule("s"), "every_ms") == str(2 * MIN_MS)


def test_a_removal_succeeds_when_the_index_is_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    q.schedule("s", "t", every_ms=MIN_MS)
    occurrence = q.get_schedule("s").pending
    _hand_edit(client, q.keys.schedules)
    assert q.remove_schedule("s") == "removed"
    assert client.exists(q.keys.schedule("s"), q.keys.job(occurrence)) == 0
    assert client.zscore(q.keys.due, occurrence) is None


# -- flow:held: an upsert of the same definition reads the occurrence's own hold set ---------


def _held_occurrence(q: Queue, clock: Clock, client: redis.Redis, opts: dict[str, Any]) -> str:
    """A schedule whose pending occurrence is set aside by flow control, flow:held hand-edited."""
    clock.set_ms(START_MS)
    q.schedule("held", "export", **opts)
    clock.set_ms(START_MS + EVERY_MS)
    assert len(q.claim("w", limit=10, lease_ms=10 * MIN_MS).jobs) == 1
    clock.set_ms(START_MS + 2 * EVERY_MS)
    assert q.claim("w", limit=10).jobs == []
    held = q.get_schedule("held").pending
    assert held and client.zscore(q.keys.flow_held, held) is not None
    assert client.zscore(q.keys.due, held) is None
    _hand_edit(client, q.keys.flow_held)
    return held


HOLDS: dict[str, tuple[dict[str, Any], str]] = {
    "key": ({"concurrency_key": "hk", "concurrency_limit": 1}, "flow:ckheld:hk"),
    "rate": ({"rate_limit": "1/1h", "rate_key": "rk"}, "flow:rheld"),
}


@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_the_same_definition_keeps_a_held_occurrence_when_flow_held_is_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis, hold: str
) -> None:
    q, clock = tq
    extra, hold_set = HOLDS[hold]
    opts: dict[str, Any] = {"every_ms": EVERY_MS, **extra}
    held = _held_occurrence(q, clock, client, opts)
    assert client.zscore(q.keys.prefix + hold_set, held) is not None
    before = dump_queue(client, q)
    assert q.schedule("held", "export", **opts) == "unchanged"
    assert dump_queue(client, q) == before
    assert client.zscore(q.keys.prefix + hold_set, held) is not None


def test_the_script_itself_answers_unchanged_for_a_held_occurrence(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    """lib/rearm.lua sched_waiting, without the client's shortcut in front of it."""
    q, clock = tq
    flow = "0|hk|1||0|0|"
    clock.set_ms(START_MS)
    assert _upsert(q, "held", flow)[0] == "created"
    clock.set_ms(START_MS + EVERY_MS)
    assert len(q.claim("w", limit=10, lease_ms=10 * MIN_MS).jobs) == 1
    clock.set_ms(START_MS + 2 * EVERY_MS)
    assert q.claim("w", limit=10).jobs == []
    held = str(client.hget(q.keys.schedule("held"), "pending"))
    assert client.zscore(q.keys.prefix + "flow:ckheld:hk", held) is not None
    _hand_edit(client, q.keys.flow_held)
    before = dump_queue(client, q)
    assert _upsert(q, "held", flow) == ["unchanged", held]
    assert dump_queue(client, q) == before


# -- due, leased, a schedule hash: refused before the first write ----------------------------


def test_resume_refuses_a_due_of_another_type_before_writing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    q.schedule("s", "t", every_ms=MIN_MS)
    assert q.pause_schedule("s") == "paused"
    _hand_edit(client, q.keys.due)
    before = dump_queue(client, q)
    with pytest.raises(redis.ResponseError, match=r"due is not a zset \(nothing written\)"):
        q.resume_schedule("s")
    assert dump_queue(client, q) == before
    assert client.hget(q.keys.schedule("s"), "paused") == "1"


@pytest.mark.parametrize("op", ["pause", "remove", "redefine"])
def test_a_withdrawal_refuses_a_due_of_another_type_before_writing(
    tq: tuple[Queue, Clock], client: redis.Redis, op: str
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    assert _upsert(q, "s")[0] == "created"
    _hand_edit(client, q.keys.due)
    before = dump_queue(client, q)
    with pytest.raises(redis.ResponseError, match=r"due is not a zset \(nothing written\)"):
        if op == "pause":
            q.pause_schedule("s")
        elif op == "remove":
            q.remove_schedule("s")
        else:  # the client's counts() would refuse due first: the script alone
            _upsert(q, "s", digest="e" * 32)
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("op", ["pause", "remove"])
def test_a_withdrawal_refuses_a_leased_of_another_type_before_writing(
    tq: tuple[Queue, Clock], client: redis.Redis, op: str
) -> None:
    """An occurrence with a concurrency key frees its key on the way out, which reads the key's
    lapsed leases in leased (lib/flow.lua flow_ck_live): it raised after leaving due."""
    q, clock = tq
    clock.set_ms(START_MS)
    q.schedule("s", "t", every_ms=HOUR_MS, concurrency_key="k", concurrency_limit=1)
    occurrence = q.get_schedule("s").pending
    assert occurrence and client.hget(q.keys.job(occurrence), "ckey") == "k"
    q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    assert len(q.claim("w", limit=10, lease_ms=1_000).jobs) == 1
    clock.set_ms(START_MS + 2_000)  # the lease lapsed, not yet reaped; the occurrence not due
    _hand_edit(client, q.keys.leased)
    before = dump_queue(client, q)
    with pytest.raises(redis.ResponseError, match=r"leased is not a zset \(nothing written\)"):
        if op == "pause":
            q.pause_schedule("s")
        else:
            q.remove_schedule("s")
    assert dump_queue(client, q) == before
    assert client.zscore(q.keys.due, occurrence) is not None


def test_an_upsert_refuses_a_schedule_key_of_another_type(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    clock.set_ms(START_MS)
    _hand_edit(client, q.keys.schedule("x"))
    before = dump_queue(client, q)
    with pytest.raises(redis.ResponseError, match=r"schedule:x is not a hash \(nothing written\)"):
        q.schedule("x", "t", every_ms=MIN_MS)
    assert dump_queue(client, q) == before


def test_a_starved_refill_refuses_a_due_of_another_type_before_writing(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    base = 10_000 * MIN_MS
    clock.set_ms(base + 1)
    q.schedule("c", "t", cron="* * * * *")
    sk = q.keys.schedule("c")
    pending = str(client.hget(sk, "pending"))
    # Starved, as lib/rearm.lua sched_place leaves it: no pending occurrence, a refill asked.
    client.zrem(q.keys.due, pending)
    client.delete(q.keys.job(pending))
    client.hset(sk, mapping={"pending": "", "starved": "1", "budget": "0"})
    client.sadd(q.keys.schedules_refill, "c")
    (last,) = client.zrange(q.keys.schedule_slots("c"), -1, -1)
    more = [str(int(str(last)) + i * MIN_MS) for i in range(1, 4)]
    digest = str(client.hget(sk, "digest"))
    _hand_edit(client, q.keys.due)
    before = dump_queue(client, q)
    with pytest.raises(redis.ResponseError, match=r"due is not a zset \(nothing written\)"):
        q._execute(Script("schedule_refill", ["c", digest, *more]))
    assert dump_queue(client, q) == before
    assert client.sismember(q.keys.schedules_refill, "c")
