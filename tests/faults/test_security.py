"""Least privilege and TLS: the two documented ACL roles (read from docs/security.md). The app
role is enough for the client API and a real worker, and refuses admin commands, KEYS, FLUSH,
and scripts that touch keys outside `sched:*`; the operator role runs every CLI command; a
refused command is one line with exit code 5, never a traceback, and a worker whose user
cannot touch its queue is refused at start. TLS with a self-signed CA works and a certificate
from another CA is refused."""

from __future__ import annotations

import asyncio
import gc
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler import AsyncQueue, JobSpec, Queue, ResultTimeout, StaleToken
from scheduler.cli.main import main
from tests.faults.conftest import Server, Tls, free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
PASSWORD = "s3cret-for-tests"
NOPERM = r"(?i)no permissions|NOPERM|can't access"
QUEUE = "acl"


def documented_acl_line(role: str = "app") -> list[str]:
    text = DOC.read_text()
    m = re.search(rf"<!-- acl:{role} -->\s*```\s*\n(ACL SETUSER [^\n]+)\n```", text)
    assert m, f"docs/security.md lost its {role} ACL line"
    return m.group(1).replace(">CHANGE-ME", ">" + PASSWORD).split()


def create_user(admin: redis.Redis, role: str, *, keys: str | None = None) -> None:
    """The documented line of `role`; keys replaces the key pattern (a per-tenant user)."""
    words = documented_acl_line(role)
    assert words[:2] == ["ACL", "SETUSER"]
    if keys is not None:
        words = [keys if w == "~sched:*" else w for w in words]
    assert admin.execute_command(*words) in ("OK", True, b"OK")  # type: ignore[no-untyped-call]


def create_app_user(admin: redis.Redis) -> None:
    create_user(admin, "app")


def app_url(server: Server) -> str:
    return f"unix://sched-app:{PASSWORD}@{server.socket}"


def exercise(q: Queue) -> None:
    """A representative run of the client API: every script and every read path."""
    q.preload()
    a = q.enqueue("acl.t", {"n": 1}, key="once")
    assert q.enqueue("acl.t", {"n": 1}, key="once") == a
    b, c = q.enqueue_many([JobSpec("acl.t", {"n": 2}), JobSpec("acl.t", {"n": 3})])
    q.enqueue("acl.t", None, delay_ms=60_000)
    batch = q.claim("w1", limit=3, lease_ms=30_000)
    jobs = {j.id: j for j in batch.jobs}
    assert set(jobs) == {a, b, c}
    _, held = q.heartbeat([(j.id, j.token) for j in batch.jobs], lease_ms=30_000)
    assert set(held.values()) == {"held"}
    q.complete(a, jobs[a].token, {"ok": True})
    with pytest.raises(StaleToken):
        q.complete(a, "999-x", None)
    assert q.fail(b, jobs[b].token, ("E", "boom", ""), retryable=False).status == "dead"
    assert q.release([(c, jobs[c].token)]) == ["released"]
    # result(): a finished job reads at once; a waiting one blocks on its wake-up (BLMOVE).
    assert q.result(a, timeout_s=1) == {"ok": True}
    with pytest.raises(ResultTimeout):
        q.result(c, timeout_s=0.1)
    assert q.cancel(c) == "due"
    assert q.get_job(a).state == "done" and q.status(b) == "dead"
    counts = q.counts()
    assert (counts.dead, counts.scheduled) == (1, 1)
    assert [j.id for j in q.list_jobs("dead")] == [b] == q.dead_ids(task="acl.t")
    assert q.requeue_dead([b]) == 1
    (again,) = q.claim("w2", limit=5).jobs
    q.fail(again.id, again.token, ("E", "boom", ""), retryable=False)
    assert q.purge_dead([b]) == 1


def test_documented_acl_user_runs_the_client_api(start_server: Callable[..., Server]) -> None:
    server = start_server()
    create_app_user(server.admin())
    q = Queue.from_url(app_url(server), QUEUE)
    exercise(q)


