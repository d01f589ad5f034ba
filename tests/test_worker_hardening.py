"""Worker hardening (issue 10): shutdown, the one script driver, Redis errors of every class,
a full server, one job's bad data, abandoned threads, clean JSON logs, claim replay, lease math.
One private redis-server for the whole file: some tests reconfigure it (maxmemory)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from scheduler import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.models import ClaimBatch, JobSpec
from scheduler.core.scripts import Batch, Scripts, source
from scheduler.operations.ops import Commands, Script, ScriptPipeline
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.execution import classify
from scheduler.worker.registry import Registry
from tests.conftest import new_queue
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess, require_binary
from tests.workers import hardening
from tests.workers.hardening import LEDGER, Live, gate_key
from tests.workers.procs import spawn_worker, stop_all, wait_for

REG = "tests.workers.hardening:registry"


@pytest.fixture
def admin(module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    monkeypatch.setenv("TEST_REDIS_URL", module_server.url)
    hardening._client = None
    c = redis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
    yield c
    c.config_set("maxmemory", 0)
    c.close()


def starts(admin: redis.Redis, q: Queue) -> list[str]:
    return [e.split("|")[0] for e in admin.lrange(f"{LEDGER}:{q.name}", 0, -1)]


def capture() -> tuple[logging.Logger, list[str]]:
    """A private logger whose messages land in a list (caplog misses a logger that an earlier
    logs.setup() stopped from propagating)."""
    records: list[str] = []
    log = logging.getLogger("scheduler.test." + uuid.uuid4().hex[:8])
    log.propagate = False
    log.setLevel(logging.INFO)

    class ToList(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    log.handlers[:] = [ToList()]
    return log, records


def full_server(admin: redis.Redis) -> None:
    """maxmemory below what is used, policy noeviction: every denyoom write is refused."""
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)


# -- item 1: graceful stop --------------------------------------------------------------------
def test_sigterm_while_jobs_finish_in_grace_exits_clean_50_times(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    grace_s = 1.0
    runs, parallel = 50, 5
    for _ in range(runs // parallel):
        batch = []
        for _ in range(parallel):
            q = new_queue(admin, "h-")
            ids = [q.enqueue("nap", {"s": 0.15}) for _ in range(3)]
            w = spawn_worker(module_server.url, q.name, "--grace", str(grace_s),
                             "--heartbeat-ms", "50", "--lease-ms", "3000", "--concurrency", "4",
                             registry=REG)  # fmt: skip
            batch.append((q, ids, w))
        try:
            for q, _, w in batch:
                wait_for(lambda q=q: len(starts(admin, q)) == 3, what="all started")
                w.send_signal(signal.SIGTERM)  # the jobs finish during the grace period
            for q, ids, w in batch:
                # A liveness bound, not a timing goal (those are in bench/): a hang fails it;
                # under a loaded CI (load ~15) an exit took longer than grace + 3 s.
                code = w.wait(30)
                assert code == EXIT_OK, f"exit {code}"
                assert [q.status(i) for i in ids] == ["done"] * 3
                assert admin.zcard(q.keys.leased) == 0
        finally:
            stop_all([w for _, _, w in batch])


class HangFirstComplete(aredis.Redis):
    """The first complete never reaches the server and hangs for a while, swallowing every
    cancellation (what redis-py was seen doing inside a command), then fails."""

    complete_sha = hashlib.sha1(source("complete").encode()).hexdigest()
    hang_left = 1
    hang_s = 2.0
    hang_ended = False

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[:2] == ("EVALSHA", self.complete_sha) and self.hang_left > 0:
            self.hang_left -= 1
            loop = asyncio.get_running_loop()
            end = loop.time() + self.hang_s
            while loop.time() < end:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(end - loop.time())
            self.hang_ended = True
            raise RedisConnectionError("the hung call gave up")
        return await super().execute_command(*args, **options)


def test_shutdown_resends_a_report_whose_call_swallows_cancellation(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    job = q.enqueue("gate", None)

    async def main() -> tuple[int, bool]:
        client = HangFirstComplete(unix_socket_path=module_server.socket, decode_responses=True)
        settings = WorkerSettings(queues=(q.name,), lease_ms=30_000, heartbeat_ms=1000, grace_s=0)
        w = Worker(client, hardening.registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: len(starts(admin, q)) == 1, what="started")
        admin.set(gate_key(job), 1)
        await poll(lambda: client.hang_left == 0, what="the complete in flight")
        w.request_stop()
        code = await asyncio.wait_for(task, 15)
        ended_before_exit = client.hang_ended
        await client.aclose()
        return code, ended_before_exit

    code, ended_before_exit = asyncio.run(main())
    assert code == EXIT_OK
    assert not ended_before_exit  # run() did not wait for the hung call
    assert q.status(job) == "done"  # its outcome was sent again by the shutdown flush


# -- item 3: one driver, NOSCRIPT handled once ---------------------------------------------------
def test_driver_reloads_and_resends_only_what_got_noscript() -> None:
    scripts = Scripts()
    keys = ["k1", "k2"]
    d = scripts.drive([
        (keys, Script("counts", [])),
        (keys, ScriptPipeline([Script("release", ["a"]), Script("cancel", ["b"])], wait=(1, 10))),
        (keys, Commands([("GET", "x")])),
    ])  # fmt: skip
    first = next(d)
    assert first.loads == [] and [c[0] for c in first.cmds] == ["EVALSHA"] * 3 + ["WAIT", "GET"]
    nos = NoScriptError("No matching script")
    again = d.send(["c", "r", nos, 0, "x"])
    # cancel did not run: load it, send it again, and the WAIT after it
    assert again == Batch([scripts._text[scripts.sha["cancel"]]], [first.cmds[2], first.cmds[3]])
    with pytest.raises(StopIteration) as done:
        d.send(["ok", 1])
    assert done.value.value == ["c", ["r", "ok", 1], ["x"]]


def test_driver_sends_the_text_when_a_flush_races_its_load_too() -> None:
    """A second NOSCRIPT (a flush between the load and the resend): EVAL with the script's
    text, which cannot answer NOSCRIPT, so a busy flusher cannot win every round."""
    scripts = Scripts()
    d = scripts.drive([(["k1"], ScriptPipeline([Script("release", ["a"])], wait=(1, 10)))])
    first = next(d)
    text = scripts._text[scripts.sha["release"]]
    nos = NoScriptError("No matching script")
    again = d.send([nos, 0])
    assert again.loads == [text] and again.cmds == first.cmds
    third = d.send([nos, 0])
    assert third.loads == [] and third.cmds == [("EVAL", text, *first.cmds[0][2:]), first.cmds[1]]
    with pytest.raises(StopIteration) as done:
        d.send(["ok", 1])
    assert done.value.value == [["ok", 1]]


def test_script_flush_between_claim_and_report_loses_no_outcome(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    ok = q.enqueue("gate", None, max_attempts=1)
    bad = q.enqueue("gate_fail", None, max_attempts=1)
    w = spawn_worker(module_server.url, q.name, registry=REG)
    try:
        wait_for(lambda: len(starts(admin, q)) == 2, what="both started")
        admin.script_flush()
        admin.set(gate_key(ok), 1)
        admin.set(gate_key(bad), 1)  # a complete and a fail in one pipelined report
        wait_for(lambda: q.status(ok) == "done" and q.status(bad) == "dead", what="outcomes")
    finally:
        stop_all([w])
    j = q.get_job(bad)
    assert (j.attempts, j.fields["last_error_type"]) == (1, "RuntimeError")
    assert q.get_job(ok).attempts == 1


_REPORT_SHAS = {hashlib.sha1(source(n).encode()).hexdigest() for n in ("complete", "fail")}


class FlushBeforeReport(aredis.Redis):
    """SCRIPT FLUSH right before a complete or fail is sent (plain call or pipeline): the race
    a restart or an operator's flush can hit after any pre-check of the script cache."""

    flushes_left = 0
    admin: redis.Redis

    def _maybe_flush(self, cmds: list[tuple[Any, ...]]) -> None:
        if self.flushes_left > 0 and any(
            c[:1] == ("EVALSHA",) and c[1] in _REPORT_SHAS for c in cmds
        ):
            self.flushes_left -= 1
            self.admin.script_flush()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self._maybe_flush([args])
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        outer = self

        class Pipe(aredis.client.Pipeline):  # type: ignore[misc]
            async def _execute_pipeline(
                self, connection: Any, commands: Any, raise_on_error: bool
            ) -> Any:
                outer._maybe_flush([tuple(c[0]) for c in commands])
                return await super()._execute_pipeline(connection, commands, raise_on_error)

        return Pipe(self.connection_pool, self.response_callbacks, transaction, shard_hint)


