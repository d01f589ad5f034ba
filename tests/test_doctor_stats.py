"""`doctor --fix` counts what it does as the transition it stands in for counts it (lua/repair.lua):
a lapsed lease it reaps is `expired` and one more `lapses` on the job, as claim's reaper counts
it (so a job that kills its worker still becomes a suspect, docs/durability.md); a job it parks
from due or leased is a new `dead`, as claim's and fail's parks are. Putting a dead job back on
the dead list it had lost, re-arming an orphan and the bookkeeping moves count nothing."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from tests.old_layout import old_enqueue

HOUR_MS = 3_600_000


def counters(client: redis.Redis, q: Queue) -> dict[str, int]:
    """The queue's stats counters summed over every minute's bucket."""
    out: dict[str, int] = {}
    for key in client.scan_iter(match=f"{q.keys.prefix}stats:*"):
        for field, value in client.hgetall(key).items():
            name = str(field)
            if not name.startswith("late"):  # lib/lateness.lua's fields beside the counters
                out[name] = out.get(name, 0) + int(value)
    return {k: v for k, v in out.items() if v}


def _two_lapsed(q: Queue, client: redis.Redis, max_attempts: int) -> tuple[str, str]:
    """a: lapsed an hour ago (doctor reaps it); b: a second ago (left to claim's reaper)."""
    a, b = (q.enqueue("t", i, max_attempts=max_attempts) for i in (1, 2))
    assert {j.id for j in q.claim("w", limit=2).jobs} == {a, b}
    now = server_now_ms(client)
    client.zadd(q.keys.leased, {a: now - HOUR_MS, b: now - 1_000})
    return a, b


def test_a_lease_doctor_reaps_is_counted_as_the_claims_reaper_counts_it(
    q: Queue, client: redis.Redis
) -> None:
    a, b = _two_lapsed(q, client, max_attempts=3)
    before = counters(client, q)
    assert [i.code for i in repair_queue(client, q.name).fixed] == ["lease-expired"]
    assert counters(client, q) == {**before, "expired": 1}
    q.claim("w2", limit=0)  # the reaper re-arms b
    assert counters(client, q) == {**before, "expired": 2}
    fa, fb = (client.hgetall(q.keys.job(j)) for j in (a, b))
    assert (fa["state"], fa.get("lapses")) == (fb["state"], fb.get("lapses")) == ("due", "1")
    assert fa.keys() == fb.keys()


def test_a_lease_doctor_reaps_into_the_dead_list_is_expired_and_dead(
    q: Queue, client: redis.Redis
) -> None:
    a, b = _two_lapsed(q, client, max_attempts=1)
    before = counters(client, q)
    repair_queue(client, q.name)
    assert counters(client, q) == {**before, "expired": 1, "dead": 1}
    q.claim("w2", limit=0)  # the reaper parks b
    assert counters(client, q) == {**before, "expired": 2, "dead": 2}
    assert client.hget(q.keys.job(a), "state") == client.hget(q.keys.job(b), "state") == "dead"


def test_a_job_no_worker_can_run_parked_by_doctor_is_a_new_dead(
    q: Queue, client: redis.Redis
) -> None:
    ids = [old_enqueue(q, client, "t", '{"n":1}', job_id=f"bad{i}") for i in (1, 2)]
    for jid in ids:
        client.hdel(q.keys.job(jid), "task")  # claim parks it as 'invalid job: task' too
    client.zadd(q.keys.due, {ids[1]: server_now_ms(client) + HOUR_MS})  # claim meets bad1 only
    before = counters(client, q)
    fixed = repair_queue(client, q.name).fixed
    assert {i.job_id for i in fixed} == set(ids)
    assert counters(client, q) == {**before, "dead": 2}
    assert check_queue(client, q.name) == []


def test_claims_park_of_the_same_job_counts_the_same(q: Queue, client: redis.Redis) -> None:
    jid = old_enqueue(q, client, "t", '{"n":1}', job_id="bad")
    client.hdel(q.keys.job(jid), "task")
    before = counters(client, q)
    assert q.claim("w", limit=1).jobs == []
    assert counters(client, q) == {**before, "dead": 1}  # claim's 0 claimed: no field


def test_re_listing_a_dead_job_and_re_arming_an_orphan_count_nothing(
    q: Queue, client: redis.Redis
) -> None:
    dead_id = q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(dead_id, job.token, ValueError("x"))
    client.zrem(q.keys.dead, dead_id)  # a dead job off the dead list
    orphan = old_enqueue(q, client, "t", "2", job_id="orphan")
    client.zrem(q.keys.due, orphan)  # a waiting job in no place
    before = counters(client, q)
    assert {i.code for i in repair_queue(client, q.name).fixed} == {"orphan-hash"}
    assert counters(client, q) == before
    assert client.zscore(q.keys.due, orphan) is not None
    assert client.zscore(q.keys.dead, dead_id) is not None