def test_acl_user_is_refused_everything_else(start_server: Callable[..., Server]) -> None:
    server = start_server()
    admin = server.admin()
    create_app_user(admin)
    admin.set("other:secret", "x")
    app = redis.Redis.from_url(app_url(server), decode_responses=True)
    for refused in (
        lambda: app.keys("*"),
        lambda: app.scan(0),
        lambda: app.flushall(),
        lambda: app.flushdb(),
        lambda: app.config_set("appendonly", "no"),
        lambda: app.config_get("maxmemory-policy"),
        lambda: app.script_flush(),
        lambda: app.shutdown(),
        lambda: app.get("other:secret"),
        lambda: app.set("other:x", "1"),
        lambda: app.eval("return 1", 0),
        lambda: app.execute_command("ACL", "LIST"),  # type: ignore[no-untyped-call]
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
    # A script may be loaded, but ACL rules hold for every command it calls: keys outside
    # sched:* are refused whether declared in KEYS or not.
    touch = app.script_load("return redis.call('GET', KEYS[1])")
    assert app.evalsha(touch, 1, "sched:{acl}:due") is None
    with pytest.raises(redis.exceptions.ResponseError, match=NOPERM):
        app.evalsha(touch, 1, "other:secret")
    sneak = app.script_load("return redis.call('SET', 'other:x', ARGV[1])")
    with pytest.raises(redis.exceptions.ResponseError, match=NOPERM):
        app.evalsha(sneak, 1, "sched:{acl}:due", "1")
    assert admin.exists("other:x") == 0 and admin.get("other:secret") == "x"
    assert admin.ping()  # not shut down


@pytest.fixture
def tls_server(start_server: Callable[..., Server], tls_certs: Tls) -> tuple[Server, int]:
    port = free_port()
    server = start_server(*tls_certs.server_args(port))
    create_app_user(server.admin())
    return server, port


def no_retry(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 0),
                                socket_connect_timeout=5, socket_timeout=5)  # fmt: skip


def test_tls_with_a_self_signed_ca(tls_server: tuple[Server, int], tls_certs: Tls) -> None:
    _, port = tls_server
    url = f"rediss://sched-app:{PASSWORD}@localhost:{port}/0?ssl_ca_certs={tls_certs.ca}"
    exercise(Queue.from_url(url, QUEUE))
    # Through the IP address too: the certificate names it.
    ip_url = url.replace("localhost", "127.0.0.1")
    assert Queue.from_url(ip_url, QUEUE).counts().dead == 0


def test_tls_asyncio_small_and_large_sends(tls_server: tuple[Server, int], tls_certs: Tls) -> None:
    """redis.asyncio over TLS: small sends (direct_io's, without wait_for, on the SSL transport's
    buffer) and a pipeline over its high-water mark (with it) store every job."""
    _, port = tls_server
    url = f"rediss://sched-app:{PASSWORD}@localhost:{port}/0?ssl_ca_certs={tls_certs.ca}"

    async def main() -> None:
        q = AsyncQueue.from_url(url, QUEUE)
        ids = [await q.enqueue("t", {"n": i}) for i in range(20)]
        many = await q.enqueue_many([JobSpec("t", {"pad": "x" * 2_000}) for _ in range(1_500)])
        counts = await q.counts()
        assert counts.due == 1_520 and len(set(ids + many)) == 1_520
        assert (await q.get_job(ids[-1])).payload() == {"n": 19}
        await q.aclose()

    asyncio.run(main())


