"""Flow keys edited by hand into another type (tests/test_wrong_type_matrix.py's findings for
parents, children and concurrency keys): each call either succeeds with every job in a place,
or raises CorruptKey having written nothing."""

from __future__ import annotations

import pytest
import redis

from scheduler import CorruptKey, Queue, SchedulerError
from tests.conftest import dump_queue

HOUR_MS = 3_600_000


def _no_stats(d: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in d.items() if ":stats:" not in k}


def _leased_parent(q: Queue) -> tuple[str, str]:
    pid = q.enqueue("t", max_attempts=1)
    (lease,) = q.claim("w", limit=10, lease_ms=HOUR_MS).jobs
    assert lease.id == pid
    return pid, lease.token


def _place(client: redis.Redis, q: Queue, job_id: str) -> list[str]:
    out = []
    for key in (q.keys.due, q.keys.leased, q.keys.dead, q.keys.flow_held, q.keys.flow_waiting):
        try:
            if client.zscore(key, job_id) is not None:
                out.append(key[len(q.keys.prefix) :])
        except redis.ResponseError:
            pass
    return out


@pytest.mark.parametrize("suffix", ["flow:held", "flow:waiting", "dead", "flow:children:{p}"])
def test_a_child_is_refused_whole_when_a_key_it_needs_is_of_another_type(
    q: Queue, client: redis.Redis, suffix: str
) -> None:
    """Before: flow_wait's SADD/ZADD raised WRONGTYPE after enqueue had SET the child's spec
    (a job in no set) and marked the parent `kids`."""
    pid = q.enqueue("t", delay_ms=HOUR_MS)
    client.set(q.keys.prefix + suffix.format(p=pid), "hand-edited")
    before = dump_queue(client, q)
    with pytest.raises(CorruptKey, match=suffix.split(":{")[0]):
        q.enqueue("t", after=[pid])
    assert dump_queue(client, q) == before


def test_a_parent_whose_hash_is_another_type_refuses_its_child_whole(
    q: Queue, client: redis.Redis
) -> None:
    pid = q.enqueue("t", delay_ms=HOUR_MS)
    client.set(q.keys.job(pid), "hand-edited")  # its spec is still there: 'pending'
    before = dump_queue(client, q)
    with pytest.raises(CorruptKey, match="is not a hash"):
        q.enqueue("t", after=[pid])
    assert dump_queue(client, q) == before


@pytest.mark.parametrize("suffix", ["flow:held", "flow:waiting"])
def test_cancelling_a_parent_parks_its_child_when_a_hold_set_is_of_another_type(
    q: Queue, client: redis.Redis, suffix: str
) -> None:
    """Before: flow_parent_ended's ZREM raised after cancel had taken the parent out of leased."""
    pid, _token = _leased_parent(q)
    child = q.enqueue("t", after=[pid])
    client.delete(q.keys.prefix + suffix)
    client.set(q.keys.prefix + suffix, "hand-edited")
    assert q.cancel(pid) == "leased"
    assert q.status(pid) == "cancelled"
    assert _place(client, q, child) == ["dead"]


def test_cancelling_a_parent_with_the_dead_set_of_another_type_writes_nothing(
    q: Queue, client: redis.Redis
) -> None:
    pid, _token = _leased_parent(q)
    q.enqueue("t", after=[pid])
    client.set(q.keys.dead, "hand-edited")
    before = _no_stats(dump_queue(client, q))
    with pytest.raises(CorruptKey, match="dead is not a zset"):
        q.cancel(pid)
    assert _no_stats(dump_queue(client, q)) == before


def test_a_parent_done_frees_its_child_when_flow_waiting_is_of_another_type(
    q: Queue, client: redis.Redis
) -> None:
    """Before: flow_parent_done's ZSCORE raised after complete's first write (the parent in
    neither leased nor done)."""
    pid, token = _leased_parent(q)
    child = q.enqueue("t", after=[pid])
    client.delete(q.keys.flow_waiting)
    client.set(q.keys.flow_waiting, "hand-edited")
    q.complete(pid, token, 1)
    assert q.status(pid) == "done"
    assert _place(client, q, child) == ["due"]
    assert "waiting_for" not in client.hgetall(q.keys.job(child))


