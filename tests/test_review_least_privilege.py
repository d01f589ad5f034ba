"""Review: least privilege and secrets (docs/security.md "The two ACL roles", "Per-tenant
users", "TLS", "Credentials in output").

The documented users are made on private servers with the helpers of tests/faults (the ACL lines
read from docs/security.md). The per-tenant user is made as the doc's recipe says: the app line
with `~sched:*` replaced by the tenant's selectors, read from the "Per-tenant users" note, so a
fix of the recipe there (a selector added) reaches these tests. Tests marked xfail are defects;
the others guard paths no other test takes (a running worker through a restart and a password
rotation, TLS host name checks, the tenant's schedule and flow calls)."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import Result
from starlette.testclient import TestClient

from scheduler import AsyncQueue, JobSpec, PartitionedQueue, Queue, Registry, open_queue
from scheduler.client.chain import chain
from scheduler.core.connection import connect, connect_async
from scheduler.dashboard import Auth, create_app
from scheduler.worker import Worker, WorkerSettings
from tests.faults import conftest as faults
from tests.faults.conftest import Server, Tls, free_port
from tests.faults.test_security import (
    DOC,
    PASSWORD,
    cli,
    create_user,
    documented_acl_line,
    ops_url,
)
from tests.workers.procs import wait_for

ROOT = Path(__file__).resolve().parents[1]
# tests/faults' fixtures, reused as they are: a private server factory, and TLS certificates.
redis_binary, start_server, tls_certs = faults.redis_binary, faults.start_server, faults.tls_certs


def tenant_selectors(tenant: str) -> list[str]:
    """The key selectors docs/security.md's per-tenant recipe gives a tenant's user: every
    backticked ACL key selector (`~...`, `%W~...`) of its "Per-tenant users" note but the
    `~sched:*` it replaces, `tenantA` read as `tenant`."""
    text = DOC.read_text()
    start = text.index("Per-tenant users")
    note = re.split(r"\n\s*\n|\n- ", text[start:], maxsplit=1)[0]
    found = re.findall(r"`((?:%[RW]{1,2})?~[^`\s]+)`", note)
    selectors = [s.replace("tenantA", tenant) for s in found if s != "~sched:*"]
    assert selectors, "docs/security.md lost its per-tenant selector"
    return selectors


def tenant_url(server: Server, tenant: str) -> str:
    """The documented app line (user sched-app) made one tenant's; the URL of that user."""
    words = [w for w in documented_acl_line("app") if w != "~sched:*"] + tenant_selectors(tenant)
    assert server.admin().execute_command(*words) in ("OK", True, b"OK")  # type: ignore[no-untyped-call]
    return f"unix://sched-app:{PASSWORD}@{server.socket}"


def last_line(result: Result) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    return lines[-1] if lines else ""


# -- the per-tenant user: keys outside its queue's hash tag -----------------------------------


def test_a_tenant_queue_is_listed_by_the_operators_stats_and_doctor(
    start_server: Callable[..., Server],
) -> None:
    """docs/security.md: a per-tenant user's SADD on `sched:queues` "is refused and ignored,
    nothing else is". But `stats`, `doctor`, `workers` and the dashboard list the queues from
    that index once a listing scanned the keyspace (admin/inspection.py discover_queues), so
    a queue only its tenant writes to is never listed: `scheduler doctor` says "checked 1
    queue(s) ... 0 findings" with the tenant's queue never checked, `workers stop <id>` says
    'no live worker'. The index needs no read by a tenant: Redis 7's `%W~sched:queues` lets
    it SADD without SMEMBERS (it would not learn the other tenants' names)."""
    server = start_server()
    admin = server.admin()
    create_user(admin, "operator")
    Queue(admin, "other").enqueue("t", None)
    assert cli(ops_url(server), "stats").exit_code == 0  # the first listing fills the index
    tenant = Queue.from_url(tenant_url(server, "tenantA"), "tenantA")
    tenant.enqueue("t", None)
    tenant.schedule("nightly", "t", None, cron="0 3 * * *")
    stats = cli(ops_url(server), "stats", "--json")
    assert stats.exit_code == 0, stats.output
    listed = [row["queue"] for row in json.loads(stats.stdout)["queues"]]
    doctor = cli(ops_url(server), "doctor", "--json")
    checked = json.loads(doctor.stdout)["queues"]
    assert "tenantA" in listed and "tenantA" in checked, (listed, checked)


