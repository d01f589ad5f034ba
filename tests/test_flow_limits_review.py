"""Flow control, from a review (priorities, concurrency keys, rate limits): each test failed on the
code it was written against."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import Queue
from tests.conftest import FLOW_T0 as T0
from tests.conftest import Clock


def ids(q: Queue, limit: int = 100, lease_ms: int = 600_000) -> list[str]:
    return [j.id for j in q.claim("w", limit=limit, lease_ms=lease_ms).jobs]


def test_an_aged_job_held_by_its_key_does_not_hide_its_priority_level(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    client.hset(q.keys.config, "priority_aging_ms", 5_000)
    holder = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    assert ids(q) == [holder]  # key k full for the rest of the test
    q.enqueue("t", priority=5, concurrency_key="k", concurrency_limit=1)
    clock.set_ms(T0 + 6_000)  # that job is aged now
    low = q.enqueue("t")
    clock.set_ms(T0 + 6_001)
    high = q.enqueue("t", priority=5)
    clock.set_ms(T0 + 6_002)
    # The aged job is set aside (its key is full) but stays in flow:pdue:5, first in the
    # level's window: the level pass met only that seen id and ended, so `high` was left to
    # the FIFO pass and the older priority-0 job went first.
    assert ids(q, limit=1) == [high], f"priority 0 ({low}) claimed before priority 5 ({high})"


def test_a_shorter_window_on_the_same_rate_key_does_not_erase_a_longer_ones_starts(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    first = q.enqueue("a", rate_limit="2/1h", rate_key="api")
    assert ids(q) == [first]
    clock.set_ms(T0 + 2_000)
    fast = q.enqueue("b", rate_limit="100/1s", rate_key="api")
    assert ids(q) == [fast]  # its claim trims flow:rate:api to its own 1 s window
    clock.set_ms(T0 + 2_500)
    second = q.enqueue("a", rate_limit="2/1h", rate_key="api")
    # 2 starts of key api in the last hour already (first, fast): a 2-per-hour job waits.
    assert ids(q) == [], f"{second}: a third start of api within 2.5 s under 2/1h"


def test_a_shorter_window_on_the_same_rate_key_does_not_expire_the_log_early(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("a", rate_limit="2/1h", rate_key="api2")
    q.enqueue("b", rate_limit="100/1s", rate_key="api2")
    assert len(ids(q)) == 2
    # The last claim's PEXPIRE (its window + 1 s) wins: the hour's log is gone in 2 s.
    assert client.pttl(q.keys.prefix + "flow:rate:api2") > 3_600_000, "log expires in 2 s"


def test_a_level_that_is_no_number_does_not_stop_every_claim(
    tq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = tq
    lapsed = q.enqueue("t")
    assert ids(q, lease_ms=1_000) == [lapsed]
    job = q.enqueue("t", priority=5)
    client.sadd(q.keys.prefix + "flow:levels", "high")  # an advisory index, edited by hand
    clock.set_ms(2_000)
    # Before: table.sort compared nil with a number after the reaper's writes, and every later
    # claim raised the same way: nothing ran at all.
    got = q.claim("w", limit=10, lease_ms=60_000).jobs
    assert sorted(j.id for j in got) == sorted([lapsed, job])


def test_a_reused_job_id_counts_as_a_second_start_of_its_rate_window(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    import time

    q, _ = fq
    rate: dict[str, Any] = {"rate_limit": "2/1h", "rate_key": "r"}
    q.enqueue("t", job_id="x", result_ttl_ms=1, **rate)
    (lease,) = q.claim("w", limit=1, lease_ms=60_000).jobs
    q.complete("x", lease.token, None)
    deadline = time.monotonic() + 5
    while client.exists(q.keys.job("x")) and time.monotonic() < deadline:
        time.sleep(0.01)  # the done record expires; its id may be enqueued again
    q.enqueue("t", job_id="x", **rate)
    assert ids(q) == ["x"]  # its start is logged as 'x:1' again: the first one is overwritten
    late = q.enqueue("t", **rate)
    assert ids(q) == [], f"{late}: a third start in the hour under 2/1h"
    assert client.zcard(q.keys.prefix + "flow:rate:r") == 2


def test_a_parked_candidate_does_not_end_its_priority_level(
    fq: tuple[Queue, Clock], client: redis.Redis
) -> None:
    q, clock = fq
    low = q.enqueue("t")
    clock.set_ms(T0 + 1)
    bad = q.enqueue("t", priority=9)
    client.hset(q.keys.job(bad), "max_attempts", "many")  # claim parks it: 'invalid job'
    high = q.enqueue("t", priority=9)
    got = ids(q, limit=1)
    # The level's window held only `bad`; its park ('gone') ended the level pass, and the FIFO
    # pass handed out the priority-0 job ahead of `high`.
    assert got == [high], f"priority 0 ({low}) claimed before priority 9 ({high})"
    assert q.status(bad) == "dead"


def _key_of_another_type(client: redis.Redis, q: Queue, job_id: str) -> None:
    client.delete(q.keys.job(job_id))
    client.set(q.keys.job(job_id), "not a hash")


def test_a_held_job_key_of_another_type_does_not_strand_the_complete_that_frees_its_slot(
    q: Queue, client: redis.Redis
) -> None:
    a = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    other = q.enqueue("t")
    tokens = {j.id: j.token for j in q.claim("w", limit=10, lease_ms=60_000).jobs}
    assert set(tokens) == {a, other}  # b is held by key k
    _key_of_another_type(client, q, b)
    # Promoting b wrote into its key (HDEL flow_reason) and raised after complete's first write
    # (ZREM leased): a and other were left in neither leased nor done.
    done = q.complete_many([(a, tokens[a], None), (other, tokens[other], None)])
    assert done == ["done", "done"]
    assert (q.status(a), q.status(other)) == ("done", "done")


@pytest.mark.parametrize(
    "key, flow",
    [
        ("flow:levels", {"priority": 5}),
        ("flow:pdue:5", {"priority": 5}),
        ("flow:ck:k", {"concurrency_key": "k", "concurrency_limit": 1}),
        ("flow:rate:r", {"rate_limit": "1/1s", "rate_key": "r"}),
        ("flow:rheld", {}),
    ],
)
def test_a_flow_key_of_another_type_does_not_stop_the_other_jobs(
    q: Queue, client: redis.Redis, key: str, flow: dict[str, Any]
) -> None:
    q.enqueue("t", **flow)
    client.delete(q.keys.prefix + key)
    client.set(q.keys.prefix + key, "written by hand")
    plain = q.enqueue("t")
    # Before: WRONGTYPE from the flow key on every claim (the flow job stays due), so no job
    # of the queue ever ran again.
    assert plain in ids(q)


def test_a_rate_slot_goes_to_the_highest_priority_held_job(fq: tuple[Queue, Clock]) -> None:
    q, clock = fq
    rate: dict[str, Any] = {"rate_limit": "1/1s", "rate_key": "r"}
    low = [q.enqueue("t", job_id=f"a{i:03}", **rate) for i in range(150)]
    assert ids(q, limit=1) == [low[0]]
    assert ids(q, limit=1) == []  # the other 149 are set aside until the next slot
    urgent = q.enqueue("t", job_id="z", priority=9, **rate)
    assert ids(q, limit=1) == []  # set aside too, at the same slot
    clock.set_ms(T0 + 1_000)
    # Before: a claim moved back only the first limit + 100 flow:rheld entries, in id order:
    # `z` stayed set aside and a priority-0 job took the slot (and the next 48 slots too).
    assert ids(q, limit=1) == [urgent]


def test_a_lease_shortened_by_a_heartbeat_frees_its_slot_when_it_lapses(
    fq: tuple[Queue, Clock],
) -> None:
    q, clock = fq
    a = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    b = q.enqueue("t", concurrency_key="k", concurrency_limit=1)
    # limit=1: b stays due, a candidate of the claim below (with limit=5 this claim set it
    # aside by key k, and only a's release or reaping brings a held job back).
    (lease,) = q.claim("w", limit=1, lease_ms=60_000).jobs
    assert q.heartbeat([(a, lease.token)], lease_ms=1_000)[1] == {a: "held"}  # until T0 + 1 s
    clock.set_ms(T0 + 2_000)
    # `a` lapsed at T0 + 1 s, but flow:ck:k still scores it at the claim's T0 + 60 s: counted
    # live until the reaper gets to it (reap_limit=0 here: a backlog of lapsed leases).
    got = [j.id for j in q.claim("w", limit=5, lease_ms=60_000, reap_limit=0).jobs]
    assert got == [b]


def test_counts_read_a_flow_set_of_another_type_as_empty(q: Queue, client: redis.Redis) -> None:
    """counts (and the listings that read the server clock from it) must not fail on one
    advisory flow set edited into another type: doctor reports the key."""
    job = q.enqueue("t", {})
    for name in ("held", "rheld", "waiting"):
        client.set(q.keys.prefix + "flow:" + name, "x")
    assert q.counts().due == 1
    assert [j.id for j in q.list_jobs("due")] == [job]


def test_removing_a_schedule_survives_a_priority_index_of_another_type(
    q: Queue, client: redis.Redis
) -> None:
    q.schedule("s", "t", every_ms=60_000, priority=3)
    client.set(q.keys.prefix + "flow:pdue:3", "x")
    assert q.remove_schedule("s") == "removed"
    assert q.counts().due == 0
