"""`scheduler doctor`: corruption injected with plain Redis commands is found (read-only), and
`--fix` repairs it without losing a job: afterwards a plain claim loop completes every job."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from scheduler import JobSpec, Queue
from scheduler.admin import doctor
from scheduler.admin.doctor import (
    Context,
    Snapshot,
    check_queue,
    check_server_settings,
    diagnose,
    repair_job,
    repair_queue,
)
from scheduler.admin.inspection import server_now_ms
from scheduler.cli.main import main
from scheduler.core.keys import QueueKeys
from tests.conftest import dump_queue
from tests.old_layout import old_enqueue
from tests.redis_server import RedisProcess, require_binary

Run = Callable[..., Result]
HOUR_MS = 3_600_000


@pytest.fixture
def cli(redis_url: str) -> Run:
    runner = CliRunner(env={"COLUMNS": "200"})

    def run(*args: str) -> Result:
        return runner.invoke(main, [*args, "--url", redis_url], catch_exceptions=False)

    return run


def codes(findings: list[dict[str, Any]]) -> dict[str | None, str]:
    return {f["job_id"]: f["code"] for f in findings}


def drain(q: Queue) -> set[str]:
    """A plain worker loop: claim and complete until nothing is due; returns the ids done."""
    done: set[str] = set()
    for _ in range(100):
        batch = q.claim("drainer", limit=100)
        if not batch.jobs:
            return done
        for job in batch.jobs:
            q.complete(job.id, job.token)
            done.add(job.id)
    raise AssertionError("claim loop did not finish")


@pytest.fixture
def corrupt(q: Queue, client: redis.Redis) -> dict[str, str]:
    """Every kind of damage, each done with plain commands as an operator or a bug would."""
    k = q.keys
    # Written as the hash-only layout (tests/old_layout.py): hand edits of a job's hash.
    ids = {name: old_enqueue(q, client, "t", f'{{"name":"{name}"}}', job_id=name) for name in (
        "healthy", "orphan", "twice", "lapsed", "badjson", "mismatch", "orphan-dead")}  # fmt: skip
    now = server_now_ms(client)
    client.zrem(k.due, "orphan")  # a hash in no place
    client.zadd(k.dead, {"twice": 0})  # in due and in dead at once
    client.zrem(k.due, "lapsed")  # leased by a worker that died an hour ago
    client.zadd(k.leased, {"lapsed": now - HOUR_MS})
    client.hset(k.job("lapsed"), mapping={"state": "leased", "worker": "ghost", "attempts": 1,
                                          "token": "1-deadbeef"})  # fmt: skip
    client.hset(k.job("badjson"), "payload", "{not json")
    client.hset(k.job("mismatch"), "state", "done")
    client.zrem(k.due, "orphan-dead")
    client.hset(k.job("orphan-dead"), mapping={"state": "dead", "dead_reason": "by hand"})
    client.zadd(k.due, {"nohash": now})  # an id whose hash is gone
    return ids


def test_healthy_queue_has_no_findings(q: Queue, client: redis.Redis) -> None:
    q.enqueue("t", 1)
    q.enqueue("t", 2, delay_ms=HOUR_MS)
    a, b, _ = (q.enqueue("t", n) for n in (3, 4, 5))
    jobs = {j.id: j for j in q.claim("w", limit=3).jobs}
    q.complete(a, jobs[a].token)
    q.fail(b, jobs[b].token, ValueError("x"), retryable=False)
    q.cancel(q.enqueue("t", 6))
    assert check_queue(client, q.name) == []


def test_doctor_finds_injected_corruption_and_changes_nothing(
    cli: Run, q: Queue, client: redis.Redis, corrupt: dict[str, str]
) -> None:
    before = dump_queue(client, q)
    result = cli("doctor", "--json", "--no-server", "-q", q.name)
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert codes(data["findings"]) == {
        "orphan": "orphan-hash", "twice": "two-places", "lapsed": "lease-expired",
        "badjson": "bad-payload", "mismatch": "state-mismatch", "orphan-dead": "orphan-hash",
        "nohash": "missing-hash",
    }  # fmt: skip
    assert all(f["fixable"] and f["redis_cli"] for f in data["findings"])
    assert all(q.keys.prefix in " ".join(f["redis_cli"]) for f in data["findings"])
    assert dump_queue(client, q) == before
    human = cli("doctor", "--no-server", "-q", q.name)
    assert human.exit_code == 1 and "orphan-hash" in human.stdout
    # Every repair is a lua/repair.lua move, shown with its arguments (move, id, where it is).
    assert "lua/repair.lua" in human.stdout and "dead nohash due" in human.stdout


def test_fix_repairs_without_losing_a_job(
    cli: Run, q: Queue, client: redis.Redis, corrupt: dict[str, str]
) -> None:
    result = cli("doctor", "--fix", "--json", "--no-server", "-q", q.name)
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert data["findings"] == [] and data["ok"]
    assert set(codes(data["fixed"])) == set(corrupt) - {"healthy"} | {"nohash"}
    assert cli("doctor", "--no-server", "-q", q.name).exit_code == 0
    done = drain(q)
    # Every runnable job ran; the unreadable one and the dead one wait for a human.
    assert done == {"healthy", "orphan", "twice", "lapsed", "mismatch"}
    assert sorted(q.dead_ids()) == ["badjson", "nohash", "orphan-dead"]
    assert q.get_job("badjson").dead_reason == "invalid payload: not JSON"
    assert client.zscore(q.keys.dead, "twice") is None
    # Its record is gone: parked as a claim parks it, not removed without a trace.
    assert q.get_job("nohash").dead_reason == "job hash missing"
    assert client.zscore(q.keys.due, "nohash") is None
    assert check_queue(client, q.name) == []


def test_recent_lapse_is_left_to_the_reaper(q: Queue, client: redis.Redis) -> None:
    q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1, lease_ms=1).jobs
    assert check_queue(client, q.name, stale_lease_ms=HOUR_MS) == []
    client.zadd(q.keys.leased, {job.id: server_now_ms(client) - 2 * HOUR_MS})
    (issue,) = check_queue(client, q.name, stale_lease_ms=HOUR_MS)
    assert (issue.code, issue.severity) == ("lease-expired", "error")


def test_lapsed_lease_of_a_live_worker_is_a_warning(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 1)
    (job,) = q.claim("w-alive", limit=1, lease_ms=1).jobs
    now = server_now_ms(client)
    client.zadd(q.keys.leased, {job.id: now - HOUR_MS})
    client.zadd(q.keys.workers, {"w-alive": now})
    client.hset(q.keys.worker("w-alive"), "host", "h")
    client.pexpire(q.keys.worker("w-alive"), 60_000)
    (issue,) = check_queue(client, q.name)
    assert (issue.code, issue.severity) == ("lease-expired", "warning")
    assert cli("doctor", "--no-server", "-q", q.name).exit_code == 0
    assert cli("doctor", "--no-server", "--strict", "-q", q.name).exit_code == 1


def test_attempts_used_up_by_a_lapsed_lease_go_dead_like_the_reaper(
    q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    client.zadd(q.keys.leased, {job.id: server_now_ms(client) - HOUR_MS})
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["lease-expired"] and report.remaining == []
    got = q.get_job(job.id)
    assert (got.state, got.dead_reason) == ("dead", "lease expired")


def test_repair_parks_through_the_lua_move_as_a_claim_does(q: Queue, client: redis.Redis) -> None:
    """doctor --fix runs lib/job.lua's dead_letter (lua/repair.lua), not a Python copy of it."""
    a, b = (q.enqueue("t", i, max_attempts=1) for i in (1, 2))
    assert {j.id for j in q.claim("w", limit=2).jobs} == {a, b}
    now = server_now_ms(client)
    client.zadd(q.keys.leased, {a: now - HOUR_MS, b: now - 1_000})  # only a is stale for doctor
    (issue,) = check_queue(client, q.name)
    assert issue.code == "lease-expired" and [c[0] for c in issue.repair] == ["EVALSHA"]
    assert "lua/repair.lua" in issue.redis_cli()[0]
    assert [i.code for i in repair_queue(client, q.name).fixed] == ["lease-expired"]
    q.claim("w2", limit=0)  # the reaper parks b
    fa, fb = (client.hgetall(q.keys.job(j)) for j in (a, b))
    assert fa.keys() == fb.keys()
    same = ("state", "dead_reason", "attempts", "max_attempts", "task")
    assert [fa[f] for f in same] == [fb[f] for f in same]
    assert fa["state"] == "dead" and "worker" not in fa  # parked: held by no worker
    assert set(client.zrange(q.keys.dead, 0, -1)) == {a, b}