def test_the_documented_per_tenant_user_works_its_partitioned_queue(
    start_server: Callable[..., Server],
) -> None:
    """ "Replace `~sched:*` with `~sched:{tenantA}:*` and the user works queue `tenantA`": for
    a partitioned queue `tenantA` its partitions are the queues `tenantA.p0`, `tenantA.p1.2`
    (core/partitions.py), each under its own hash tag, so every enqueue is refused with
    redis-py's bare 'no permissions to access one of the keys' (naming neither key nor queue).
    A selector such as `~sched:{tenantA.p[0-9]*}:*` covers them (checked by hand: create,
    enqueue, claim and `scheduler worker` all work with it)."""
    server = start_server()
    admin = server.admin()
    PartitionedQueue.create(admin, "tenantA", partitions=2)
    client = connect(tenant_url(server, "tenantA"))
    q = open_queue(client, "tenantA")
    ids = q.enqueue_many([JobSpec("t", {"n": i}) for i in range(4)])
    batch = q.claim("w1", limit=10)
    assert sorted(j.id for j in batch.jobs) == sorted(ids)
    assert q.counts().leased == 4


def test_the_documented_per_tenant_user_runs_schedules_and_flow_on_its_queue(
    start_server: Callable[..., Server],
) -> None:
    """Guard: every client call of a tenant's own plain queue stays under its hash tag
    (schedules and their cron refill, flow control, chains, pause, reschedule, progress,
    result waits): tests/faults only ran the basic calls under a tenant user."""
    server = start_server()
    q = Queue.from_url(tenant_url(server, "tenantA"), "tenantA")
    assert q.schedule("cr", "t", None, cron="*/5 * * * *", tz="Europe/Paris") == "created"
    assert q.schedule("ev", "t", None, every_ms=60_000) == "created"
    assert (q.pause_schedule("cr"), q.resume_schedule("cr")) == ("paused", "resumed")
    run = q.run_schedule_now("ev")
    flow = q.enqueue("t", None, priority=3, concurrency_key="k", concurrency_limit=1,
                     rate_limit="5/s")  # fmt: skip
    parent, child = chain(q, [("a", 1), ("b", 2)])
    later = q.enqueue("t", None, delay_ms=600_000, key="once", debounce=True)
    assert q.reschedule(later, delay_ms=900_000) == "rescheduled"
    assert (q.pause(), q.resume()) == ("paused", "resumed")
    q.set_dead_retention(max_count=100)
    jobs = {j.id: j for j in q.claim("w1", limit=10).jobs}
    assert {run, flow, parent} <= set(jobs) and child not in jobs
    assert q.set_progress(flow, jobs[flow].token, {"p": 1}) == "held"
    assert (
        q.complete_many([(i, jobs[i].token, {"ok": i}) for i in (run, flow, parent)])
        == ["done"] * 3
    )
    assert q.result(parent, timeout_s=1) == {"ok": parent}
    assert child in {j.id for j in q.claim("w1", limit=10).jobs}
    assert q.remove_schedule("cr") == "removed"


# -- refusals: one clear line, in a few round trips -------------------------------------------


def test_a_refused_key_pattern_names_the_queue_it_refused(
    start_server: Callable[..., Server],
) -> None:
    """A tenant's user pointed at another tenant's queue: the worker says "may not use the keys
    of queue 'tenantB' (sched:{tenantB}:*)" (admin/startup.py check_access_async); the CLI and
    the dashboard said "may not use the keys (this user has no permissions to access one of
    the keys used as arguments); connect as a user with the operator role" (admin/startup.py
    permission_message without `where`), to a user that may already hold the operator role:
    the key pattern is what is missing, and the queue is the one clue."""
    server = start_server()
    admin = server.admin()
    job = Queue(admin, "tenantB").enqueue("t", None)
    url = tenant_url(server, "tenantA")
    create_user(admin, "operator", keys=tenant_selectors("tenantA")[0])
    for args in (("enqueue", "t", "-q", "tenantB"), ("stats", "-q", "tenantB")):
        result = cli(url, *args)
        assert result.exit_code == 5, result.output
        line = last_line(result)
        assert line.startswith("Error: permission denied") and "tenantB" in line, line
    dash = create_app(url=ops_url(server), queues=["tenantB"], auth=Auth())
    with TestClient(dash, raise_server_exceptions=False) as web:
        page = web.get(f"/queues/tenantB/jobs/{job}")
        said = re.search(r"permission denied: [^<]*", html.unescape(page.text))
        assert page.status_code == 500 and said, page.text
        assert "tenantB" in said.group(0), said.group(0)


