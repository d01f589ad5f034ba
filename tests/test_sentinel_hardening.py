"""Three gaps of the Redis Sentinel support, closed on real private servers
(tests/sentinel_servers.py: master + replica + sentinel):

1. TLS through Sentinel. docs/cluster.md and docs/security.md say `rediss+sentinel://` is TLS to
   the master with the CA as `?ssl_ca_certs=`; nothing tested it. Now a queue enqueues and a
   `scheduler worker` runs a job where the master and its replica speak TLS only, through a
   plain sentinel and (new: `?sentinel_ssl=1`, the same ssl_* options) a TLS one; a certificate
   from another CA is refused on either hop; TLS to the sentinels but not to the master is a
   BadArgument.
2. A wrong (or missing) sentinel password was "No master found", a ConnectionError: exit 3,
   and a worker retried it as if the network were down. Now it is SentinelRefused, an
   AuthenticationError naming the sentinel: exit 5 from the CLI and from `scheduler worker`
   at once, a running worker stops, the dashboard says "Redis refused the login"; as a wrong
   master password given through the URL.
3. min-replicas-to-write with the replica gone (NOREPLICAS): an enqueue raises NoReplicas
   (typed, nothing written, no id), `scheduler worker` refuses to start with exit 3 naming it,
   and a running worker backs off (log names NOREPLICAS) and finishes every job once, none
   parked, when the replica is back.

A redis-server without TLS support skips the TLS tests locally and fails them under CI=true."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.exceptions import AuthenticationError, ResponseError
from redis.sentinel import MasterNotFoundError, SentinelManagedSSLConnection
from starlette.testclient import TestClient

from scheduler import AsyncQueue, BadArgument, JobNotFound, JobSpec, NoReplicas, Queue
from scheduler.cli.main import main
from scheduler.core.connection import connect, connect_async, parse_url
from scheduler.core.errors import refused_for_now
from scheduler.core.models import JobState
from scheduler.core.sentinel import SentinelRefused
from scheduler.dashboard import Auth, create_app
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.execution import classify
from scheduler.worker.registry import JobContext, Registry
from tests.faults.conftest import Tls, make_tls
from tests.redis_server import _missing, free_port, require_binary
from tests.sentinel_servers import SentinelSet, TlsRedisProcess
from tests.workers.procs import spawn_worker, stop_all, wait_for


def _binary() -> str:
    return require_binary("redis-server", "a master + replica + sentinel")


def _name() -> str:
    return "hard-" + uuid.uuid4().hex[:8]


def _worker_start(url: str, queue: str) -> subprocess.CompletedProcess[str]:
    """`scheduler worker` started on `url`: it must end by itself, quickly."""
    return subprocess.run([sys.executable, "-m", "scheduler", "worker",
                           "tests.workers.basic:registry", "--url", url, "-q", queue],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


# -- 1. TLS through Sentinel --------------------------------------------------------------------


def test_sentinel_tls_urls_are_read_and_refused() -> None:
    """`sentinel_ssl=1`: the sentinels' connections get ssl and the URL's ssl_* options (the
    same CA); without it they stay plain TCP. TLS to the sentinels only is refused."""
    ca = str(Path(__file__).parent / "fixtures" / "tls-ca.pem")  # must be there, a PEM
    both = connect(f"rediss+sentinel://a:1/svc?ssl_ca_certs={ca}&sentinel_ssl=1&socket_timeout=3")
    master_only = connect(f"rediss+sentinel://a:1/svc?ssl_ca_certs={ca}&socket_timeout=3")
    try:
        for client, tls in ((both, True), (master_only, False)):
            pool: Any = client.connection_pool
            assert issubclass(pool.connection_class, SentinelManagedSSLConnection)
            assert pool.connection_kwargs["ssl_ca_certs"] == ca
            (sentinel,) = pool.sentinel_manager.sentinels
            skw = sentinel.connection_pool.connection_kwargs
            kind = sentinel.connection_pool.connection_class.__name__
            assert (kind == "SSLConnection") is tls, kind
            assert (skw.get("ssl_ca_certs") == ca) is tls and skw["socket_timeout"] == 3.0
    finally:
        both.close()
        master_only.close()
    aclient = connect_async(f"rediss+sentinel://a:1/svc?ssl_ca_certs={ca}&sentinel_ssl=1")
    try:
        apool: Any = aclient.connection_pool
        (asentinel,) = apool.sentinel_manager.sentinels
        assert asentinel.connection_pool.connection_class.__name__ == "SSLConnection"
        assert asentinel.connection_pool.connection_kwargs["ssl_ca_certs"] == ca
    finally:
        asyncio.run(aclient.aclose())
    target = parse_url("rediss+sentinel://a:1/svc?sentinel_ssl=0")
    assert target.sentinel is not None and target.sentinel.sentinel_options == {
        "sentinel_ssl": False
    }
    for url, why in [
        ("redis+sentinel://a:1/svc?sentinel_ssl=1", "needs rediss+sentinel://"),
        ("rediss+sentinel://a:1/svc?sentinel_ssl=maybe", "expected 1 or 0"),
        ("rediss+sentinel://a:1/svc?sentinel_tls=1", "did you mean 'sentinel_ssl'"),
    ]:
        with pytest.raises(BadArgument, match="invalid Redis URL") as err:
            connect(url)
        assert why in str(err.value), (url, err.value)
    got = CliRunner().invoke(main, ["stats", "--url", "redis+sentinel://a:1/svc?sentinel_ssl=1"])
    assert got.exit_code == 2 and "needs rediss+sentinel://" in got.output


@pytest.fixture(scope="module")
def tls_certs() -> Iterator[Tls]:
    require_binary("openssl", "the TLS tests make their certificates with it")
    d = tempfile.mkdtemp(prefix="shtls")
    try:
        yield make_tls(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _require_tls(binary: str, tls: Tls) -> None:
    """The server must serve TLS (Debian's redis-server is built with it): a missing capability
    is said, and fails under CI=true, never passed over in silence."""
    probe = TlsRedisProcess(binary, tcp=True, tls=tls)
    try:
        probe.start()
    except RuntimeError:
        with open(probe.log, errors="replace") as f:
            tail = " | ".join(f.read().splitlines()[-3:])
        _missing(f"{binary} cannot serve TLS (--tls-port): {tail}")
    finally:
        probe.cleanup()


@pytest.fixture(scope="module")
def tls_set(tls_certs: Tls) -> Iterator[SentinelSet]:
    binary = _binary()
    _require_tls(binary, tls_certs)
    s = SentinelSet(binary, tls=tls_certs).start()
    try:
        yield s
    finally:
        s.cleanup()


def _run_one_job(url: str) -> None:
    """Enqueue through `url`, a `scheduler worker` on the same URL runs it (its handler's own
    connection too), the result is read back."""
    queue = _name()
    with Queue.from_url(url, queue) as q:
        job_id = q.enqueue("echo", {"tls": True})
        worker = spawn_worker(url, queue)
        try:
            wait_for(lambda: q.status(job_id) == JobState.DONE, 20, "the job done over TLS")
            assert q.result(job_id, timeout_s=1) == {"tls": True}
            assert worker.poll() is None
            worker.terminate()
            assert worker.wait(20) == 0
        finally:
            stop_all([worker])


@pytest.mark.parametrize("sentinel_tls", [False, True], ids=["plain-sentinel", "tls-sentinel"])
def test_a_job_through_sentinels_to_a_tls_master(
    tls_set: SentinelSet, tls_certs: Tls, sentinel_tls: bool
) -> None:
    """The master and its replica listen on TLS only; the CA is given as docs/security.md says.
    The sentinel is reached over plain TCP, or over TLS with `sentinel_ssl=1`."""
    url = tls_set.tls_url(tls_certs.ca, sentinel_tls=sentinel_tls)
    with Queue.from_url(url, _name()) as q:
        job_id = q.enqueue("t", {"n": 1})
        assert q.status(job_id) == JobState.DUE
        conn = q.client.connection_pool.get_connection()
        try:  # the master the sentinel named, over TLS
            assert isinstance(conn, SentinelManagedSSLConnection)
            assert conn.port == tls_set.master_port()
        finally:
            q.client.connection_pool.release(conn)

    async def via_asyncio() -> None:
        aq = AsyncQueue.from_url(url, _name())
        try:
            job_id = await aq.enqueue("t", None)
            (job,) = (await aq.claim("w-1", limit=1)).jobs
            assert job.id == job_id
            await aq.complete(job.id, job.token, 7)
            assert await aq.status(job_id) == JobState.DONE
        finally:
            await aq.aclose()

    asyncio.run(via_asyncio())
    _run_one_job(url)


def test_a_certificate_from_another_ca_is_refused_on_either_hop(
    tls_set: SentinelSet, tls_certs: Tls
) -> None:
    """The CA is checked on the master (sentinel plain) and on the sentinel (`sentinel_ssl`,
    reached by a name its certificate holds: localhost): a wrong one is a connection failure
    (the CLI: exit 3), never a plaintext or an unverified connection. A plain client on the
    sentinel's TLS port fails too (no master found), rather than hang."""
    for sentinel_tls in (False, True):
        good = tls_set.tls_url(tls_certs.ca, sentinel_tls=sentinel_tls, host="localhost")
        with Queue.from_url(good, _name()) as q:
            q.enqueue("t")
        wrong = good.replace(tls_certs.ca, tls_certs.other_ca)
        with Queue.from_url(wrong, _name()) as q, pytest.raises(redis.ConnectionError) as err:
            q.enqueue("t")
        assert "certificate verify failed" in str(err.value), err.value
        if sentinel_tls:  # no sentinel answered: the lookup failed, transient to a worker
            assert isinstance(err.value, MasterNotFoundError)
        assert not isinstance(err.value, AuthenticationError)
        got = CliRunner().invoke(main, ["stats", "--url", wrong])
        # The master's certificate refused: a setting (exit 2); no sentinel answered: exit 3.
        assert got.exit_code == (3 if sentinel_tls else 2), got.output
    plain = tls_set.tls_url(tls_certs.ca, sentinel_tls=True).replace("&sentinel_ssl=1", "")
    with (
        Queue.from_url(plain + "&socket_timeout=2", _name()) as q,
        pytest.raises(MasterNotFoundError),
    ):
        q.enqueue("t")


# -- 2. A wrong sentinel password ---------------------------------------------------------------

M_PW, S_PW = "m-Secret-1", "s-Secret-2"


@pytest.fixture(scope="module")
def pw_set() -> Iterator[SentinelSet]:
    s = SentinelSet(_binary(), password=M_PW, sentinel_password=S_PW).start()
    try:
        yield s
    finally:
        s.cleanup()


def _urls(s: SentinelSet) -> dict[str, str]:
    good = s.url(query=f"?sentinel_password={S_PW}").replace("://", f"://:{M_PW}@")
    return {
        "good": good,
        "no sentinel password": s.url().replace("://", f"://:{M_PW}@"),
        "wrong sentinel password": good.replace(f"={S_PW}", "=WRONG-spw"),
        "wrong master password": good.replace(f":{M_PW}@", ":WRONG-mpw@"),
    }


def _no_secret(text: str) -> None:
    for secret in (M_PW, S_PW, "WRONG-spw", "WRONG-mpw"):
        assert secret not in text, secret


def test_a_refused_sentinel_password_is_exit_5_naming_the_sentinel(pw_set: SentinelSet) -> None:
    urls = _urls(pw_set)
    queue = _name()
    runner = CliRunner()
    ok = runner.invoke(main, ["enqueue", "t", "-q", queue, "--url", urls["good"]])
    assert ok.exit_code == 0, ok.output
    where = f"127.0.0.1:{pw_set.sentinel.port}"
    for case in ("no sentinel password", "wrong sentinel password"):
        for args in (["stats", "-q", queue], ["enqueue", "t", "-q", queue]):
            got = runner.invoke(main, [*args, "--url", urls[case]])
            assert got.exit_code == 5, (case, args, got.output)
            assert "the sentinel refused the sentinel credentials" in got.stderr, got.stderr
            assert where in got.stderr and "sentinel_password" in got.stderr, got.stderr
            _no_secret(got.output)
    missing = runner.invoke(main, ["stats", "--url", urls["no sentinel password"]])
    assert "requires a password, and the URL gives no sentinel_password" in missing.stderr
    got = runner.invoke(main, ["stats", "--url", urls["wrong master password"]])
    assert got.exit_code == 5 and "refused the credentials" in got.stderr, got.output
    assert "sentinel" not in got.stderr.split(";")[0]  # the master's refusal, not a sentinel's
    _no_secret(got.output)
    with Queue.from_url(urls["good"], queue) as q:
        assert q.counts().due == 1  # only the good enqueue wrote
    app = create_app(url=urls["wrong sentinel password"], auth=Auth())
    with TestClient(app, raise_server_exceptions=False) as web:
        page = web.get("/")
        assert page.status_code == 500 and "Redis refused the login" in page.text
        assert "the sentinel refused" in page.text and "sentinel_password" in page.text
        _no_secret(page.text)


@pytest.mark.parametrize("case", ["wrong sentinel password", "wrong master password"])
def test_worker_start_exits_5_at_once(pw_set: SentinelSet, case: str) -> None:
    # "At once": it exits by itself (5) instead of retrying the connection as for an
    # unreachable server; _worker_start's 30 s timeout is the liveness bound (no timed
    # assertion: a loaded CI took 18 s to start and refuse).
    done = _worker_start(_urls(pw_set)[case], _name())
    assert done.returncode == 5, done.stderr
    assert "refused the credentials" in done.stderr, done.stderr
    if case == "wrong sentinel password":
        assert "the sentinel refused the sentinel credentials" in done.stderr, done.stderr
        assert f"127.0.0.1:{pw_set.sentinel.port}" in done.stderr
    _no_secret(done.stderr)


def test_the_refusal_is_typed_and_fatal_to_a_running_worker(pw_set: SentinelSet) -> None:
    """Queue and AsyncQueue raise SentinelRefused: an AuthenticationError (classify: fatal) and
    still a MasterNotFoundError (blocking and asyncio). A Worker on it stops with exit 5 at its
    first call instead of backing off forever."""
    wrong = _urls(pw_set)["wrong sentinel password"]
    with Queue.from_url(wrong, _name()) as q, pytest.raises(SentinelRefused) as err:
        q.enqueue("t")
    assert isinstance(err.value, AuthenticationError | MasterNotFoundError)
    assert classify(err.value) == "fatal"
    _no_secret(str(err.value))

    async def run_worker() -> int:
        aq = AsyncQueue.from_url(wrong, _name())
        try:
            with pytest.raises(AsyncMasterNotFoundError) as aerr:
                await aq.enqueue("t")
            assert isinstance(aerr.value, SentinelRefused)
        finally:
            await aq.aclose()
        client = connect_async(wrong)
        settings = WorkerSettings(queues=(_name(),), heartbeat_ms=200)
        try:
            worker = Worker(client, Registry(), settings)
            return await asyncio.wait_for(worker.run(install_signals=False), 15)
        finally:
            await client.aclose()

    assert asyncio.run(run_worker()) == 5


def test_a_sentinel_user_without_the_sentinel_command_is_exit_5(pw_set: SentinelSet) -> None:
    """A sentinel ACL user that logs in but may not run SENTINEL: no retry helps either."""
    with pw_set.sentinel_client() as admin:
        admin.execute_command("ACL", "SETUSER", "mon", "on", ">mon-pw", "-@all", "+ping", "+hello",
                              "+auth")  # fmt: skip
    url = _urls(pw_set)["good"].replace(f"={S_PW}", "=mon-pw&sentinel_username=mon")
    got = CliRunner().invoke(main, ["stats", "--url", url])
    assert got.exit_code == 5, got.output
    assert "refused the sentinel user" in got.stderr and "'sentinel|masters'" in got.stderr
    _no_secret(got.output)
    assert "mon-pw" not in got.output


def test_an_unreachable_sentinel_beside_a_refusing_one_stays_transient(
    pw_set: SentinelSet,
) -> None:
    """Only every sentinel refusing is for good: while one does not answer (it may answer, with
    the right password, once back), the lookup stays MasterNotFoundError (exit 3, retried)."""
    wrong = _urls(pw_set)["wrong sentinel password"]
    dead = f"127.0.0.1:{free_port()}"
    mixed = wrong.replace("@127.0.0.1:", f"@{dead},127.0.0.1:")
    url = mixed + "&socket_connect_timeout=1"
    with Queue.from_url(url, _name()) as q, pytest.raises(MasterNotFoundError) as err:
        q.enqueue("t")
    assert not isinstance(err.value, SentinelRefused) and classify(err.value) == "transient"
    assert "AuthenticationError" in str(err.value)  # the refusal is still named
    got = CliRunner().invoke(main, ["stats", "--url", mixed])
    assert got.exit_code == 3, got.output


# -- 3. min-replicas-to-write -------------------------------------------------------------------

# Writes need a good replica; a killed replica is gone at once (its socket closes).
_MIN_REPLICAS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


@pytest.fixture(scope="module")
def guarded() -> Iterator[SentinelSet]:
    s = SentinelSet(_binary(), extra=_MIN_REPLICAS).start()
    try:
        yield s
    finally:
        s.cleanup()


def _replica_gone(s: SentinelSet) -> None:
    master = s.master_port()
    replica = next(r for r in s.servers[:2] if r.port != master)
    replica.kill()
    with s.server_client(master) as m:
        wait_for(lambda: m.info("replication")["connected_slaves"] == 0, 10, "replica gone")


def _replica_back(s: SentinelSet) -> None:
    master = s.master_port()
    replica = next(r for r in s.servers[:2] if r.port != master)
    if not replica.running:
        replica.start()
    with s.server_client(master) as m:

        def good() -> bool:
            info = m.info("replication")
            return bool(info.get("slave0", {}).get("state") == "online")

        wait_for(good, 10, "replica online")


@pytest.fixture
def no_replica(guarded: SentinelSet) -> Iterator[SentinelSet]:
    _replica_gone(guarded)
    try:
        yield guarded
    finally:
        _replica_back(guarded)


def test_an_enqueue_without_replicas_is_refused_typed_with_nothing_written(
    no_replica: SentinelSet,
) -> None:
    s, queue = no_replica, _name()
    with s.server_client(s.master_port()) as m:
        before = sorted(m.keys("*"))
    with Queue.from_url(s.url(), queue) as q:
        with pytest.raises(NoReplicas) as err:
            q.enqueue("t", {"a": 1}, job_id="given-id")
        assert isinstance(err.value, ResponseError) and refused_for_now(err.value)
        assert str(err.value).startswith("NOREPLICAS") and "min-replicas-to-write" in str(err.value)
        with pytest.raises(NoReplicas):
            q.enqueue_many([JobSpec("t", {"n": i}) for i in range(3)])
        with pytest.raises(JobNotFound):
            q.status("given-id")

    async def via_asyncio() -> None:
        aq = AsyncQueue.from_url(s.url(), queue)
        try:
            with pytest.raises(NoReplicas):
                await aq.enqueue("t")
        finally:
            await aq.aclose()

    asyncio.run(via_asyncio())
    got = CliRunner().invoke(main, ["enqueue", "t", "-q", queue, "--url", s.url()])
    assert got.exit_code == 3, got.output
    assert "Redis refused the command for now: NOREPLICAS" in got.stderr
    with s.server_client(s.master_port()) as m:
        assert sorted(m.keys("*")) == before  # nothing written
    # A worker's start is refused for now (exit 3: a supervisor starts it again), named.
    done = _worker_start(s.url(), queue)
    assert done.returncode == 3, done.stderr
    assert "refused the start for now: NOREPLICAS" in done.stderr, done.stderr
    assert "cannot reach" not in done.stderr


registry = Registry()
runs: Counter[str] = Counter()
ended: Counter[str] = Counter()
gate = threading.Event()  # the runs end once it is set


@registry.task("hard.job")
async def hard_job(payload: Any, ctx: JobContext) -> str:
    runs[ctx.job_id] += 1
    while not gate.is_set():
        await asyncio.sleep(0.01)
    ended[ctx.job_id] += 1
    return "ok"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_worker_rides_through_noreplicas_without_losing_or_rerunning(
    guarded: SentinelSet,
) -> None:
    """Jobs running when the replica goes: their completions, heartbeats and the next claims
    are refused (NOREPLICAS) while it is gone; the worker logs it, backs off, keeps running, and
    once the replica is back every job is done, each run once, none dead."""
    s, queue = guarded, _name()
    log = logging.getLogger(f"test.hardening.{queue}")
    log.propagate, lines = False, _Lines()
    log.addHandler(lines)
    q = Queue.from_url(s.url(), queue)
    first = q.enqueue_many([JobSpec("hard.job", {"n": i}) for i in range(12)])
    loop = asyncio.new_event_loop()
    client = connect_async(s.url(), socket_timeout=5, socket_connect_timeout=2)
    settings = WorkerSettings(queues=(queue,), concurrency=3, lease_ms=8000, heartbeat_ms=500)
    worker = Worker(client, registry, settings, logger=log)
    task: asyncio.Future[int] | None = None

    def serve() -> None:
        nonlocal task
        task = asyncio.ensure_future(worker.run(install_signals=False), loop=loop)
        loop.run_until_complete(task)

    thread = threading.Thread(target=serve, daemon=True)
    # The runs wait at a gate until the replica is gone and refused a call (their heartbeats),
    # then end, their outcomes held; the test waits for them (30 s liveness bounds). Before:
    # 0.3 s runs and a fixed 1 s, so a stall (a loaded machine) could see every job run before
    # the replica went ('some jobs were still waiting' failed) or the runs not yet ended.
    runs.clear()
    ended.clear()
    gate.clear()
    try:
        thread.start()
        wait_for(lambda: sum(runs[j] for j in first) >= 2, 30, "jobs running")
        _replica_gone(s)
        wait_for(lambda: any("NOREPLICAS" in line for line in lines.lines), 30, "the refusal")
        started = sum(runs.values())
        gate.set()

        def over() -> bool:  # or the worker is gone: its assertion below says so
            return sum(ended.values()) >= started or not thread.is_alive()

        wait_for(over, 30, "the runs to end")
        assert q.counts().due > 0, "some jobs were still waiting when the replica went"
        with pytest.raises(NoReplicas):
            q.enqueue("hard.job")
        _replica_back(s)
        later = [q.enqueue("hard.job", {"after": i}) for i in range(2)]
        every = first + later
        wait_for(lambda: all(q.status(j) == JobState.DONE for j in every), 30, "every job done")
        assert {j: runs[j] for j in every} == dict.fromkeys(every, 1)  # none run twice
        counts = q.counts()
        assert (counts.due, counts.leased, counts.dead) == (0, 0, 0)
        assert thread.is_alive() and task is not None and not task.done()
        refused = [line for line in lines.lines if "NOREPLICAS" in line]
        assert all("backing off, retrying" in line for line in refused), refused
        assert any("min-replicas-to-write" in line for line in refused), refused
    finally:
        gate.set()
        _replica_back(s)
        if thread.is_alive():
            loop.call_soon_threadsafe(worker.request_stop)
            thread.join(20)
        loop.run_until_complete(client.aclose())
        loop.close()
        q.close()
    assert not thread.is_alive() and task is not None and task.result() == 0
