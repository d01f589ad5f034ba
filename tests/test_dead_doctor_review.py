"""Dead-letter handling, retention and doctor, from a review: each test failed on the code it was
written against and names the promise it checks."""

from __future__ import annotations

import pytest
import redis

from scheduler import BadArgument, JobState, Queue
from scheduler.admin.doctor import check_queue, repair_queue

HOUR_MS = 3_600_000


def _park(q: Queue, job_id: str) -> None:
    """A real dead letter (fail.lua's park); nothing else may be due when it is called."""
    q.enqueue("t", {}, job_id=job_id, max_attempts=1)
    (j,) = q.claim("w", limit=1).jobs
    assert j.id == job_id
    assert q.fail(j.id, j.token, ("E", "m", ""), retryable=False).status == "dead"


def _fix(client: redis.Redis, q: Queue) -> list[tuple[str, str | None]]:
    """doctor --fix on the queue; a repair Redis refused is a crash of the tool."""
    try:
        report = repair_queue(client, q.name)
    except redis.ResponseError as exc:
        pytest.fail(f"doctor --fix crashed instead of reporting: {exc}")
    return [(i.code, i.job_id) for i in report.remaining]


# -- doctor --fix and jobs set aside by flow control (flow:held) ---------------------------------
def test_fix_of_an_expiry_on_a_waiting_child_neither_parks_nor_releases_it(
    q: Queue, client: redis.Redis
) -> None:
    """check reads a job in flow:held as due; repair_job (and repair.lua) do not, so the plan is
    re-made as for a job in no place: the waiting child goes into due, then is parked as
    'invalid job: attempts', still in flow:waiting (its parent's completion puts it in due too)."""
    parent = q.enqueue("t", 1, delay_ms=HOUR_MS)
    child = q.enqueue("t", 2, after=[parent])
    client.pexpire(q.keys.spec(child), 10 * HOUR_MS)  # an operator's hand edit: only an expiry
    assert [(i.code, i.job_id) for i in check_queue(client, q.name)] == [("expiring-job", child)]
    _fix(client, q)
    assert client.zscore(q.keys.dead, child) is None, client.hget(q.keys.job(child), "dead_reason")
    assert client.zscore(q.keys.due, child) is None  # still waiting for its parent
    assert client.zscore(q.keys.flow_waiting, child) is not None


# -- doctor must report damage, not crash ---------------------------------------------------------
def test_fix_survives_an_id_that_is_not_a_job_id(q: Queue, client: redis.Redis) -> None:
    """An id written by hand into due ('bad id': a space) with no hash: doctor plans the
    'unlist' repair, repair.lua refuses the id (job_id_ok) and the whole --fix stops."""
    client.zadd(q.keys.due, {"bad id": 5})
    assert [(i.code, i.job_id) for i in check_queue(client, q.name)] == [("missing-hash", "bad id")]
    _fix(client, q)


def test_fix_survives_a_long_non_ascii_dead_reason(q: Queue, client: redis.Redis) -> None:
    """doctor cuts the reason to 200 characters, repair.lua counts 200 bytes: a dead hash off
    the dead ZSET whose reason is 150 'é' makes the 'dead' repair refused and --fix crash."""
    _park(q, "x")
    client.zrem(q.keys.dead, "x")
    client.hset(q.keys.job("x"), "dead_reason", "é" * 150)
    assert [(i.code, i.job_id) for i in check_queue(client, q.name)] == [("orphan-hash", "x")]
    _fix(client, q)
    assert client.zscore(q.keys.dead, "x") is not None


def test_check_survives_a_flow_held_key_of_another_type(q: Queue, client: redis.Redis) -> None:
    """read_snapshots takes flow:held's ZSCORE reply as a score: a ResponseError there (the key
    is a string) ends the check with a TypeError traceback instead of a finding."""
    client.zadd(q.keys.dead, {"ghost": 5})  # a suspect that is not in due
    client.set(q.keys.flow_held, "not a zset")
    try:
        found = check_queue(client, q.name)
    except TypeError as exc:
        pytest.fail(f"doctor crashed on a hostile flow:held key: {exc!r}")
    assert ("missing-hash", "ghost") in [(i.code, i.job_id) for i in found]