def test_records_and_duplicates(q: Queue, client: redis.Redis) -> None:
    done_id = q.enqueue("t", 1)
    (job,) = q.claim("w", limit=1).jobs
    q.complete(done_id, job.token)
    client.persist(q.keys.job(done_id))  # a finished record kept forever
    dead_id = q.enqueue("t", 2, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(dead_id, job.token, ValueError("x"))
    # an older version's dead LIST holding the id twice: converted, the ZSET holds it once
    client.delete(q.keys.dead)
    client.lpush(q.keys.dead, dead_id, dead_id)
    due_id = old_enqueue(q, client, "t", "3")  # the hash-only layout: doctor reads its TTL
    client.pexpire(q.keys.job(due_id), HOUR_MS)  # a waiting job that would vanish
    found = {i.job_id: (i.code, i.severity) for i in check_queue(client, q.name)}
    assert client.type(q.keys.dead) == "zset"
    assert found == {done_id: ("record-no-ttl", "warning"), due_id: ("expiring-job", "error")}
    report = repair_queue(client, q.name)
    assert report.remaining == [] and len(report.fixed) == 2
    assert client.pttl(q.keys.job(done_id)) > 0 and client.pttl(q.keys.job(due_id)) == -1
    assert client.zrange(q.keys.dead, 0, -1) == [dead_id]


def test_a_dead_hash_off_the_dead_zset_goes_back_through_the_lua_move(
    q: Queue, client: redis.Redis
) -> None:
    """orphan-hash for a dead job: lua/repair.lua (lib/job.lua dead_letter) puts it back, at
    the time it died, so listing by age and retention see its real age."""
    dead_id = q.enqueue("t", 1, max_attempts=1)
    (job,) = q.claim("w", limit=1).jobs
    q.fail(dead_id, job.token, ValueError("x"))
    died_ms = int(client.hget(q.keys.job(dead_id), "dead_ms") or 0)
    client.zrem(q.keys.dead, dead_id)
    (issue,) = check_queue(client, q.name)
    assert issue.code == "orphan-hash" and issue.repair[0][0] == "EVALSHA"
    report = repair_queue(client, q.name)
    assert report.remaining == [] and [i.code for i in report.fixed] == ["orphan-hash"]
    assert client.zscore(q.keys.dead, dead_id) == died_ms
    assert client.hget(q.keys.job(dead_id), "dead_reason") == "attempts exhausted"


def test_wrong_type_under_a_job_key_is_reported_not_touched(
    cli: Run, q: Queue, client: redis.Redis
) -> None:
    q.enqueue("t", 1)
    client.set(q.keys.job("strange"), "x")
    result = cli("doctor", "--fix", "--json", "--no-server", "-q", q.name)
    assert result.exit_code == 1
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["code"], finding["fixable"]) == ("wrong-type", False)
    assert client.get(q.keys.job("strange")) == "x"