def test_noscript_on_a_worker_report_is_reloaded_not_dropped(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    ok = q.enqueue("gate", None, max_attempts=1)
    bad = q.enqueue("gate_fail", None, max_attempts=1)

    async def main() -> int:
        client = FlushBeforeReport(unix_socket_path=module_server.socket, decode_responses=True)
        client.admin = admin
        settings = WorkerSettings(queues=(q.name,), lease_ms=3000, heartbeat_ms=1000, grace_s=1)
        w = Worker(client, hardening.registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: len(starts(admin, q)) == 2, what="both started")
        client.flushes_left = 3
        admin.set(gate_key(ok), 1)
        admin.set(gate_key(bad), 1)
        await poll(lambda: q.status(ok) == "done" and q.status(bad) == "dead", what="outcomes")
        assert client.flushes_left < 3  # the race was hit
        w.request_stop()
        code = await task
        await client.aclose()
        return code

    assert asyncio.run(main()) == EXIT_OK
    j = q.get_job(bad)  # its fail was recorded, not lost to NOSCRIPT and reaped later
    assert (j.attempts, j.fields["last_error_type"]) == (1, "RuntimeError")
    assert q.get_job(ok).attempts == 1


# -- items 4 and 5: every RedisError class; a full server ----------------------------------------
def test_classify_every_redis_error_class() -> None:
    from redis import exceptions as e

    transient = [e.ConnectionError(), e.TimeoutError(), e.BusyLoadingError(), OSError(),
                 e.OutOfMemoryError("x"), e.ReadOnlyError("x"), e.NoScriptError("x"),
                 e.TryAgainError("x"), e.ClusterDownError("x"), e.MasterDownError("x"),
                 e.ResponseError("BUSY Redis is busy running a script"),
                 e.ResponseError("MISCONF Errors writing to disk")]  # fmt: skip
    fatal = [e.AuthenticationError(), e.AuthorizationError(), e.NoPermissionError("x"),
             e.DataError(), e.InvalidResponse()]  # fmt: skip
    assert [classify(x) for x in transient] == ["transient"] * len(transient)
    assert [classify(x) for x in fatal] == ["fatal"] * len(fatal)
    assert classify(e.ResponseError("ERR unknown command")) == "refused"


def test_heartbeats_resume_after_the_server_was_full(
    module_server: RedisProcess, admin: redis.Redis, tmp_path: Path
) -> None:
    q = new_queue(admin, "h-")
    job = q.enqueue("nap", {"s": 4})
    log = tmp_path / "w.log"
    w = spawn_worker(module_server.url, q.name, "--lease-ms", "1500", "--heartbeat-ms", "100",
                     registry=REG, log=str(log))  # fmt: skip
    try:
        wait_for(lambda: len(starts(admin, q)) == 1, what="started")
        full_server(admin)
        wait_for(lambda: "OutOfMemoryError" in log.read_text(), what="a refused heartbeat")
        admin.config_set("maxmemory", 0)
        before = admin.zscore(q.keys.leased, job)
        assert before is not None
        wait_for(lambda: (admin.zscore(q.keys.leased, job) or 0) > before, what="heartbeat")
        assert w.poll() is None
        assert Queue(admin, q.name).claim("other", limit=10).jobs == []  # still held
        wait_for(lambda: q.status(job) == "done", what="done")
    finally:
        stop_all([w])
    assert q.get_job(job).attempts == 1


def test_full_server_at_start_and_claim_keeps_the_worker_alive(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    job = q.enqueue("nap", {"s": 0.01})
    log, records = capture()

    async def main() -> tuple[int, float, float]:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(q.name,), lease_ms=3000, heartbeat_ms=100, grace_s=1), logger=log)  # fmt: skip
        full_server(admin)  # start-up presence beat and claim's HINCRBY fence are refused
        task = asyncio.create_task(w.run(install_signals=False))
        claim_oom = w.metrics.redis_backoffs.labels("claim", "OutOfMemoryError")
        beat_oom = w.metrics.redis_backoffs.labels("presence", "OutOfMemoryError")
        await poll(lambda: claim_oom._value.get() >= 2, what="claims backing off")
        assert not task.done()
        admin.config_set("maxmemory", 0)
        await poll(lambda: q.status(job) == "done", what="job done once memory is back")
        w.request_stop()
        code = await task
        await client.aclose()
        return code, claim_oom._value.get(), beat_oom._value.get()

    code, claims, beats = asyncio.run(main())
    assert code == EXIT_OK
    assert claims >= 2 and beats >= 1
    assert any("redis error during claim: OutOfMemoryError" in m for m in records)


