"""doctor --fix moving a finished job back into a place (due, leased, dead) takes its id out
of the finished index (lua/lib/result.lua), so list_jobs('finished') and `jobs list
finished` no longer show a job that is waiting or dead; a finished record it gives an
expiry ('expire') is listed, until then."""

from __future__ import annotations

import uuid

import pytest
import redis

from scheduler import Queue
from scheduler.admin.doctor import check_queue, repair_queue


def finished_ids(q: Queue) -> list[str]:
    return [j.id for j in q.list_jobs("finished")]


def finished(q: Queue) -> str:
    job_id = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    q.complete(job_id, job.token, "ok")
    assert finished_ids(q) == [job_id]
    return job_id


def test_a_done_job_put_back_in_due_leaves_the_finished_listing(
    q: Queue, client: redis.Redis
) -> None:
    job_id = finished(q)
    client.zadd(q.keys.due, {job_id: 0})  # listed in due again, its state says done
    report = repair_queue(client, q.name, passes=1)  # its first step: state := due
    assert [i.code for i in report.fixed] == ["state-mismatch"], report
    assert client.zscore(q.keys.due, job_id) is not None
    assert client.hget(q.keys.job(job_id), "state") == "due"
    assert finished_ids(q) == []
    repair_queue(client, q.name)  # the next steps park it (a finished record has no payload)
    assert q.get_job(job_id).state == "dead" and finished_ids(q) == []


def test_a_done_job_put_back_in_dead_leaves_the_finished_listing(
    q: Queue, client: redis.Redis
) -> None:
    job_id = finished(q)
    client.zadd(q.keys.dead, {job_id: 0})
    repair_queue(client, q.name)
    assert client.zscore(q.keys.dead, job_id) is not None
    assert finished_ids(q) == []


def test_a_done_record_given_an_expiry_stays_listed(q: Queue, client: redis.Redis) -> None:
    job_id = finished(q)
    client.persist(q.keys.job(job_id))  # kept forever: doctor's fix gives it an expiry
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["record-no-ttl"]
    assert finished_ids(q) == [job_id]


def test_a_record_kept_forever_gets_back_its_own_result_ttl(q: Queue, client: redis.Redis) -> None:
    """A record left with no expiry (a PEXPIRE refused mid-script, e.g. by an ACL change) gets
    the job's own result TTL where its record holds one (a kept payload, a cancelled job's
    spec), not the 1 h default: a month's retention is not cut to an hour, 5 s not grown."""
    kept = q.enqueue("t", 1, result_ttl_ms=5000, keep_payload=True)
    (job,) = q.claim("w", limit=1).jobs
    q.complete(kept, job.token, "ok")
    cancelled = q.enqueue("t", 2, result_ttl_ms=30 * 86_400_000)
    q.cancel(cancelled)
    lean = q.enqueue("t", 3, result_ttl_ms=5000)  # a lean record no longer holds its TTL
    (job,) = q.claim("w", limit=1).jobs
    q.complete(lean, job.token, "ok")
    for jid in (kept, cancelled, lean):
        client.persist(q.keys.job(jid))
        client.persist(q.keys.spec(jid))
    report = repair_queue(client, q.name)
    assert sorted(i.code for i in report.fixed) == ["record-no-ttl"] * 3, report
    assert report.remaining == []
    for key in (q.keys.job(kept), q.keys.spec(kept)):
        assert 0 < client.pttl(key) <= 5000
    for key in (q.keys.job(cancelled), q.keys.spec(cancelled)):
        assert 29 * 86_400_000 < client.pttl(key) <= 30 * 86_400_000
    assert 5000 < client.pttl(q.keys.job(lean)) <= 3_600_000  # the default: 1 h


def test_a_kept_record_whose_hash_or_spec_alone_has_no_expiry_is_found(
    q: Queue, client: redis.Redis
) -> None:
    """A finished job that kept its payload is its hash and its spec record: either one with no
    expiry is kept forever (a spec outliving its hash reads as a pending job no place holds,
    which --fix would put back in due), though the other one expires."""
    ids = []
    for n, key in enumerate(("job", "spec")):
        jid = q.enqueue("t", n, keep_payload=True)
        (job,) = q.claim("w", limit=1).jobs
        q.complete(jid, job.token, "ok")
        client.persist(getattr(q.keys, key)(jid))
        ids.append(jid)
    found = {i.job_id: i.code for i in check_queue(client, q.name)}
    assert found == dict.fromkeys(ids, "record-no-ttl")
    report = repair_queue(client, q.name)
    assert report.remaining == [] and len(report.fixed) == 2
    for jid in ids:
        assert client.pttl(q.keys.job(jid)) > 0 and client.pttl(q.keys.spec(jid)) > 0


def test_a_record_a_refused_pexpire_left_is_listed_as_finished_once_repaired(
    q: Queue, client: redis.Redis
) -> None:
    """complete.lua refused at its PEXPIRE (ACL SETUSER <user> -pexpire mid-run) has marked the
    job done but never reached the finished index: --fix's expiry lists it there too, until
    the expiry it gives."""
    user = "w" + uuid.uuid4().hex[:8]
    client.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    pool = client.connection_pool  # the same server, as that user
    kwargs = {**pool.connection_kwargs, "username": user, "password": "pw"}
    worker = redis.Redis(connection_pool=redis.ConnectionPool(pool.connection_class, **kwargs))
    try:
        job_id = q.enqueue("t", 1)
        (job,) = q.claim("w", limit=1).jobs
        client.acl_setuser(user, enabled=True, commands=["-pexpire"])  # mid-run
        with pytest.raises(redis.ResponseError):
            Queue(worker, q.name).complete(job_id, job.token, "ok")
    finally:
        worker.close()
        client.acl_deluser(user)
    assert client.hget(q.keys.job(job_id), "state") == "done"
    assert client.pttl(q.keys.job(job_id)) == -1 and finished_ids(q) == []
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["record-no-ttl"] and report.remaining == []
    assert finished_ids(q) == [job_id]
    expires_ms = client.zscore(q.keys.prefix + "finished", job_id)
    (sec, usec) = client.time()
    assert expires_ms is not None
    left_ms = expires_ms - (sec * 1000 + usec // 1000)
    assert 0 < client.pttl(q.keys.job(job_id)) <= 3_600_000 and 0 < left_ms <= 3_600_000
