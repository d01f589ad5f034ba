"""doctor's repairs are lua/repair.lua moves that check, in the same atomic step, that the job is
still where the check found it: a plan run after a worker claimed, reaped or re-leased the job
moves nothing (a plan of plain commands would have moved the live job)."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import ResponseError

from scheduler import Queue
from scheduler.admin.doctor import Issue, check_queue, repair_queue
from scheduler.admin.inspection import server_now_ms
from scheduler.core import scripts
from tests.conftest import dump_queue

HOUR_MS = 3_600_000


def run_plan(client: redis.Redis, issue: Issue) -> list[object]:
    """Run a finding's repair as planned, later than the check (as a stale doctor would)."""
    assert issue.repair and all(cmd[0] == "EVALSHA" for cmd in issue.repair)
    client.script_load(scripts.source("repair"))
    return [client.execute_command(*cmd) for cmd in issue.repair]  # type: ignore[no-untyped-call]


def due_with_a_hash(q: Queue) -> str:
    """A due job that has its hash (claimed once and released), whatever the enqueue layout."""
    job_id = q.enqueue("t", 1)
    (job,) = q.claim("w0", limit=1).jobs
    assert q.release([(job_id, job.token)]) == ["released"]
    return job_id


def only(issues: list[Issue], code: str) -> Issue:
    (issue,) = issues
    assert issue.code == code
    return issue


def test_state_fix_planned_before_a_claim_leaves_the_claimed_job(
    q: Queue, client: redis.Redis
) -> None:
    job_id = due_with_a_hash(q)
    client.hset(q.keys.job(job_id), "state", "done")  # in due, state says done
    issue = only(check_queue(client, q.name), "state-mismatch")
    (job,) = q.claim("w", limit=1).jobs  # a worker claims it between check and repair
    before = dump_queue(client, q)
    assert run_plan(client, issue) == [0]
    assert dump_queue(client, q) == before
    assert client.hget(q.keys.job(job_id), "worker") == "w"
    q.complete(job_id, job.token)  # the lease held: the worker's result is taken
    assert q.get_job(job_id).state == "done"


def test_reap_planned_before_a_re_claim_leaves_the_new_lease(q: Queue, client: redis.Redis) -> None:
    job_id = q.enqueue("t", 1, max_attempts=3)
    q.claim("w-gone", limit=1)
    client.zadd(q.keys.leased, {job_id: server_now_ms(client) - HOUR_MS})
    issue = only(check_queue(client, q.name), "lease-expired")
    # A claim reaps the lapsed lease and leases the job again, to a live worker.
    (job,) = q.claim("w-live", limit=1).jobs
    before = dump_queue(client, q)
    assert run_plan(client, issue) == [0]
    assert dump_queue(client, q) == before
    q.complete(job_id, job.token)  # the lease held: the worker's result is taken
    assert q.get_job(job_id).state == "done"


def test_park_planned_before_a_fix_and_claim_leaves_the_running_job(
    q: Queue, client: redis.Redis
) -> None:
    job_id = q.enqueue("t", 1)
    client.hset(q.keys.job(job_id), "payload", "{not json")
    issue = only(check_queue(client, q.name), "bad-payload")
    client.hset(q.keys.job(job_id), "payload", "1")  # a human fixed it, a worker took it
    (job,) = q.claim("w", limit=1).jobs
    assert run_plan(client, issue) == [0]
    assert q.dead_ids() == []
    q.complete(job_id, job.token)  # the lease held: the worker's result is taken
    assert q.get_job(job_id).state == "done"


def test_unlisting_a_lost_hash_keeps_an_id_that_has_a_hash_again(
    q: Queue, client: redis.Redis
) -> None:
    client.zadd(q.keys.due, {"gone": server_now_ms(client)})  # an id whose hash is lost
    issue = only(check_queue(client, q.name), "missing-hash")
    assert q.enqueue("t", 1, job_id="gone") == "gone"  # the id is enqueued again meanwhile
    assert run_plan(client, issue) == [0]
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == "gone" and job.payload_json == "1"