def test_tls_asyncio_queue_kept_across_event_loops(
    tls_server: tuple[Server, int], tls_certs: Tls
) -> None:
    """An AsyncQueue over TLS reused by several asyncio.run() calls: each run's first call
    works, the closed loop's TLS connection is closed under its wrapper (loop_guard) without
    that loop, and nothing is left to warn at GC (filterwarnings = error)."""
    _, port = tls_server
    url = f"rediss://sched-app:{PASSWORD}@localhost:{port}/0?ssl_ca_certs={tls_certs.ca}"
    q = AsyncQueue.from_url(url, QUEUE)
    ids = [asyncio.run(q.enqueue("t", {"run": i})) for i in range(3)]
    asyncio.run(q.aclose())
    gc.collect()
    assert Queue.from_url(url, QUEUE).counts().due == 3 and len(set(ids)) == 3


def test_tls_refuses_a_certificate_from_another_ca(
    tls_server: tuple[Server, int], tls_certs: Tls
) -> None:
    _, port = tls_server
    wrong = no_retry(f"rediss://sched-app:{PASSWORD}@localhost:{port}/0"
                     f"?ssl_ca_certs={tls_certs.other_ca}")  # fmt: skip
    with pytest.raises(redis.exceptions.ConnectionError, match=r"(?i)certificate verify failed"):
        wrong.ping()
    plaintext = no_retry(f"redis://sched-app:{PASSWORD}@localhost:{port}/0")
    with pytest.raises(redis.exceptions.ConnectionError):
        plaintext.ping()
    bad_password = no_retry(f"rediss://sched-app:nope@localhost:{port}/0"
                            f"?ssl_ca_certs={tls_certs.ca}")  # fmt: skip
    with pytest.raises(redis.exceptions.AuthenticationError):
        bad_password.ping()