def test_a_full_server_still_settles_the_jobs_held(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    job = q.enqueue("gate", None)

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(q.name,), lease_ms=3000, heartbeat_ms=100, grace_s=1))  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: len(starts(admin, q)) == 1, what="started")
        admin.set(gate_key(job), 1)
        full_server(admin)  # the complete arrives at a full server: its ZREM goes first
        await poll(lambda: q.status(job) == "done", what="done while full")
        assert not task.done()
        admin.config_set("maxmemory", 0)
        w.request_stop()
        code = await task
        await client.aclose()
        return code

    assert asyncio.run(main()) == EXIT_OK


def test_a_loop_that_dies_stops_the_worker(module_server: RedisProcess, admin: redis.Redis) -> None:
    q = new_queue(admin, "h-")

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(q.name,), lease_ms=3000, heartbeat_ms=50, grace_s=1))  # fmt: skip

        async def broken() -> None:
            raise RuntimeError("a bug")

        w._heartbeat = broken  # type: ignore[method-assign]
        code = await asyncio.wait_for(w.run(install_signals=False), 10)
        await client.aclose()
        return code

    assert asyncio.run(main()) == 1  # EXIT_ERROR, not a worker running on without heartbeats


def test_permission_error_stops_with_a_clear_code(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    user = "w" + uuid.uuid4().hex[:6]
    # may PING and load scripts, but not run them
    allowed = ["+ping", "+script", "+hello", "+client", "+blpop", "+config"]
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=allowed)

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, username=user, password="pw",
                              decode_responses=True)  # fmt: skip
        w = Worker(client, hardening.registry, WorkerSettings(
            queues=(q.name,), lease_ms=3000, heartbeat_ms=50, grace_s=1))  # fmt: skip
        code = await asyncio.wait_for(w.run(install_signals=False), 10)
        await client.aclose()
        return code

    try:
        assert asyncio.run(main()) == 5  # EXIT_REDIS_REFUSED
    finally:
        admin.acl_deluser(user)