def test_a_current_plan_still_repairs(q: Queue, client: redis.Redis) -> None:
    """The guard refuses stale plans only: the same plans, run at once, move the job."""
    job_id = due_with_a_hash(q)
    client.hset(q.keys.job(job_id), "state", "done")
    assert run_plan(client, only(check_queue(client, q.name), "state-mismatch")) == [1]
    client.zadd(q.keys.dead, {job_id: 0})
    assert run_plan(client, only(check_queue(client, q.name), "two-places")) == [1]
    assert client.zscore(q.keys.dead, job_id) is None
    assert check_queue(client, q.name) == []
    assert repair_queue(client, q.name).fixed == []


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["teleport", "j", "", "", "1"], "BAD_ARGUMENT move=teleport"),
        (["due", "j", "", "", "soon", "1"], "BAD_ARGUMENT now_ms=soon"),
        (["due", "j", "", "", "1", "-5"], "BAD_ARGUMENT run_at_ms=-5"),
        (["state", "j", "due", "", "1", "leased"], "BAD_ARGUMENT state="),
        (["unlist", "j", "due", "", "1", "nowhere", ""], "BAD_ARGUMENT places=nowhere"),
        (["dead", "j", "", "x", "1", "why", "1"], "BAD_ARGUMENT lease_until_ms=x"),
    ],
)
def test_bad_repair_arguments_are_refused_and_change_nothing(
    q: Queue, client: redis.Redis, argv: list[str], error: str
) -> None:
    q.enqueue("t", 1, job_id="j")
    client.zrem(q.keys.due, "j")
    before = dump_queue(client, q)
    keys = q.keys.script_keys()
    with pytest.raises(ResponseError, match=error):
        client.eval(scripts.source("repair"), len(keys), *keys, *argv)
    assert dump_queue(client, q) == before


def test_a_pending_job_with_an_expiry_on_its_spec_is_found_and_kept(
    q: Queue, client: redis.Redis
) -> None:
    """A never-claimed job is its spec record alone: an expiry there would lose it."""
    job_id = q.enqueue("t", 1)
    client.pexpire(q.keys.spec(job_id), HOUR_MS)
    only(check_queue(client, q.name), "expiring-job")
    assert [i.code for i in repair_queue(client, q.name).fixed] == ["expiring-job"]
    assert client.pttl(q.keys.spec(job_id)) == -1 and client.exists(q.keys.job(job_id)) == 0
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == job_id and job.payload_json == "1"


def test_an_orphan_spec_record_is_found_and_put_back_in_due(q: Queue, client: redis.Redis) -> None:
    """A spec record in no set (no job: key to scan) is still a job: fix puts it in due whole."""
    job_id = q.enqueue("t", {"x": 2})
    client.zrem(q.keys.due, job_id)
    issue = only(check_queue(client, q.name), "orphan-spec")
    assert q.keys.spec(job_id) in issue.message
    # The spec record keeps no run time: a job meant for later runs at once, and says so.
    assert issue.message.endswith("fix puts it in due, due now (its run time is not stored)")
    assert run_plan(client, issue) == [1]
    assert client.exists(q.keys.job(job_id)) == 0  # no half hash: claim creates it whole
    assert check_queue(client, q.name) == []
    (job,) = q.claim("w", limit=1).jobs
    assert job.id == job_id and job.payload_json == '{"x":2}' and job.task == "t"


@pytest.mark.parametrize("also", ["dead", "leased"])
def test_a_pending_job_with_no_hash_listed_twice_stays_a_pending_job(
    q: Queue, client: redis.Redis, also: str
) -> None:
    """A never-claimed job (its spec record alone) also listed in dead or leased: --fix takes
    it out of the other set and leaves it as it was, due at its run time. `unlist` wrote a hash
    holding only `state`, which the next pass parked as an invalid job (an audit)."""
    job_id = q.enqueue("t", {"x": 1}, delay_ms=60_000)
    run_at = client.zscore(q.keys.due, job_id)
    client.zadd(q.keys.dead if also == "dead" else q.keys.leased, {job_id: server_now_ms(client)})
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["two-places"]
    assert client.exists(q.keys.job(job_id)) == 0  # still its spec record alone
    assert client.zscore(q.keys.due, job_id) == run_at
    assert check_queue(client, q.name) == []
    assert q.get_job(job_id).payload() == {"x": 1}