def test_a_held_job_stays_held_when_due_is_of_another_type(q: Queue, client: redis.Redis) -> None:
    """Before: flow_unhold's ZADD into due raised after complete had freed the slot and taken
    the held job out of flow:ckheld and flow:held: that job was in no set. complete now checks
    due first when its job frees a slot: refused whole, and sent again once due is fixed."""
    holder = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    (lease,) = q.claim("w", limit=10, lease_ms=HOUR_MS).jobs
    waiter = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    assert q.claim("w", limit=10, lease_ms=HOUR_MS).jobs == []
    client.delete(q.keys.due)
    client.set(q.keys.due, "hand-edited")
    before = _no_stats(dump_queue(client, q))
    with pytest.raises(CorruptKey, match="due is not a zset"):
        q.complete(holder, lease.token, 1)
    assert _no_stats(dump_queue(client, q)) == before
    client.delete(q.keys.due)
    q.complete(holder, lease.token, 1)
    assert client.zscore(q.keys.due, waiter) is not None


def test_a_leased_job_is_cancelled_when_flow_held_is_of_another_type(
    q: Queue, client: redis.Redis
) -> None:
    """Before: cancel asked flow:held for any job not in due, and raised WRONGTYPE."""
    q.enqueue("t")
    (lease,) = q.claim("w", limit=10, lease_ms=HOUR_MS).jobs
    client.set(q.keys.flow_held, "hand-edited")
    assert q.cancel(lease.id) == "leased"
    assert q.status(lease.id) == "cancelled"


def test_corrupt_key_is_typed_and_still_a_response_error(q: Queue, client: redis.Redis) -> None:
    pid = q.enqueue("t", delay_ms=HOUR_MS)
    client.set(q.keys.flow_held, "hand-edited")
    with pytest.raises(CorruptKey) as info:
        q.enqueue("t", after=[pid])
    assert isinstance(info.value, SchedulerError)
    assert isinstance(info.value, redis.ResponseError)
    assert str(info.value).startswith("flow:held is not a zset (nothing written)")


def test_an_older_versions_dead_list_is_no_corrupt_key(q: Queue, client: redis.Redis) -> None:
    """The dead check takes an older version's dead LIST (converted on the next park), as
    every park does: a child and its parent's cancel go through."""
    pid, _token = _leased_parent(q)
    client.rpush(q.keys.dead, "old-dead-id")
    child = q.enqueue("t", after=[pid])
    assert q.cancel(pid) == "leased"
    assert client.type(q.keys.dead) == "zset"
    assert _place(client, q, child) == ["dead"]


def test_a_result_wake_up_of_another_type_is_replaced_not_raised(
    q: Queue, client: redis.Redis
) -> None:
    """Before: complete wrote the outcome, then result_wake's LPUSH raised WRONGTYPE (a waiter
    was there): the call failed after its writes."""
    q.enqueue("t")
    (lease,) = q.claim("w", limit=10, lease_ms=HOUR_MS).jobs
    client.set(q.keys.result_wait(lease.id), "1", px=60_000)
    client.set(q.keys.result_wake(lease.id), "hand-edited")
    q.complete(lease.id, lease.token, 7)
    assert q.status(lease.id) == "done"
    assert client.lrange(q.keys.result_wake(lease.id), 0, -1) == ["done"]
    assert q.result(lease.id, timeout_s=1) == 7


def test_reading_a_job_when_due_is_of_another_type_is_a_corrupt_key(
    q: Queue, client: redis.Redis
) -> None:
    """Before: get_job / status raised Redis's bare WRONGTYPE reply."""
    job = q.enqueue("t")
    client.delete(q.keys.due)
    client.set(q.keys.due, "hand-edited")
    with pytest.raises(CorruptKey, match="scheduler doctor"):
        q.status(job)
