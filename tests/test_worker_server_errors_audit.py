"""The worker against rare Redis server errors met while it runs (an audit; a private server,
reconfigured by the tests): an ACL permission removed mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from scheduler import Queue
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import dump_queue
from tests.faults.test_security import PASSWORD, documented_acl_line
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess, require_server
from tests.test_worker_hardening import capture

registry = Registry()
_gates: dict[str, asyncio.Event] = {}
_starts: list[str] = []


@registry.task(name="gate")
async def gate(payload: Any, ctx: JobContext) -> str:
    _starts.append(ctx.job_id)
    await _gates.setdefault(ctx.job_id, asyncio.Event()).wait()
    return "ok"


def app_role(admin: redis.Redis, user: str) -> None:
    """docs/security.md's app role, as `user` (its password: PASSWORD)."""
    words = documented_acl_line("app")
    admin.execute_command("ACL", "SETUSER", user, *words[3:])  # type: ignore[no-untyped-call]


def test_a_permission_removed_mid_run_that_refuses_a_complete_stops_the_worker(
    module_server: RedisProcess,
) -> None:
    """Redis 7.0 refuses a command inside a script with "ERR The user executing the script
    can't run this command" (no NOPERM code; Valkey: "ACL failure in script: ..."). Before, a
    complete refused so was taken for that one job's refusal: logged 'complete refused', its
    outcome dropped, and the worker went on claiming and running jobs whose outcomes were all
    refused (one ERROR line per batch)."""
    admin = module_server.client()
    user = "w" + uuid.uuid4().hex[:6]
    app_role(admin, user)
    q = Queue(admin, "pa-" + uuid.uuid4().hex[:8])
    job = q.enqueue("gate", None)
    log, records = capture()
    _starts.clear()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, username=user,
                              password=PASSWORD, decode_responses=True)  # fmt: skip
        w = Worker(client, registry, WorkerSettings(
            queues=(q.name,), concurrency=1, lease_ms=3000, heartbeat_ms=100, grace_s=1),
            logger=log)  # fmt: skip
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: _starts == [job], "the job started")
        # Only complete's result retention uses PEXPIRE: claims and heartbeats go on.
        admin.acl_setuser(user, enabled=True, commands=["-pexpire"])
        _gates.setdefault(job, asyncio.Event()).set()
        await poll(lambda: task.done() or any("complete refused" in m for m in records),
                   "the worker stopped or the complete refused")  # fmt: skip
        try:
            assert not any("complete refused" in m for m in records), records
            return await asyncio.wait_for(task, 30)
        finally:
            if not task.done():
                w.request_stop()
                await asyncio.wait_for(task, 30)
            await client.aclose()

    try:
        assert asyncio.run(main()) == 5  # EXIT_FORBIDDEN, as NOPERM outside a script
    finally:
        admin.acl_deluser(user)
    stop = [m for m in records if "stopping the worker (exit 5)" in m]
    # Redis 7.0: "ERR The user executing the script can't run this command"; Valkey: "ACL
    # failure in script: User ... has no permissions to run the 'pexpire' command".
    assert len(stop) == 1 and re.search(r"can't run this command|'pexpire'", stop[0]), records


# -- a server that refuses for now, or answers late, while jobs run ----------------------------
_naps: list[str] = []


@registry.task(name="nap")
async def nap(payload: Any, ctx: JobContext) -> None:
    _naps.append(ctx.job_id)
    await asyncio.sleep(payload)


def _misconf(server: RedisProcess, admin: redis.Redis) -> Callable[[], None]:
    """A failed RDB save with stop-writes-on-bgsave-error: every write refused (MISCONF)."""
    admin.config_set("save", "3600 1")
    admin.config_set("stop-writes-on-bgsave-error", "yes")
    admin.config_set("dir", "/proc")  # no file can be created there, not even by root
    with contextlib.suppress(redis.ResponseError):
        admin.bgsave()
    while admin.info("persistence")["rdb_bgsave_in_progress"]:
        time.sleep(0.01)
    assert admin.info("persistence")["rdb_last_bgsave_status"] == "err"

    def lift() -> None:
        admin.config_set("dir", server.dir)
        admin.bgsave()
        while admin.info("persistence")["rdb_last_bgsave_status"] != "ok":
            time.sleep(0.01)

    return lift


def _busy(server: RedisProcess, admin: redis.Redis) -> Callable[[], None]:
    """Another client's script that does not end: BUSY to every call until SCRIPT KILL."""
    admin.config_set("busy-reply-threshold", 50)
    other = server.client()
    spin = threading.Thread(target=_spin, args=(other,))
    spin.start()
    while not _is_busy(admin):
        time.sleep(0.01)

    def lift() -> None:
        while True:
            with contextlib.suppress(redis.ResponseError):  # NOTBUSY until it is slow enough
                server.client().script_kill()
                break
        spin.join()

    return lift


