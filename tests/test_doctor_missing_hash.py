"""An id in due or leased whose record is gone (its hash and spec deleted by hand, or expired) is
an accepted job that can no longer run. A claim that meets it parks it ('job hash missing');
`doctor --fix` took its id out instead, so the job left no trace but doctor's output. It now
parks it as the claim does (counted as a park), and an id already on the dead list, which
`scheduler dead list` shows as 'record gone', is left there: a warning, not an error to fix."""

from __future__ import annotations

import redis

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from tests.test_doctor_repair import only, run_plan
from tests.test_doctor_stats import counters

HOUR_MS = 3_600_000


def test_a_due_id_whose_record_is_gone_is_parked_as_a_claim_parks_it(
    q: Queue, client: redis.Redis
) -> None:
    now = server_now_ms(client)
    client.zadd(q.keys.due, {"lost": now, "met": now + HOUR_MS})
    before = counters(client, q)
    assert [i.code for i in repair_queue(client, q.name).fixed] == ["missing-hash"] * 2
    assert sorted(q.dead_ids()) == ["lost", "met"]  # before: [] (both ids removed)
    job = q.get_job("lost")
    assert job is not None and job.dead_reason == "job hash missing"
    assert counters(client, q) == {**before, "dead": 2}
    assert check_queue(client, q.name) == []


def test_doctors_park_is_the_claims_park(q: Queue, client: redis.Redis) -> None:
    now = server_now_ms(client)
    client.zadd(q.keys.due, {"by-claim": now})
    assert q.claim("w", limit=1).jobs == []  # the claim parks it
    client.zadd(q.keys.due, {"by-doctor": now})
    repair_queue(client, q.name)
    fields = [client.hgetall(q.keys.job(j)) for j in ("by-claim", "by-doctor")]
    assert [sorted(f) for f in fields] == [["dead_ms", "dead_reason", "state"]] * 2
    assert fields[0]["dead_reason"] == fields[1]["dead_reason"] == "job hash missing"


def test_a_leased_id_whose_record_is_gone_is_parked(q: Queue, client: redis.Redis) -> None:
    client.zadd(q.keys.leased, {"lost": server_now_ms(client) + HOUR_MS})
    assert [i.code for i in repair_queue(client, q.name).fixed] == ["missing-hash"]
    assert q.dead_ids() == ["lost"] and client.zscore(q.keys.leased, "lost") is None


def test_a_dead_id_whose_record_is_gone_stays_on_the_dead_list(
    q: Queue, client: redis.Redis
) -> None:
    client.zadd(q.keys.dead, {"lost": server_now_ms(client)})
    (issue,) = check_queue(client, q.name)
    assert (issue.code, issue.severity, issue.repair) == ("missing-hash", "warning", ())
    assert "record gone" in issue.message, issue.message
    assert repair_queue(client, q.name).fixed == []
    assert q.dead_ids() == ["lost"]  # before: removed


def test_a_stale_park_plan_leaves_an_id_enqueued_again(q: Queue, client: redis.Redis) -> None:
    client.zadd(q.keys.due, {"again": server_now_ms(client)})
    issue = only(check_queue(client, q.name), "missing-hash")
    assert q.enqueue("t", 1, job_id="again") == "again"  # enqueued again meanwhile
    assert run_plan(client, issue) == [0]
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == "again" and job.payload_json == "1"


def test_a_held_id_whose_record_is_gone_is_left_to_the_claim_that_meets_it(
    q: Queue, client: redis.Redis
) -> None:
    parent = q.enqueue("t", 1)
    child = q.enqueue("t", 2, after=[parent])
    client.delete(q.keys.job(child), q.keys.spec(child))
    issue = only(check_queue(client, q.name), "missing-hash")
    assert issue.repair == () and "flow control" in issue.message
    assert repair_queue(client, q.name).fixed == []
    (job,) = q.claim("w", limit=1).jobs
    q.complete(parent, job.token)  # the child's hold ends
    assert q.claim("w", limit=1).jobs == []
    assert q.dead_ids() == [child]
    assert client.hget(q.keys.job(child), "dead_reason") == "job hash missing"
