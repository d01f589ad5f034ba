"""complete, fail and a schedule's unpend read a job's hash once per field (the flow fields
with the rest): complete of a concurrency-key job read `ckey` again through flow_release, fail
read the job three times (lease, attempts, the flow), a pause read the pending occurrence's
flow twice. Seen through MONITOR, which lists the commands a script runs. The moves themselves
are unchanged: a key's slot is released once (fail's retry and park are separate paths), so one
held job is promoted per freed slot."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import pytest
import redis

from scheduler import Queue
from tests.conftest import Clock
from tests.redis_server import is_cluster_run

pytestmark = pytest.mark.skipif(is_cluster_run(), reason="MONITOR is per node")

READS = ("HGET", "HMGET", "HGETALL")


def hash_reads(client: redis.Redis, key: str, action: Callable[[], object]) -> list[list[str]]:
    """The fields of each read of hash `key` that `action` made (scripts' commands included)."""
    sentinel = "end-" + uuid.uuid4().hex
    out: list[list[str]] = []
    with client.monitor() as m:  # type: ignore[no-untyped-call]
        action()
        client.echo(sentinel)
        while True:
            words = m.next_command()["command"].split()
            if sentinel in words:
                return out
            if words[0].upper() in READS and words[1] == key:
                out.append(words[2:])


def twice(reads: list[list[str]]) -> list[str]:
    return [f for f, n in Counter(f for r in reads for f in r).items() if n > 1]


def keyed(q: Queue, n: int) -> list[str]:
    """n jobs of concurrency key k, limit 1."""
    return [q.enqueue("t", concurrency_key="k", concurrency_limit=1) for _ in range(n)]


def ckheld(client: redis.Redis, q: Queue) -> list[str]:
    return [str(i) for i in client.zrange(q.keys.prefix + "flow:ckheld:k", 0, -1)]


def test_complete_of_a_key_job_reads_no_field_twice(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, _ = tq
    ids = keyed(q, 3)
    (lease,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert ckheld(client, q) == ids[1:]
    reads = hash_reads(client, q.keys.job(ids[0]), lambda: q.complete(ids[0], lease.token, None))
    assert twice(reads) == []  # before: ckey, by lease_check's HMGET and flow_release's
    assert ckheld(client, q) == ids[2:]  # the freed slot promoted one held job
    assert [j.id for j in q.claim("w", limit=5, lease_ms=10_000).jobs] == [ids[1]]


@pytest.mark.parametrize("park", [False, True])
def test_fail_of_a_key_job_reads_each_field_once_and_frees_one_slot(
    tq: tuple[Queue, Clock], client: redis.Redis, park: bool
) -> None:
    q, _ = tq
    ids = keyed(q, 3)
    (lease,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    assert ckheld(client, q) == ids[1:]
    err = ("E", "boom", "")
    reads = hash_reads(
        client,
        q.keys.job(ids[0]),
        lambda: q.fail(ids[0], lease.token, err, retryable=not park, delay_ms=60_000),
    )
    # The lease fields, attempts and the flow fields in one HMGET, then the key's limit and
    # the error log (lib/job.lua push_error). Before: two more HMGETs (attempts, the flow).
    assert "ckey" in reads[0]
    assert sorted(reads[1:]) == [["climit"], ["errors"]]
    assert twice(reads) == []
    # Released once: one held job promoted for the one freed slot, the other still held.
    assert ckheld(client, q) == ids[2:]
    assert [j.id for j in q.claim("w", limit=5, lease_ms=10_000).jobs] == [ids[1]]
    assert client.hget(q.keys.job(ids[0]), "state") == ("dead" if park else "due")


@pytest.mark.parametrize("park", [False, True])
def test_fail_of_a_plain_job_reads_its_hash_once_and_its_error_log(
    tq: tuple[Queue, Clock], client: redis.Redis, park: bool
) -> None:
    q, _ = tq
    jid = q.enqueue("t", max_attempts=3)
    (lease,) = q.claim("w", limit=5, lease_ms=10_000).jobs
    err = ("E", "boom", "")
    reads = hash_reads(
        client, q.keys.job(jid), lambda: q.fail(jid, lease.token, err, retryable=not park)
    )
    # The lease fields, attempts and the flow fields in one HMGET, then the error log. Before:
    # two more HMGETs (attempts, the flow fields of flow_load).
    assert len(reads) == 2 and reads[1] == ["errors"]
    assert client.hget(q.keys.job(jid), "state") == ("dead" if park else "due")


def test_pausing_a_schedule_reads_its_held_occurrence_once(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    every_ms = 10_000
    start_ms = 1_000 * every_ms + 1
    clock.set_ms(start_ms)
    q.schedule("held", "export", every_ms=every_ms, concurrency_key="hk", concurrency_limit=1)
    clock.set_ms(start_ms + every_ms)
    assert len(q.claim("w", limit=10, lease_ms=600_000).jobs) == 1
    clock.set_ms(start_ms + 2 * every_ms)
    assert q.claim("w", limit=10).jobs == []
    nxt = q.get_schedule("held").pending
    assert nxt
    reads = hash_reads(client, q.keys.job(nxt), lambda: q.pause_schedule("held"))
    assert len(reads) == 1 and twice(reads) == []  # before: state, then the flow twice
    assert client.exists(q.keys.job(nxt)) == 0
    assert client.zcard(q.keys.flow_held) == 0
    assert client.exists(q.keys.prefix + "flow:ckheld:hk") == 0