def test_concurrent_enqueues_refused_by_the_acl_answer_in_a_few_round_trips(
    start_server: Callable[..., Server],
) -> None:
    """200 concurrent `AsyncQueue.enqueue` calls on a queue the user's key pattern leaves out:
    Redis refuses the batch's script call as a whole (NOPERM on its first key), so every job
    of it is refused alike, as for NOREPLICAS or OOM, which the batcher sends again once, a
    call per job in one pipeline. A NoPermissionError is none of refused_for_now's, so the
    batch is halved, one half after the other: ~400 refused calls in sequence (each logged in
    the server's ACL LOG), the last caller answered after all of them."""
    server = start_server()
    url = tenant_url(server, "tenantA")
    trips: list[int] = []

    async def main() -> list[Any]:
        aq = AsyncQueue.from_url(url, "tenantB")
        real, real_each = aq._batcher._send, aq._batcher._send_each
        assert real_each is not None

        async def send(args: list[str]) -> Any:
            trips.append(int(args[0]))
            return await real(args)

        async def send_each(calls: list[list[str]]) -> list[Any]:
            trips.append(len(calls))
            return await real_each(calls)

        aq._batcher._send, aq._batcher._send_each = send, send_each
        try:
            got = await asyncio.gather(
                *(aq.enqueue("t", {"n": i}) for i in range(200)), return_exceptions=True
            )
            return list(got)
        finally:
            await aq.aclose()

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert {type(g) for g in got} == {redis.exceptions.NoPermissionError}
    assert len(trips) <= 8, f"{len(trips)} round trips: {trips[:12]}..."


# -- TLS ----------------------------------------------------------------------------------------


@pytest.fixture
def tls_port(start_server: Callable[..., Server], tls_certs: Tls) -> int:
    port = free_port()
    server = start_server(*tls_certs.server_args(port))
    create_user(server.admin(), "operator")
    create_user(server.admin(), "app")
    return port


def test_tls_checks_the_host_name_in_both_clients(
    tls_port: int,
    tls_certs: Tls,
) -> None:
    """Guard: docs/security.md says redis-py checks that the host name matches the certificate
    (`ssl_check_hostname`); redis.asyncio did not by default in older versions, and the worker
    and AsyncQueue use it. The certificate names localhost and 127.0.0.1: 127.0.0.2 (the same
    server) is refused by both clients, localhost taken."""
    base = f"rediss://sched-app:{PASSWORD}@{{host}}:{tls_port}/0?ssl_ca_certs={tls_certs.ca}"

    async def enqueue(url: str) -> str:
        aq = AsyncQueue.from_url(url + "&socket_timeout=5", "tls")
        try:
            return await aq.enqueue("t", None)
        finally:
            await aq.aclose()

    wrong = base.format(host="127.0.0.2")
    with pytest.raises(redis.ConnectionError, match=r"(?i)mismatch"):
        Queue.from_url(wrong + "&socket_timeout=5", "tls").enqueue("t", None)
    with pytest.raises(redis.ConnectionError, match=r"(?i)mismatch"):
        asyncio.run(enqueue(wrong))
    assert asyncio.run(enqueue(base.format(host="localhost")))


def test_a_certificate_that_fails_verification_is_not_a_try_again(
    tls_port: int,
    tls_certs: Tls,
) -> None:
    """Expectation (docs/cluster.md "TLS" states exit 3 for the Sentinel hop): exit 3 is "cannot
    reach Redis, or it refuses for now: try again". A certificate from another CA, or one that
    does not name the host, fails the same way at every try until the URL or the server's
    certificate changes, as a wrong password does (exit 5: "retrying cannot help",
    cli/common.py) and a TLS file that is not there (exit 2, tests/test_tls_files.py). The
    line should say the certificate was refused, not that Redis cannot be reached."""
    for url in (
        f"rediss://sched-ops:{PASSWORD}@localhost:{tls_port}/0?ssl_ca_certs={tls_certs.other_ca}",
        f"rediss://sched-ops:{PASSWORD}@127.0.0.2:{tls_port}/0?ssl_ca_certs={tls_certs.ca}",
    ):
        result = cli(url, "stats")
        assert "CERTIFICATE_VERIFY_FAILED" in result.output, result.output
        assert result.exit_code in (2, 5), f"exit {result.exit_code}: {result.output}"
        assert "cannot reach Redis" not in result.output, result.output


# -- secrets ------------------------------------------------------------------------------------