def test_real_worker_runs_as_the_acl_user_and_parks_a_pickle(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """The worker process (scheduler worker) under the documented ACL line: it claims, runs,
    completes, heartbeats and registers itself; a text pickle placed in a job hash is parked
    as an invalid payload, never unpickled."""
    from tests.workers.procs import spawn_worker, stop_all, wait_for

    server = start_server()
    admin = server.admin()
    create_app_user(admin)
    q = Queue(admin, QUEUE)
    ok = [q.enqueue("noop", {"n": i}) for i in range(5)]
    crafted = q.enqueue("noop", {"n": -1})
    admin.hset(q.keys.job(crafted), "payload", pickle.dumps({"evil": 1}, protocol=0).decode())
    log = str(tmp_path / "worker.log")
    worker = spawn_worker(app_url(server), QUEUE, log=log)
    try:
        wait_for(lambda: all(q.status(j) == "done" for j in ok) and q.counts().dead == 1,
                 what="outcomes as the ACL user")  # fmt: skip
    finally:
        stop_all([worker])
    job = q.get_job(crafted)
    assert (job.state, job.fields["last_error_type"]) == ("dead", "InvalidPayload")
    assert "NOPERM" not in Path(log).read_text()


# -- the operator role, and one-line refusals -------------------------------------------------
def ops_url(server: Server) -> str:
    return f"unix://sched-ops:{PASSWORD}@{server.socket}"


def cli(url: str, *args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(main, [*args, "--url", url])


def busy_queue(admin: redis.Redis) -> dict[str, str]:
    """A queue with a job in each place, a schedule, a worker record and one repairable fault."""
    q = Queue(admin, QUEUE)
    ids = {name: q.enqueue("acl.t", {"name": name}) for name in ("dead", "dead2", "leased")}
    for job in q.claim("w1", limit=3).jobs:
        if job.id != ids["leased"]:
            q.fail(job.id, job.token, ("E", "boom", ""), retryable=False)
    ids["due"] = q.enqueue("acl.t", {"n": 1})
    ids["later"] = q.enqueue("acl.t", None, delay_ms=60_000)
    q.schedule("nightly", "acl.t", None, cron="0 3 * * *")
    admin.zadd(q.keys.workers, {"w1": 1})
    admin.hset(q.keys.worker("w1"), mapping={"host": "h", "pid": "1"})
    admin.zrem(q.keys.due, ids["due"])  # an orphan hash: doctor --fix puts it back in due
    return ids


def operator_commands(ids: dict[str, str]) -> list[tuple[str, ...]]:
    q = ("-q", QUEUE)
    return [
        ("stats",), ("stats", *q), ("stats", "--json"), ("stats", "--watch", "--count", "1"),
        ("workers",), ("workers", *q, "--json"), ("keys", *q), ("keys", *q, "--json"),
        *[("jobs", "list", *q, "--state", s) for s in ("due", "scheduled", "leased", "dead")],
        ("jobs", "list", *q, "--task", "acl.t"),
        *[("jobs", "show", *q, i) for i in ids.values()],
        ("jobs", "show", *q, ids["dead"], "--json"),
        ("dead", "list", *q), ("dead", "list", *q, "--json"),
        ("dead", "retention", *q), ("dead", "retention", *q, "--max-count", "1000", "--yes"),
        ("doctor",), ("doctor", "--fix"), ("doctor", *q, "--json"),
        ("schedules", "list", *q), ("schedules", "list", *q, "--json"),
        ("schedules", "pause", "nightly", *q), ("schedules", "resume", "nightly", *q),
        ("enqueue", "acl.t", *q, "--payload", "{}"), ("enqueue", "acl.t", *q, "--key", "k"),
        ("dead", "purge", *q, "--id", ids["dead2"], "--yes"), ("dead", "requeue", *q, "--yes"),
        ("schedules", "remove", "nightly", *q),
    ]  # fmt: skip


def test_operator_role_runs_every_cli_command(start_server: Callable[..., Server]) -> None:
    server = start_server()
    admin = server.admin()
    create_user(admin, "operator")
    ids = busy_queue(admin)
    url = ops_url(server)
    for args in operator_commands(ids):
        result = cli(url, *args)
        # `doctor` before `--fix` finds the orphan (exit 1); after the repair it finds nothing.
        findings_ok = args == ("doctor",)
        assert result.exit_code in ((0, 1) if findings_ok else (0,)), (
            f"{' '.join(args)}: exit {result.exit_code}\n{result.output}"
        )
        assert "NOPERM" not in result.output and "permission" not in result.output, args
    q = Queue(admin, QUEUE)
    assert admin.zscore(q.keys.due, ids["due"]) is not None  # doctor --fix repaired it
    assert q.status(ids["dead"]) == "due" and admin.exists(q.keys.job(ids["dead2"])) == 0
    assert q.list_schedules() == []


PERMISSION_LINE = re.compile(
    r"^Error: permission denied: the Redis user may not run (\S+); connect as a user with the "
    r"operator role of docs/security\.md\n$"
)


def test_each_refused_cli_command_is_one_line_naming_it(
    start_server: Callable[..., Server],
) -> None:
    """The app role lacks what inspection needs: each command says which command, exit 5."""
    server = start_server()
    admin = server.admin()
    create_app_user(admin)
    ids = busy_queue(admin)
    url = app_url(server)
    q = ("-q", QUEUE)
    # No `schedules list`: its SMEMBERS is in the app role since flow control (lua/lib/flow.lua).
    # doctor -q reads flow:held's TYPE first (a key of another type is a finding).
    expected = {
        ("stats",): "SCAN", ("workers",): "SCAN", ("doctor",): "SCAN", ("keys", *q): "TYPE",
        ("jobs", "show", *q, ids["dead"]): "WATCH", ("doctor", *q, "--json"): "TYPE",
    }  # fmt: skip
    for args, command in expected.items():
        result = cli(url, *args)
        where = " ".join(args)
        assert result.exit_code == 5, f"{where}: exit {result.exit_code}\n{result.output}"
        assert result.stdout == "" or args[0] == "doctor", where
        m = PERMISSION_LINE.match(result.stderr)
        assert m, f"{where}: not one permission line:\n{result.stderr}"
        assert m.group(1) == command, where
    # One permission refused inside a script the app role otherwise runs: still one line.
    admin.execute_command("ACL", "SETUSER", "sched-app", "-zrem")  # type: ignore[no-untyped-call]  # ZREM: purge_dead.lua
    result = cli(url, "dead", "purge", *q, "--yes")
    assert result.exit_code == 5 and "Traceback" not in result.output, result.output
    line = result.stderr.strip()  # the (transient) progress bar leaves a blank line before
    assert line.startswith("Error: permission denied") and "\n" not in line, line


def test_worker_is_refused_at_start_on_a_queue_its_user_cannot_touch(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    from tests.workers.procs import spawn_worker

    server = start_server()
    admin = server.admin()
    create_user(admin, "app", keys="~sched:{tenantA}:*")
    log = tmp_path / "worker.log"
    worker = spawn_worker(app_url(server), "tenantB", log=str(log))
    code = worker.wait(60)
    text = log.read_text()
    assert code == 5, text
    # --json-logs (spawn_worker's): the refusal is the last line, one JSON object.
    last = json.loads(text.strip().splitlines()[-1])
    assert last["level"] == "error", text
    assert last["msg"].startswith("permission denied") and "tenantB" in last["msg"], text
    assert "app role of docs/security.md" in last["msg"]
    assert "Traceback" not in text and "worker crashed" not in text
    # The same user works its own queue.
    Queue(admin, "tenantA").enqueue("noop", None)
    ok = spawn_worker(app_url(server), "tenantA", log=str(tmp_path / "a.log"))
    try:
        from tests.workers.procs import wait_for

        wait_for(lambda: Queue(admin, "tenantA").counts().due == 0, what="tenantA drained")
    finally:
        ok.terminate()
        ok.wait(30)


def test_app_role_tops_up_a_cron_buffer(start_server: Callable[..., Server]) -> None:
    """The claim's cron refill reads the refill set with SRANDMEMBER outside the scripts (and
    swallows errors there): the documented app role must allow it, or a cron schedule stops
    once its stored slots run out."""
    server = start_server()
    admin = server.admin()
    create_app_user(admin)
    q = Queue.from_url(app_url(server), QUEUE)
    assert q.schedule("digest", "t", {"a": 1}, cron="*/5 * * * *") == "created"
    admin.sadd(q.keys.schedules_refill, "digest")
    now_ms = q.counts().now_ms
    q._run(q.ops.refill_schedules(now_ms))  # raised NoPermissionError before +srandmember
    assert admin.scard(q.keys.schedules_refill) == 0


def test_both_roles_take_a_url_naming_a_database_and_a_client_name(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """`/db` (or `?db=`) and `?client_name=` are documented URL options: redis-py sends SELECT
    and CLIENT SETNAME on each new connection, so the documented roles must allow both, or every
    call fails under them (and the refusal names the very role the user already has)."""
    from tests.workers.procs import spawn_worker, wait_for

    server = start_server()
    admin = server.admin()
    create_app_user(admin)
    create_user(admin, "operator")
    app = f"{app_url(server)}?db=3&client_name=app-1"
    exercise(Queue.from_url(app, QUEUE))
    job = Queue.from_url(app, QUEUE).enqueue("noop", None)
    worker = spawn_worker(app, QUEUE, "--burst", log=str(tmp_path / "worker.log"))
    assert worker.wait(60) == 0, (tmp_path / "worker.log").read_text()
    ops = f"{ops_url(server)}?db=3&client_name=ops-1"
    q = ("-q", QUEUE)
    for args in (("stats", *q), ("jobs", "show", *q, job), ("doctor", *q)):
        result = cli(ops, *args)
        assert result.exit_code == 0, f"{' '.join(args)}: exit {result.exit_code}\n{result.output}"
    wait_for(lambda: Queue.from_url(app, QUEUE).status(job) == "done", what="the job done")
    assert admin.keys("sched:*") == []  # all of it in database 3