def test_repair_rereads_before_acting(q: Queue, client: redis.Redis) -> None:
    """A repair planned on a stale view does nothing when the job is healthy by then."""
    job_id = q.enqueue("t", 1)
    ctx = Context(QueueKeys(q.name), server_now_ms(client), frozenset())
    before = dump_queue(client, q)
    assert repair_job(client, ctx, job_id) is None
    assert dump_queue(client, q) == before


def test_diagnose_prefers_the_state_field_for_a_job_in_two_places() -> None:
    keys = QueueKeys("unit")
    fields = {"state": "leased", "task": "t", "payload": "1", "attempts": "1",
              "max_attempts": "3", "run_at_ms": "5"}  # fmt: skip
    snap = Snapshot("j", "hash", fields, None, due_ms=5, lease_until_ms=10_000, dead_count=0)
    (issue,) = diagnose(snap, Context(keys, 1_000, frozenset()))
    assert issue.code == "two-places" and [c[0] for c in issue.repair] == ["EVALSHA"]
    # unlist j from due, planned from (due,leased), keeping the state field leased
    assert issue.repair[0][-7:] == ("unlist", "j", "due,leased", "", "1000", "due", "leased")


def test_no_false_findings_under_a_live_worker(
    q: Queue, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs move between due, leased and done while the doctor reads: each suspect of the bulk
    pass is re-read in one MULTI, so nothing is reported."""
    stop = threading.Event()
    worker_q = Queue(redis.Redis(connection_pool=client.connection_pool), q.name)
    completed = [0]

    def work() -> None:
        while not stop.is_set():
            batch = worker_q.claim("busy", limit=5)
            for job in batch.jobs:
                worker_q.complete(job.id, job.token)
            completed[0] += len(batch.jobs)
            if not batch.jobs:
                worker_q.enqueue_many([JobSpec("t", i) for i in range(200)])

    suspects: list[int] = []
    real = doctor.read_snapshots

    def counting(c: redis.Redis, keys: QueueKeys, ids: Any) -> Any:
        suspects.append(len(ids))
        return real(c, keys, ids)

    monkeypatch.setattr(doctor, "read_snapshots", counting)
    thread = threading.Thread(target=work)
    thread.start()
    try:
        # At least 20 checks, and on until the worker has moved jobs under them: under xdist
        # load the thread may not have claimed anything yet when 20 quick checks are done.
        deadline = time.monotonic() + 30
        checks = 0
        while checks < 20 or (
            not (completed[0] > 0 and sum(suspects) > 0) and time.monotonic() < deadline
        ):
            assert check_queue(client, q.name) == []
            checks += 1
    finally:
        stop.set()
        thread.join(timeout=30)
    # The worker really moved jobs under the checks, and the bulk pass did see them move.
    assert completed[0] > 0 and sum(suspects) > 0


@pytest.fixture
def durable_server() -> Iterator[RedisProcess]:
    binary = require_binary("redis-server", "a second private server")
    server = RedisProcess(binary, ["--appendonly", "yes", "--appendfsync", "always",
                                   "--maxmemory-policy", "noeviction"]).start()  # fmt: skip
    yield server
    server.cleanup()


def test_server_settings(durable_server: RedisProcess) -> None:
    good = redis.Redis.from_url(durable_server.url, decode_responses=True)
    assert check_server_settings(good) == []
    good.config_set("maxmemory-policy", "allkeys-lru")
    (issue,) = check_server_settings(good)
    assert issue.code == "eviction-policy" and "noeviction" in issue.fix
    Queue(good, "s").enqueue("t", 1)
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["doctor", "--json", "--url", durable_server.url])
    assert result.exit_code == 1
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["code"] == "eviction-policy" and finding["queue"] is None
    good.config_set("maxmemory-policy", "noeviction")
    assert runner.invoke(main, ["doctor", "--url", durable_server.url]).exit_code == 0
    good.close()


def test_parking_a_schedules_pending_occurrence_arms_the_next_as_claim_does(
    q: Queue, client: redis.Redis
) -> None:
    q.schedule("tick", "t", every_ms=60_000)
    first = str(client.hget(q.keys.schedule("tick"), "pending") or "")
    assert first and client.zscore(q.keys.due, first) is not None
    client.hset(q.keys.job(first), "payload", "{not json")
    report = repair_queue(client, q.name)
    assert [i.code for i in report.fixed] == ["bad-payload"] and report.remaining == []
    assert client.hget(q.keys.job(first), "state") == "dead"
    nxt = client.hget(q.keys.schedule("tick"), "pending")
    assert nxt and nxt != first and client.zscore(q.keys.due, nxt) is not None
