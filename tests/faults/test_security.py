"""Least privilege and TLS: the documented ACL line (read from docs/durability.md) is enough for
the client API, and refuses admin commands, KEYS, FLUSH, and scripts that touch keys outside
`sched:*`; TLS with a self-signed CA works and a certificate from another CA is refused."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler import JobSpec, Queue, StaleToken
from tests.faults.conftest import Server, Tls, free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "durability.md"
PASSWORD = "s3cret-for-tests"
NOPERM = r"(?i)no permissions|NOPERM|can't access"
QUEUE = "acl"


def documented_acl_line() -> list[str]:
    text = DOC.read_text()
    m = re.search(r"<!-- acl:app -->\s*```\s*\n(ACL SETUSER [^\n]+)\n```", text)
    assert m, "docs/durability.md lost its ACL line"
    return m.group(1).replace(">CHANGE-ME", ">" + PASSWORD).split()


def create_app_user(admin: redis.Redis) -> None:
    words = documented_acl_line()
    assert words[:2] == ["ACL", "SETUSER"]
    assert admin.execute_command(*words) in ("OK", True, b"OK")


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
        lambda: app.execute_command("ACL", "LIST"),
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