# -- item 6 (worker side): one job's data never takes the worker down -----------------------------
def test_a_job_that_cannot_start_is_parked_alone(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    unreadable = q.enqueue("nap", None)
    (held,) = q.claim("someone", limit=1).jobs  # stands for a job the client could not parse
    assert held.id == unreadable
    good = q.enqueue("nap", {"s": 0.01})
    broken = q.enqueue("nap2", {"s": 0.01})
    reg = Registry()
    reg._tasks = dict(hardening.registry._tasks)
    # a spec whose timeout cannot be used: starting the job raises inside the worker
    reg._tasks["nap2"] = dataclasses.replace(reg._tasks["nap"], name="nap2",
                                             timeout_s="soon")  # type: ignore[arg-type]  # fmt: skip
    log, records = capture()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        settings = WorkerSettings(queues=(q.name,), lease_ms=3000, heartbeat_ms=100, grace_s=1)
        w = Worker(client, reg, settings, logger=log)
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: w._loop is not None, what="running")
        # what helper B's ClaimBatch.unreadable carries: fail it non-retryably
        batch = ClaimBatch(0, -1, [], [(held.id, held.token, "timeout_ms=30s")])
        w._take(q.name, batch, time.monotonic())
        await poll(lambda: q.counts().dead == 2 and q.status(good) == "done", what="outcomes")
        assert not task.done()
        w.request_stop()
        code = await task
        await client.aclose()
        return code

    assert asyncio.run(main()) == EXIT_OK
    for i in (unreadable, broken):
        j = q.get_job(i)
        assert (j.state, j.fields["last_error_type"]) == ("dead", "InvalidJob")
        assert j.dead_reason == "non-retryable error"
    assert "timeout_ms=30s" in q.get_job(unreadable).fields["last_error"]
    assert any("could not start this job" in m for m in records)