def _spin(client: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # "Script killed by user"
        client.eval("while true do end", 0)


def _is_busy(admin: redis.Redis) -> bool:
    try:
        admin.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


def _pause_writes(server: RedisProcess, admin: redis.Redis) -> Callable[[], None]:
    """CLIENT PAUSE WRITE: scripts and writes wait, unanswered, until CLIENT UNPAUSE."""
    admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")  # type: ignore[no-untyped-call]
    return lambda: admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]


CONDITIONS = {"misconf": _misconf, "busy": _busy, "client_pause_write": _pause_writes}


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_jobs_run_once_through_a_server_refusing_for_now_mid_run(condition: str) -> None:
    """The condition starts while jobs run (heartbeats and completes meet it) and lasts well
    under the lease: every job is done after one attempt, none started twice, the worker lives
    on and its warnings stay within the log limit (5 per call and error)."""
    binary = require_server("a private server this test reconfigures")
    with RedisProcess(binary, extra=["--enable-protected-configs", "yes"]) as server:
        admin = server.client()
        q = Queue(admin, "rn-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("nap", 0.3) for _ in range(12)]
        log, records = capture()
        _naps.clear()

        async def main() -> int:
            client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
            w = Worker(client, registry, WorkerSettings(
                queues=(q.name,), concurrency=4, lease_ms=60_000, heartbeat_ms=50, grace_s=5),
                logger=log)  # fmt: skip
            task = asyncio.create_task(w.run(install_signals=False))
            await poll(lambda: len(_naps) >= 2, "jobs running")
            lift = await asyncio.to_thread(CONDITIONS[condition], server, admin)
            await asyncio.sleep(1.0)  # heartbeats, completes and claims meet it
            await asyncio.to_thread(lift)
            await poll(lambda: all(q.status(j) == "done" for j in jobs), "every job done")
            assert not task.done()
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await client.aclose()
            return code

        assert asyncio.run(main()) == 0
        assert sorted(_naps) == sorted(jobs)  # each started once
        assert [q.get_job(j).attempts for j in jobs] == [1] * len(jobs)
        kinds = Counter(m.split(":")[0] for m in records if m.startswith("redis error during"))
        assert all(n <= 5 for n in kinds.values()), kinds
        if condition != "client_pause_write":  # a pause is no error: calls wait
            assert kinds, records


def test_jobs_run_once_through_a_failover_and_back_mid_run() -> None:
    """The worker's server becomes a replica of its own replica (promoted) and then the primary
    again, while jobs run: READONLY to every write meanwhile. Every job done after one attempt,
    none started twice, the worker lives on, its warnings within the log limit."""
    binary = require_server("two private servers this test fails over")
    with RedisProcess(binary, tcp=True) as a, RedisProcess(binary, tcp=True) as b:
        admin, other = a.client(), b.client()
        other.replicaof("127.0.0.1", a.port)
        q = Queue(admin, "fo-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("nap", 0.3) for _ in range(12)]
        log, records = capture()
        _naps.clear()

        def in_sync() -> bool:
            mine, its = admin.info("replication"), other.info("replication")
            return bool(
                its.get("master_link_status") == "up"
                and mine["master_repl_offset"] == its["slave_repl_offset"]
            )

        def swap(primary: redis.Redis, replica: redis.Redis, port: int) -> None:
            primary.replicaof("NO", "ONE")
            replica.replicaof("127.0.0.1", port)

        async def main() -> int:
            client = aredis.Redis(unix_socket_path=a.socket, decode_responses=True)
            w = Worker(client, registry, WorkerSettings(
                queues=(q.name,), concurrency=4, lease_ms=60_000, heartbeat_ms=50, grace_s=5),
                logger=log)  # fmt: skip
            task = asyncio.create_task(w.run(install_signals=False))
            await poll(lambda: len(_naps) >= 2, "jobs running")
            await poll(in_sync, "the replica in sync")
            await asyncio.to_thread(swap, other, admin, b.port)  # a is now b's replica
            await asyncio.sleep(1.0)
            await poll(lambda: admin.info("replication").get("master_link_status") == "up",
                       "a in sync with b")  # fmt: skip
            await asyncio.to_thread(swap, admin, other, a.port)  # and back
            await poll(lambda: all(q.status(j) == "done" for j in jobs), "every job done")
            assert not task.done()
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await client.aclose()
            return code

        assert asyncio.run(main()) == 0
        assert sorted(_naps) == sorted(jobs)
        assert [q.get_job(j).attempts for j in jobs] == [1] * len(jobs)
        # LogLimit's key is the call and the error's type: a swap can raise several types
        # (ReadOnlyError, a dropped connection) for one call, each with a burst of its own.
        kinds = Counter(
            tuple(m.split(": ")[:2]) for m in records if m.startswith("redis error during")
        )
        assert kinds and all(n <= 5 for n in kinds.values()), kinds


def test_a_claim_at_a_full_server_is_refused_even_with_a_lapsed_lease_to_reap(
    module_server: RedisProcess,
) -> None:
    """docs/durability.md, a full server: new claims are refused until there is room. Redis
    refuses only a script's first write that may grow memory; a claim with a lapsed lease to
    reap began with the reap's ZREM, so the whole claim went on: at maxmemory a worker kept
    claiming jobs whose heartbeats were refused, each run stopped at its lease end and reaped
    again, an attempt burned per lease, and a 25 s OOM parked a job dead ('lease expired')."""
    admin = module_server.client()
    q = Queue(admin, "oom-" + uuid.uuid4().hex[:8])
    job = q.enqueue("nap", 0)
    assert [j.id for j in q.claim("w1", limit=1, lease_ms=1).jobs] == [job]
    while not admin.zrange(q.keys.leased, "-inf", admin.time()[0] * 1000, byscore=True):
        time.sleep(0.001)  # its lease lapsed, not reaped yet
    before = dump_queue(admin, q)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.OutOfMemoryError):
            q.claim("w2", limit=1, lease_ms=60_000)
    finally:
        admin.config_set("maxmemory", 0)
    assert dump_queue(admin, q) == before  # nothing reaped, nothing leased
    again = q.claim("w2", limit=1, lease_ms=60_000).jobs  # room again: reaped and leased
    assert [(j.id, j.attempts) for j in again] == [(job, 2)]


def test_an_outcome_in_flight_when_writes_come_back_goes_before_the_next_claim(
    module_server: RedisProcess,
) -> None:
    """After an outage the worker sends its held outcomes before its next claim, which would
    reap their lapsed leases (Reporting._reports_first). It looked at the outcomes waiting only:
    one the reporter had already sent, still in flight (its own backoff ended first; a NOSCRIPT
    reload after BUSY made that round trip longer), was not waited for. The claim ran first,
    reaped the lease, and the outcome came back 'stale': the finished job ran again."""
    admin = module_server.client()
    q = Queue(admin, "if-" + uuid.uuid4().hex[:8])
    job = q.enqueue("gate", None)
    log, records = capture()
    _starts.clear()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        w = Worker(client, registry, WorkerSettings(
            queues=(q.name,), concurrency=1, lease_ms=500, heartbeat_ms=50, grace_s=1),
            logger=log)  # fmt: skip
        lifted, in_flight, entered = False, asyncio.Event(), asyncio.Event()
        run_by_node, reports_first = w._run_by_node, w._reports_first

        async def slow_report(*args: Any) -> Any:  # a report whose round trip is long
            if lifted and (w._sending[0] or w._sending[1]) and not in_flight.is_set():
                in_flight.set()
                await asyncio.wait_for(entered.wait(), 10)
                await asyncio.sleep(0.2)  # the claim, if sent now, runs first
            return await run_by_node(*args)

        async def claim_round_starts() -> None:  # once the report is out
            if lifted and not entered.is_set():
                await asyncio.wait_for(in_flight.wait(), 10)
                entered.set()
            await reports_first()

        w._run_by_node = slow_report  # type: ignore[method-assign, assignment]
        w._reports_first = claim_round_starts  # type: ignore[method-assign]
        task = asyncio.create_task(w.run(install_signals=False))
        await poll(lambda: _starts == [job], "the job started")
        admin.config_set("min-replicas-to-write", 1)  # every write refused (NOREPLICAS)
        try:
            _gates.setdefault(job, asyncio.Event()).set()
            await poll(lambda: w._report_failing, "the complete refused")
            lease_end_ms = float(admin.zscore(q.keys.leased, job) or 0)
            await poll(lambda: admin.time()[0] * 1000 > lease_end_ms, "the lease lapsed")
        finally:
            admin.config_set("min-replicas-to-write", 0)
        lifted = True
        await poll(lambda: q.status(job) == "done" or len(_starts) > 1, "the job settled")
        w.request_stop()
        code = await asyncio.wait_for(task, 30)
        await client.aclose()
        return code

    assert asyncio.run(main()) == 0
    assert not [m for m in records if "stale" in m], records
    assert (q.status(job), q.get_job(job).attempts, _starts) == ("done", 1, [job])