# -- doctor's report matches what it did ---------------------------------------------------------
def test_a_repair_that_did_not_apply_is_not_reported_as_repaired(
    q: Queue, client: redis.Redis
) -> None:
    """repair_job returns the issue whatever repair.lua answered (0 = not moved): a pending job
    whose spec record is garbage gets the 'state' move, which repair.lua declines (no hash), and
    --fix lists it repaired once per pass while the same finding remains."""
    job = q.enqueue("t", 1)
    client.set(q.keys.spec(job), "garbage")
    report = repair_queue(client, q.name)
    fixed = [(i.code, i.job_id) for i in report.fixed]
    remaining = [(i.code, i.job_id) for i in report.remaining]
    assert not set(fixed) & set(remaining), f"reported repaired {fixed}, still found {remaining}"


def test_an_unreadable_spec_is_found_as_claim_parks_it(q: Queue, client: redis.Redis) -> None:
    """claim parks a job whose spec record cannot be read ('invalid job: record'); doctor reports
    it as a state mismatch whose fix ('state' due) can never apply."""
    job = q.enqueue("t", 1)
    client.set(q.keys.spec(job), "garbage")
    found = check_queue(client, q.name)
    assert len(found) == 1 and found[0].code != "state-mismatch", [i.code for i in found]
    (cmd,) = found[0].repair
    assert cmd[3 + int(cmd[2])] == "dead", cmd  # repair.lua's move: park it, as claim does


# -- purge / retention and ids whose job keys are gone or reused ----------------------------------
def test_purge_drops_a_dead_id_whose_job_keys_are_gone(q: Queue, client: redis.Redis) -> None:
    """A dead letter deleted by hand (DEL of its hash and spec): `dead list` still lists the id,
    but purge (and requeue) skip it, and the CLI says it 'had already left the dead list'."""
    _park(q, "x")
    client.delete(q.keys.job("x"), q.keys.spec("x"))
    assert q.dead_ids() == ["x"]
    assert q.purge_dead(["x"]) == 1
    assert q.dead_ids() == []


def test_retention_never_deletes_a_live_job_that_shares_a_dead_entrys_id(
    q: Queue, client: redis.Redis
) -> None:
    """dead_trim deletes the keys of whatever id the dead ZSET holds. With a dead entry whose
    keys were deleted by hand, enqueue accepts the id again (nothing exists under it), and the
    next park with a retention deletes that live, scheduled job."""
    _park(q, "x")
    client.delete(q.keys.job("x"), q.keys.spec("x"))
    assert q.enqueue("t", {"live": 1}, job_id="x", delay_ms=HOUR_MS) == "x"
    q.set_dead_retention(max_count=0)
    _park(q, "y")
    assert client.exists(q.keys.spec("x")) == 1, "the live job x was deleted by the retention"
    assert q.status("x") == JobState.SCHEDULED


def test_a_purged_childs_id_reused_is_not_released_by_its_old_parent(
    q: Queue, client: redis.Redis
) -> None:
    """c waits for p1 and p2; p2 dies, so c is parked but stays in flow:children:p1. Purged,
    its id is free: a new c waiting for p3 is released into due when p1 completes."""
    q.enqueue("t", 1, job_id="p1", delay_ms=HOUR_MS)
    q.enqueue("t", 2, job_id="p2", max_attempts=1)
    q.enqueue("t", 3, job_id="c", after=["p1", "p2"])
    (j,) = q.claim("w", limit=5).jobs
    assert q.fail("p2", j.token, ("E", "m", "")).status == "dead"
    assert q.purge_dead(["c"]) == 1
    q.enqueue("t", 4, job_id="p3", delay_ms=2 * HOUR_MS)
    q.enqueue("t", {"new": 1}, job_id="c", after=["p3"])
    client.zadd(q.keys.due, {"p1": 0})  # p1 due now
    (p1,) = q.claim("w", limit=5).jobs
    assert p1.id == "p1"
    q.complete("p1", p1.token)
    assert q.status("p3") == JobState.SCHEDULED
    assert client.zscore(q.keys.due, "c") is None, "the new c runs before its parent p3"
    assert client.zscore(q.keys.flow_waiting, "c") is not None


# -- bad input gets a typed error and changes nothing ---------------------------------------------
def test_purge_dead_refuses_a_single_string_instead_of_splitting_it(q: Queue) -> None:
    """`purge_dead("ab")` (an id where a list is expected) is iterated character by character:
    it deletes the dead jobs 'a' and 'b', which nobody named."""
    _park(q, "a")
    _park(q, "b")
    with pytest.raises(BadArgument):
        q.purge_dead("ab")
    assert sorted(q.dead_ids()) == ["a", "b"]
