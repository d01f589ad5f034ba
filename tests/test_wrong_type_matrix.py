"""Every queue-level key edited by hand into another type, against every operation (issue 10's
"a key edited by hand changes nothing it should not"), on a real server.

A queue holds one job in each place (due, future, leased, dead, done, held by a concurrency
key, held by a rate, waiting for a parent, a priority level, an idempotency key, a schedule's
occurrence); one of its keys is then replaced by a value of another type, and one operation
runs. Whatever the operation does, two things must hold:

- a call that raises writes nothing (Redis does not roll a script back: an error after its
  first write leaves half a transition, e.g. a spec in no place), and raises a typed error
  (scheduler.CorruptKey, not Redis's bare WRONGTYPE, which a worker took as fatal);
- no job loses its place, unless its only place was the edited key (that one is doctor's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from scheduler import Queue, SchedulerError
from tests.conftest import Clock, delete_queue, dump_queue

T0 = 10_000_000_000
HOUR_MS = 3_600_000


@dataclass
class World:
    q: Queue
    client: redis.Redis
    clock: Clock
    ids: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # ids, and the key names below use


def populate(q: Queue, clock: Clock, client: redis.Redis) -> World:
    w = World(q, client, clock)
    clock.set_ms(T0)
    w.ids["x"] = q.enqueue("t", max_attempts=1)
    w.ids["l"] = q.enqueue("t")
    w.ids["c1"] = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    w.ids["r1"] = q.enqueue("t", rate_limit="1/1h", rate_key="rk")
    w.ids["dn"] = q.enqueue("t")
    w.ids["p"] = q.enqueue("t", max_attempts=1)
    leased = ("x", "l", "c1", "r1", "dn", "p")
    got = {j.id: j.token for j in q.claim("w", limit=100, lease_ms=HOUR_MS).jobs}
    assert set(got) == {w.ids[n] for n in leased}
    w.tokens = {n: got[w.ids[n]] for n in leased}
    q.fail(w.ids["x"], w.tokens["x"], ("E", "boom", ""), retryable=False)
    q.complete(w.ids["dn"], w.tokens["dn"], 1)
    clock.set_ms(T0 + 1)
    w.ids["c2"] = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    w.ids["r2"] = q.enqueue("t", rate_limit="1/1h", rate_key="rk")
    assert q.claim("w", limit=100, lease_ms=HOUR_MS).jobs == []
    w.ids["d"] = q.enqueue("t")
    w.ids["f"] = q.enqueue("t", delay_ms=HOUR_MS)
    w.ids["ch"] = q.enqueue("t", after=[w.ids["p"]])
    w.ids["pr"] = q.enqueue("t", priority=5, delay_ms=HOUR_MS)
    w.ids["ik"] = q.enqueue("t", key="k1", delay_ms=HOUR_MS)
    q.schedule("s", "t", every_ms=60_000)
    w.ids["s"] = q.get_schedule("s").pending or ""
    q.schedule("c", "t", cron="*/5 * * * *")
    w.ids["sc"] = q.get_schedule("c").pending or ""
    assert w.ids["s"] and w.ids["sc"]
    # A suspect (lapsed twice, lua/claim.lua): claim_late reaps it and leases it alone.
    client.hset(q.keys.job(w.ids["l"]), "lapses", "2")
    client.hset(q.keys.isolated, "w", w.ids["l"])
    (idem,) = client.scan_iter(match=q.keys.prefix + "idem:*")
    w.names = {**w.ids, "idem": idem[len(q.keys.prefix) :], "minute": str((T0 + 2) // 60_000)}
    return w


# (name, key suffix after the prefix; {id} is filled from the world)
KEYS = [
    "due", "leased", "dead", "wake", "dead:migrating", "config", "flow:held", "flow:rheld",
    "flow:waiting", "flow:levels", "flow:pdue:5", "flow:ck:k", "flow:ckheld:k", "flow:rate:rk",
    "flow:children:{p}", "schedules", "schedules:refill", "schedule:s", "schedule:c:slots",
    "workers", "{idem}", "stats:{minute}", "result:{l}", "result_wait:{l}", "isolated",
    # one job's own keys: that job may be parked (claim does), no other may suffer
    "job:{l}", "job:{p}", "job:{c1}", "job:{c2}", "job:{ch}", "job:{x}", "spec:{d}", "spec:{ch}",
    "spec:{p}", "job:{s}",
]  # fmt: skip

PLACES = ["due", "leased", "dead", "flow:held", "flow:waiting", "flow:rheld", "flow:ckheld:k"]


def places(w: World) -> dict[str, set[str]]:
    """Where each job is: the sets holding it, or its finished state."""
    # One pipeline (an error reply, a key of another type, reads as absent): a round trip per
    # command made this the matrices' heaviest step.
    pipe = w.client.pipeline(transaction=False)
    for jid in w.ids.values():
        for p in PLACES:
            pipe.zscore(w.q.keys.prefix + p, jid)
        pipe.hget(w.q.keys.job(jid), "state")
    got = iter(pipe.execute(raise_on_error=False))
    out: dict[str, set[str]] = {}
    for name in w.ids:
        found = {p for p in PLACES if _value(next(got)) is not None}
        state = _value(next(got))
        if state in ("done", "cancelled"):
            found.add(state)
        out[name] = found
    return out


def _value(reply: Any) -> Any:
    return None if isinstance(reply, redis.ResponseError) else reply


def _claim_late(w: World) -> Any:
    """Two hours on: every lease has lapsed (the reaper's moves), every delayed job is due,
    the rate window has passed and the schedules' slots are due (claim re-arms them)."""
    w.clock.set_ms(T0 + 2 * HOUR_MS)
    return w.q.claim("w", limit=100, lease_ms=HOUR_MS)


def _reap_late(w: World) -> Any:
    """Lapsed leases reaped, nothing leased (limit 1 of a far-future-only view is not
    possible: the smallest claim that still reaps)."""
    w.clock.set_ms(T0 + 2 * HOUR_MS)
    return w.q.claim("w", limit=1, lease_ms=HOUR_MS)


def _enqueue_child(w: World) -> Any:
    return w.q.enqueue("t", after=[w.ids["p"]])


def _queue_resume(w: World) -> Any:
    # Paused first (unless config is the key edited into another type), then resumed.
    with contextlib.suppress(redis.ResponseError):
        w.client.hset(w.q.keys.config, "paused_ms", str(T0))
    return w.q.resume()


OPS: dict[str, Callable[[World], Any]] = {
    "enqueue": lambda w: w.q.enqueue("t"),
    "enqueue_future": lambda w: w.q.enqueue("t", delay_ms=HOUR_MS),
    "enqueue_key": lambda w: w.q.enqueue("t", key="k2"),
    "enqueue_key_taken": lambda w: w.q.enqueue("t", key="k1"),
    "enqueue_child": _enqueue_child,
    "enqueue_ck": lambda w: w.q.enqueue("t", concurrency_key="k", concurrency_limit=1),
    "enqueue_rate": lambda w: w.q.enqueue("t", rate_limit="1/1h", rate_key="rk"),
    "enqueue_priority": lambda w: w.q.enqueue("t", priority=5),
    "claim": lambda w: w.q.claim("w", limit=100, lease_ms=HOUR_MS),
    "claim_late": _claim_late,
    "reap_late": _reap_late,
    "heartbeat": lambda w: w.q.heartbeat([(w.ids["l"], w.tokens["l"])], lease_ms=HOUR_MS),
    "heartbeat_ck": lambda w: w.q.heartbeat([(w.ids["c1"], w.tokens["c1"])], lease_ms=HOUR_MS),
    "complete": lambda w: w.q.complete(w.ids["l"], w.tokens["l"], 1),
    "complete_ck": lambda w: w.q.complete(w.ids["c1"], w.tokens["c1"], 1),
    "complete_rate": lambda w: w.q.complete(w.ids["r1"], w.tokens["r1"], 1),
    "fail": lambda w: w.q.fail(w.ids["l"], w.tokens["l"], ("E", "x", "")),
    "fail_dead": lambda w: w.q.fail(w.ids["l"], w.tokens["l"], ("E", "x", ""), retryable=False),
    "fail_ck": lambda w: w.q.fail(w.ids["c1"], w.tokens["c1"], ("E", "x", "")),
    "release": lambda w: w.q.release([(w.ids["l"], w.tokens["l"])]),
    "release_ck": lambda w: w.q.release([(w.ids["c1"], w.tokens["c1"])]),
    "cancel_due": lambda w: w.q.cancel(w.ids["d"]),
    "cancel_leased": lambda w: w.q.cancel(w.ids["l"]),
    "cancel_held": lambda w: w.q.cancel(w.ids["c2"]),
    "cancel_parent": lambda w: w.q.cancel(w.ids["p"]),
    "complete_parent": lambda w: w.q.complete(w.ids["p"], w.tokens["p"], 1),
    "fail_parent": lambda w: w.q.fail(w.ids["p"], w.tokens["p"], ("E", "x", "")),
    "cancel_child": lambda w: w.q.cancel(w.ids["ch"]),
    "cancel_occurrence": lambda w: w.q.cancel(w.ids["s"]),
    "requeue_dead": lambda w: w.q.requeue_dead([w.ids["x"]]),
    "purge_dead": lambda w: w.q.purge_dead([w.ids["x"]]),
    "schedule_new": lambda w: w.q.schedule("s2", "t", every_ms=60_000),
    "schedule_redefine": lambda w: w.q.schedule("s", "t", every_ms=120_000),
    "schedule_same": lambda w: w.q.schedule("s", "t", every_ms=60_000),
    "pause": lambda w: w.q.pause_schedule("s"),
    "resume": lambda w: w.q.resume_schedule("s"),
    "remove": lambda w: w.q.remove_schedule("s"),
    "run_schedule": lambda w: w.q.run_schedule_now("s"),
    "queue_pause": lambda w: w.q.pause(),
    "queue_resume": _queue_resume,
    "reschedule_due": lambda w: w.q.reschedule(w.ids["d"], delay_ms=HOUR_MS),
    "reschedule_future": lambda w: w.q.reschedule(w.ids["f"], delay_ms=0),
    "reschedule_priority": lambda w: w.q.reschedule(w.ids["pr"], delay_ms=0),
    "reschedule_child": lambda w: w.q.reschedule(w.ids["ch"], delay_ms=0),
    "reschedule_occurrence": lambda w: w.q.reschedule(w.ids["s"], delay_ms=0),
    "counts": lambda w: w.q.counts(),
    "list_due": lambda w: w.q.list_jobs("due"),
    "list_dead": lambda w: w.q.list_jobs("dead"),
    "list_leased": lambda w: w.q.list_jobs("leased"),
    "get_jobs": lambda w: [w.q.get_job(j) for j in w.ids.values()],
}


# What an operation takes away on purpose: a purged dead job, a withdrawn occurrence.
GONE_BY_DESIGN = {("purge_dead", "x"), ("pause", "s"), ("remove", "s"), ("schedule_redefine", "s")}


def corrupt(w: World, suffix: str) -> str:
    key = w.q.keys.prefix + suffix.format(**w.names)
    was = w.client.type(key)
    w.client.delete(key)
    if was == "string":
        w.client.rpush(key, "hand-edited")
    else:
        w.client.set(key, "hand-edited")
    return key


def snapshot(client: redis.Redis, q: Queue) -> list[tuple[str, int, bytes]]:
    """Every key of the queue (the test clock too) as DUMP and PTTL: one populate per key."""
    keys = sorted(client.scan_iter(match=q.keys.pattern(), count=1000))
    pipe = client.pipeline(transaction=False)  # DUMP replies are never decoded
    for k in keys:
        pipe.dump(k)
        pipe.pttl(k)
    got = pipe.execute()
    return [(k, max(int(got[2 * i + 1]), 0), got[2 * i]) for i, k in enumerate(keys)]


def restore(client: redis.Redis, q: Queue, saved: list[tuple[str, int, bytes]]) -> None:
    delete_queue(client, q)
    pipe = client.pipeline(transaction=False)
    for key, ttl, value in saved:
        pipe.restore(key, ttl, value)
    pipe.execute()


def _changed(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    keys = set(before) | set(after)
    return {
        k: (before.get(k), after.get(k))
        for k in sorted(keys)
        if before.get(k) != after.get(k) and ":stats:" not in k
    }


@pytest.mark.parametrize("suffix", KEYS)
def test_a_hand_edited_key_neither_half_writes_nor_loses_a_job(
    tq: tuple[Queue, Clock], client: redis.Redis, suffix: str
) -> None:
    q, clock = tq
    problems: list[str] = []
    w = populate(q, clock, client)
    clock.set_ms(T0 + 2)
    saved = snapshot(client, q)
    for op_name, op in OPS.items():
        restore(client, q, saved)
        edited = corrupt(w, suffix)
        before_places = places(w)
        before = dump_queue(client, q)
        try:
            op(w)
        except (SchedulerError, redis.ResponseError) as exc:
            if not isinstance(exc, SchedulerError):  # a typed error (CorruptKey), not Redis's text
                problems.append(f"{op_name}: untyped {type(exc).__name__}: {str(exc)[:50]!r}")
            diff = _changed(before, dump_queue(client, q))
            if diff:
                short = [k[len(q.keys.prefix) :] for k in diff]
                problems.append(f"{op_name}: raised {str(exc)[:60]!r} after writing {short}")
            continue
        except Exception as exc:  # a crash in our own code, not a refusal
            problems.append(f"{op_name}: crashed {type(exc).__name__}: {exc}")
            continue
        after_places = places(w)
        edited_place = edited[len(q.keys.prefix) :]
        for name, was in before_places.items():
            if (op_name, name) in GONE_BY_DESIGN:
                continue
            if was and not after_places[name] and was != {edited_place}:
                problems.append(f"{op_name}: job {name} left {sorted(was)} for no place")
    assert not problems, "\n".join(problems)