LEAKED = "Hq-TOPSECRET-42"  # a password of another service, quoted by a handler's error


def test_a_handler_error_quoting_a_url_password_is_shown_redacted(
    start_server: Callable[..., Server],
) -> None:
    """docs/security.md "Credentials in output": `redact` hides a URL's password "in every
    message the package prints", the worker's log lines with a job's error included (its
    `job dead` line says `error=cannot reach rediss://app:***@db.internal...`). The same text
    is stored raw in the job (worker/failures.py failure_of: error_text and the traceback,
    unredacted) and printed by `scheduler jobs show`, `dead list` (cli: clean(), not safe())
    and the dashboard's job and dead-letter pages: a password the log hid on purpose is on a
    page every dashboard user can read."""
    server = start_server()
    admin = server.admin()
    q = Queue(admin, "leaky")
    # The handler's own settings hold the password (not the payload, which is the app's data,
    # shown as stored): its error quotes the URL it could not reach.
    job = q.enqueue("leak", {"host": "db.internal"}, max_attempts=1)
    registry = Registry()

    @registry.task("leak")
    async def leak(payload: Any, ctx: Any) -> None:
        raise ConnectionError(f"cannot reach rediss://app:{LEAKED}@{payload['host']}:6380/0")

    async def run() -> None:
        client = connect_async(server.url)
        settings = WorkerSettings(queues=("leaky",), burst=True, grace_s=0)
        try:
            await Worker(client, registry, settings).run(install_signals=False)
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(run(), 30))
    assert q.status(job) == "dead"
    shown = {
        " ".join(args): cli(server.url, *args).output
        for args in (
            ("jobs", "show", "-q", "leaky", job),
            ("jobs", "show", "-q", "leaky", job, "--json"),
            ("dead", "list", "-q", "leaky", "--json"),
        )
    }
    web = TestClient(create_app(client=admin, auth=Auth()), raise_server_exceptions=False)
    with web:
        for path in (f"/queues/leaky/jobs/{job}", "/queues/leaky/dead"):
            shown[path] = html.unescape(web.get(path).text)
    assert "cannot reach" in shown[f"/queues/leaky/jobs/{job}"]  # the error is on the page
    leaks = [where for where, text in shown.items() if LEAKED in text]
    assert leaks == [], f"the password is shown by {leaks}"


def test_a_running_worker_never_shows_its_password_through_a_restart_and_a_rotation(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Guard: tests/test_operator_security.py checks a worker that cannot connect at start;
    this one runs, loses its server (the reconnect warnings), gets it back, then has its
    password rotated (exit 5). Its URL, given as REDIS_URL, is in no log line, not in its
    command line (`ps`), not in its metrics, nor in its presence record in Redis."""
    secret = "Wk-TOPSECRET-77"
    server = start_server("--requirepass", secret, tcp=True)
    admin = redis.Redis(unix_socket_path=server.socket, password=secret, decode_responses=True)
    q = Queue(admin, "sec")
    q.enqueue("noop", None)
    url = f"redis://default:{secret}@127.0.0.1:{server.port}/0"
    log, port = tmp_path / "worker.log", free_port()
    env = dict(os.environ, REDIS_URL=url, TEST_REDIS_URL=url, PYTHONPATH=str(ROOT))
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
             "-q", "sec", "--metrics-port", str(port)],
            env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: q.counts().due == 0 and admin.zcard(q.keys.workers) == 1, 30,
                 "the job run and the worker listed")  # fmt: skip
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        (wid,) = admin.zrange(q.keys.workers, 0, -1)
        presence = json.dumps(admin.hgetall(q.keys.worker(str(wid))))  # a str already (decoded)
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().decode(errors="replace")
        server.kill()
        wait_for(lambda: "redis error during" in log.read_text(), 30, "a reconnect warning")
        server.start()
        admin = redis.Redis(unix_socket_path=server.socket, password=secret, decode_responses=True)
        q = Queue(admin, "sec")
        q.enqueue("noop", None)
        wait_for(lambda: q.counts().due == 0, 30, "a job run after the restart")
        admin.config_set("requirepass", "rotated-" + secret)
        admin.client_kill_filter(_type="normal", skipme=True)
        assert worker.wait(30) == 5
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    text = log.read_text()
    assert "redis error during" in text and "refused" in text, text
    for where, found in (("log", text), ("metrics", metrics.decode()), ("presence", presence),
                         ("cmdline", cmdline)):  # fmt: skip
        assert secret not in found, f"the password is in the worker's {where}"