# -- item 7: abandoned sync threads ----------------------------------------------------------------
def test_abandoned_threads_are_capped_and_a_job_never_runs_twice_at_once(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    for _ in range(4):
        q.enqueue("stubborn", {"s": 0.5}, max_attempts=100, backoff=Backoff(10, 1.0, 10, 0.0))
    Live.reset()
    settings = WorkerSettings(queues=(q.name,), concurrency=2, lease_ms=3000, heartbeat_ms=100,
                              grace_s=0)  # fmt: skip
    cap = settings.abandoned_cap
    assert cap == 4
    log, records = capture()
    log.setLevel(logging.WARNING)  # an operator's level: the pause and its end both show

    async def main() -> float:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, hardening.registry, settings, logger=log)
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: Live.starts >= 14, timeout_s=30, what="many attempts")
        paused = w.metrics.claim_paused.labels("abandoned_threads")._value.get()
        w.request_stop()
        assert await task == EXIT_OK
        await client.aclose()
        return float(paused)

    asyncio.run(main())
    assert Live.peak <= settings.concurrency + cap, Live.peak
    assert Live.overlaps == [], f"jobs run twice at once: {Live.overlaps}"
    assert any("abandoned handlers still running" in m for m in records)
    assert any("claiming again" in m for m in records)  # at WARNING, as the pause


# -- item 10: clean JSON logs through a connection reset -----------------------------------------
def test_json_logs_stay_json_through_connection_resets(admin: redis.Redis, tmp_path: Path) -> None:
    """CLIENT KILL of the worker's connections, then a server restart while it heartbeats (its
    pipelines fail past redis-py's retries): every stderr line must still be one JSON object."""
    own = RedisProcess(require_binary("redis-server", "restarts its own server"))
    own.start()
    c = redis.Redis(unix_socket_path=own.socket, decode_responses=True)
    q = new_queue(c, "h-")
    log = tmp_path / "w.log"
    w = spawn_worker(own.url, q.name, "--heartbeat-ms", "10", "--lease-ms", "3000",
                     "--grace", "0", registry=REG, log=str(log))  # fmt: skip
    try:
        wait_for(lambda: c.zcard(q.keys.workers) == 1, what="worker up")
        for _ in range(10):
            q.enqueue_many([JobSpec("noop", None) for _ in range(50)])
            c.client_kill_filter(_type="normal", skipme=True)
            time.sleep(0.05)  # let it reconnect and hit the next reset mid-work
        q.enqueue("nap", {"s": 30})  # held across the restarts: heartbeats keep trying
        wait_for(lambda: c.zcard(q.keys.leased) == 1, what="nap leased")
        for _ in range(4):  # a restart racing a pipeline in flight is what leaked it
            seen = log.read_text().count("redis error during")
            own.kill()
            # The worker's errors, up to 1 s: after the first restart its repeated lines may be
            # held back (log_limit.py: 5 a minute per loop), while its 10 ms heartbeat fails.
            deadline = time.monotonic() + 1.0
            while log.read_text().count("redis error during") <= seen:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            own.start()
            c = redis.Redis(unix_socket_path=own.socket, decode_responses=True)
            wait_for(lambda c=c: c.zcard(q.keys.workers) == 1, what="presence back")
        w.send_signal(signal.SIGTERM)
        assert w.wait(10) == EXIT_OK
    finally:
        stop_all([w])
        own.cleanup()
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    bad = [ln for ln in lines if not _is_json(ln)]
    assert bad == [], bad[:5]
    assert not [ln for ln in lines if "Unclosed" in ln]  # nothing leaked, not just reformatted
    assert any("redis error" in json.loads(ln).get("msg", "") for ln in lines)


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


# -- also seen: claim replay by nonce, lease from send time, lapsed-but-unreaped -----------------
class LoseFirstClaimReply(aredis.Redis):
    """Runs the first claim for real, then drops its reply (a connection error after the fact).
    Also records when each claim was sent and holds its reply back a little."""

    claim_sha = Scripts().sha["claim"]
    lose = 1
    sent: ClassVar[list[float]] = []

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[:2] == ("EVALSHA", self.claim_sha):
            self.sent.append(time.monotonic())
            reply = await super().execute_command(*args, **options)
            if self.lose > 0:
                self.lose -= 1
                raise RedisConnectionError("reply lost")
            await asyncio.sleep(0.2)
            return reply
        return await super().execute_command(*args, **options)


def test_claim_retry_reuses_the_nonce_and_lease_counts_from_send(
    module_server: RedisProcess, admin: redis.Redis
) -> None:
    q = new_queue(admin, "h-")
    job = q.enqueue("gate", None)
    lease_s = 3.0

    async def main() -> tuple[int, float, float]:
        client = LoseFirstClaimReply(unix_socket_path=module_server.socket, decode_responses=True)
        client.sent = []
        settings = WorkerSettings(queues=(q.name,), lease_ms=int(lease_s * 1000),
                                  heartbeat_ms=1000, grace_s=1)  # fmt: skip
        w = Worker(client, hardening.registry, settings)
        # The deadline as the claim set it: a re-sent claim's jobs get a heartbeat at once
        # (04a1b08), which may extend it before the test reads _held.
        set_at_claim: list[float] = []
        real_start = w._start

        def start(queue: str, job: Any, *args: Any, **kwargs: Any) -> None:
            real_start(queue, job, *args, **kwargs)
            set_at_claim.append(w._held[(queue, job.id)].lease_deadline_s)

        w._start = start  # type: ignore[method-assign]
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: bool(set_at_claim), what="job held")
        deadline, first_sent = set_at_claim[0], client.sent[0]
        admin.set(gate_key(job), 1)
        await poll(lambda: q.status(job) == "done", what="done")
        w.request_stop()
        code = await task
        await client.aclose()
        return code, deadline, first_sent

    code, deadline, first_sent = asyncio.run(main())
    assert code == EXIT_OK
    assert q.get_job(job).attempts == 1  # the replay returned the first call's lease
    # the local view of the lease ends before the server's, counted from the first send
    assert deadline <= first_sent + lease_s


def test_lapsed_but_unreaped_lease_refuses_heartbeat_accepts_complete(
    tq: tuple[Queue, Any],
) -> None:
    q, clock = tq
    job = q.enqueue("t", None)
    (c,) = q.claim("w", limit=1, lease_ms=1000).jobs
    clock.set_ms(5_000)  # lapsed; nobody claimed (reaped) it since
    _, statuses = q.heartbeat([(c.id, c.token)], lease_ms=1000)
    assert statuses[c.id] == "expired"
    q.complete(c.id, c.token, "late")  # the token still fences: the work is accepted
    assert q.status(job) == "done"
