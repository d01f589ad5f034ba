"""Rare Redis server conditions met while a worker drains (a review): a full server lasting
longer than a lease, a server stalled (CLIENT PAUSE) longer than a lease as the first outcomes
go out, CLIENT KILL of every connection, DEBUG RELOAD, a restart onto an older snapshot, and
EVALSHA taken from the worker's ACL user. Each test starts its own private redis-server (never
the shared one) and runs an in-process Worker on it."""

from __future__ import annotations

import asyncio
import contextlib
import re
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
from tests.faults.test_security import PASSWORD, documented_acl_line
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess, require_server
from tests.test_worker_hardening import capture

registry = Registry()
STARTS: list[str] = []
GATES: dict[str, asyncio.Event] = {}


@registry.task(name="rr-gate")
async def gate(payload: Any, ctx: JobContext) -> str:
    STARTS.append(ctx.job_id)
    await GATES.setdefault(ctx.job_id, asyncio.Event()).wait()
    return "ok"


@registry.task(name="rr-nap")
async def nap(payload: Any, ctx: JobContext) -> str:
    STARTS.append(ctx.job_id)
    await asyncio.sleep(payload)
    return "ok"


def _server(*extra: str) -> RedisProcess:
    binary = require_server("a private server this test reconfigures")
    return RedisProcess(binary, extra=list(extra))


def _settings(q: Queue, **kw: Any) -> WorkerSettings:
    base: dict[str, Any] = dict(queues=(q.name,), concurrency=4, lease_ms=1500, heartbeat_ms=100,
                                grace_s=2)  # fmt: skip
    base.update(kw)
    return WorkerSettings(**base)


def _open_gates(jobs: list[str]) -> None:
    for j in jobs:
        GATES.setdefault(j, asyncio.Event()).set()


def _server_ms(admin: redis.Redis) -> float:
    s, us = admin.time()
    return s * 1000 + us / 1000


def _pause_all(admin: redis.Redis, ms: int) -> None:
    admin.execute_command("CLIENT", "PAUSE", ms, "ALL")  # type: ignore[no-untyped-call]


async def _warm(client: aredis.Redis) -> None:
    """Idle connections in the worker's pool: a claim sent in a stall goes out at once, not
    after a new connection's handshake (which the stall holds too, behind the reports)."""
    await asyncio.gather(*(client.ping() for _ in range(8)))


async def _until_server_ms(admin: redis.Redis, at_ms: float) -> None:
    """Until the server's clock (TIME answers at a full server and during CLIENT PAUSE WRITE)
    passes at_ms."""
    deadline = time.monotonic() + 30
    while _server_ms(admin) <= at_ms:
        assert time.monotonic() < deadline, "the server's clock did not move"
        await asyncio.sleep(0.02)


# -- a full server for longer than a lease -----------------------------------------------------
def test_a_job_running_through_a_full_server_longer_than_its_lease_is_not_stopped() -> None:
    """docs/durability.md, A full server: jobs already running can still be settled, a full
    server loses nothing. complete and fail start with a ZREM so Redis lets them run at the
    limit, but heartbeat starts with ZADD leased XX, which Redis refuses at maxmemory although
    it grows nothing: a full server lasting longer than one lease makes the worker stop every
    running job at its lease end ('job expired'); once there is room the claim reaps it, an
    attempt spent: a job on its last attempt is parked dead ('lease expired'), one with more
    runs again."""
    with _server() as server:
        admin = server.client()
        q = Queue(admin, "oom-" + uuid.uuid4().hex[:8])
        job = q.enqueue("rr-gate", None, max_attempts=1)
        log, records = capture()
        STARTS.clear()

        async def main() -> int:
            client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
            w = Worker(client, registry, _settings(q), logger=log)
            task = asyncio.create_task(w.run(install_signals=False))
            try:
                await poll(lambda: len(STARTS) == 1, "the job started")
                await poll(lambda: admin.zscore(q.keys.leased, job) is not None, "its lease")
                lease_end_ms = float(admin.zscore(q.keys.leased, job) or 0)
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", 1)
                try:  # full for a whole lease past the lease the job had
                    await _until_server_ms(admin, lease_end_ms + 1500)
                finally:
                    admin.config_set("maxmemory", 0)
                _open_gates([job])
                await poll(lambda: q.status(job) in ("done", "dead") or len(STARTS) > 1,
                           "the job settled")  # fmt: skip
                assert not task.done()
            finally:
                w.request_stop()
                code = await asyncio.wait_for(task, 30)
                await client.aclose()
            return code

        assert asyncio.run(main()) == 0
        assert any("OutOfMemoryError" in m for m in records), records  # the operator is told
        got = q.get_job(job)
        assert (q.status(job), got.attempts, STARTS) == ("done", 1, [job]), (
            got.dead_reason,
            [m for m in records if job in m],
        )


# -- a server stalled longer than a lease while outcomes are in flight --------------------------
@pytest.mark.parametrize("preflight", [True, False], ids=["cli", "embedded"])
def test_jobs_finished_during_a_client_pause_longer_than_the_lease_are_not_run_again(
    preflight: bool,
) -> None:
    """CLIENT PAUSE ALL (as a manual failover does) for twice the lease while four jobs finish,
    on a worker whose scripts are loaded (`scheduler worker` preflight). Each end frees a slot:
    the claim loop sends its claim at once, on its own connection, and the reporter sends the
    four completes just after. At the unpause Redis runs the postponed commands in order: the
    claim first, which reaps the four lapsed leases and hands the jobs out again; the completes
    come back 'stale' and the four finished jobs run a second time (attempts 2), though each
    ended within its lease and its worker held its outcome. Reporting._reports_first holds a
    claim behind the outcomes only while the reporter is failing, not while it is answered late
    (an embedded worker, whose run() loads no script, meets the same: the completes' NOSCRIPT
    round trip lets the claim go first). Fixed: the claim loop lets the reporter, woken with it,
    write first (Reporting._reports_first), and run() loads the scripts (Worker._preload)."""
    with _server() as server:
        admin = server.client()
        q = Queue(admin, "pz-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("rr-gate", None) for _ in range(4)]
        log, records = capture()
        STARTS.clear()

        async def main() -> int:
            client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
            w = Worker(client, registry, _settings(q), logger=log)
            if preflight:
                await w.preflight()
            task = asyncio.create_task(w.run(install_signals=False))
            try:
                await poll(lambda: sorted(STARTS) == sorted(jobs), "all four started")
                await _warm(client)
                await asyncio.to_thread(_pause_all, admin, 3000)
                _open_gates(jobs)  # they finish at once: completes and a claim go out
                await asyncio.sleep(3.2)
                await poll(lambda: all(q.status(j) == "done" for j in jobs), "every job done")
                assert not task.done()
            finally:
                w.request_stop()
                code = await asyncio.wait_for(task, 30)
                await client.aclose()
            return code

        assert asyncio.run(main()) == 0
        assert any("no answer before a lease ran out" in m for m in records), records
        assert not [m for m in records if m.startswith("job stale")], records
        assert sorted(STARTS) == sorted(jobs)
        assert [q.get_job(j).attempts for j in jobs] == [1] * 4


def test_a_job_ending_behind_a_report_answered_late_is_written_before_the_next_claim() -> None:
    """The reporter's call is in flight when the server stalls (CLIENT PAUSE ALL, twice the
    lease); a job that ends 200 ms later has its complete queued behind that call. The claim
    for its slot waits for the call's round (answered late: Reporting._REPORT_LATE_S), so the
    complete goes out before it. Sent at once, the claim ran first at the unpause and reaped
    the job's lapsed lease: its complete came back stale and it ran again. (The claim of the
    first job's slot is held meanwhile, as CLAIM_MIN_FREE holds claims while short jobs run.)"""
    with _server() as server:
        admin = server.client()
        q = Queue(admin, "lr-" + uuid.uuid4().hex[:8])
        first, second = q.enqueue("rr-gate", None), q.enqueue("rr-gate", None)
        log, records = capture()
        STARTS.clear()
        holding = [False]

        async def main() -> int:
            client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
            w = Worker(client, registry, _settings(q, concurrency=2), logger=log)
            w._hold_claim = lambda free: holding[0]  # type: ignore[method-assign]
            await w.preflight()
            task = asyncio.create_task(w.run(install_signals=False))
            try:
                await poll(lambda: sorted(STARTS) == sorted([first, second]), "both started")
                holding[0] = True
                await _warm(client)
                await asyncio.to_thread(_pause_all, admin, 3000)
                _open_gates([first])  # its complete goes out and waits for the unpause
                await poll(lambda: bool(w._sending[0]), "the first complete in flight")
                await asyncio.sleep(0.2)  # answered late
                holding[0] = False
                _open_gates([second])  # queued behind the first; its end wakes the claim loop
                await asyncio.sleep(3.0)
                await poll(lambda: q.status(first) == q.status(second) == "done", "both done")
                assert not task.done()
            finally:
                w.request_stop()
                code = await asyncio.wait_for(task, 30)
                await client.aclose()
            return code

        assert asyncio.run(main()) == 0
        assert not [m for m in records if m.startswith("job stale")], records
        assert sorted(STARTS) == sorted([first, second])
        assert [q.get_job(j).attempts for j in (first, second)] == [1, 1]


# -- connections killed, the dataset reloaded ----------------------------------------------------
def _drain(
    server: RedisProcess,
    q: Queue,
    jobs: list[str],
    during: Callable[[redis.Redis], None],
    log: Any,
) -> int:
    """A worker drains `jobs` (naps) while `during(admin)` runs in a thread; it returns once
    every job is done."""
    admin = server.client()

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=server.socket, decode_responses=True)
        w = Worker(client, registry, _settings(q), logger=log)
        await w.preflight()
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: len(STARTS) >= 2, "jobs running")
            await asyncio.to_thread(during, admin)
            await poll(lambda: all(q.status(j) == "done" for j in jobs), "every job done")
            assert not task.done()
        finally:
            w.request_stop()
            code = await asyncio.wait_for(task, 30)
            await client.aclose()
        return code

    return asyncio.run(main())


def test_client_kill_type_normal_repeatedly_mid_drain_loses_and_repeats_nothing() -> None:
    """Every 30 ms for 2 s an operator kills every normal connection (the worker's claims,
    reports, heartbeats and wake-up pops among them): redis-py reconnects and re-sends, the
    scripts replay by nonce and token. Every job done once, the worker alive, exit 0."""
    with _server() as server:
        admin = server.client()
        q = Queue(admin, "ck-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("rr-nap", 0.1) for _ in range(40)]
        log, records = capture()
        STARTS.clear()
        kills: list[int] = []

        def kill_all(admin: redis.Redis) -> None:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                with contextlib.suppress(redis.ConnectionError):
                    n = admin.execute_command(  # type: ignore[no-untyped-call]
                        "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
                    )
                    kills.append(int(n))
                time.sleep(0.03)

        assert _drain(server, q, jobs, kill_all, log) == 0
        assert sum(kills) > 0
        assert sorted(STARTS) == sorted(jobs), Counter(STARTS).most_common(3)
        assert [q.get_job(j).attempts for j in jobs] == [1] * len(jobs)
        assert not [m for m in records if re.match(r"job (stale|expired)", m)], records


def test_debug_reload_mid_drain_loses_and_repeats_nothing() -> None:
    """DEBUG RELOAD (save, empty and load the dataset: the server blocked meanwhile) five times
    while the worker drains: every job done once, the worker alive."""
    with _server("--enable-debug-command", "yes") as server:
        admin = server.client()
        q = Queue(admin, "dr-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("rr-nap", 0.1) for _ in range(30)]
        log, records = capture()
        STARTS.clear()

        def reload(admin: redis.Redis) -> None:
            for _ in range(5):
                admin.execute_command("DEBUG", "RELOAD")  # type: ignore[no-untyped-call]
                time.sleep(0.1)

        assert _drain(server, q, jobs, reload, log) == 0
        assert sorted(STARTS) == sorted(jobs)
        assert [q.get_job(j).attempts for j in jobs] == [1] * len(jobs)
        assert not [m for m in records if re.match(r"job (stale|expired)", m)], records


def test_a_restart_onto_an_older_snapshot_loses_no_acknowledged_job() -> None:
    """docs/durability.md, Snapshots: a crash loses what was accepted since the last snapshot.
    The server is killed and comes back with an RDB taken before some acknowledged completions:
    those jobs are leased or due again and run a second time (at least once); none is lost,
    a job done at the snapshot does not run again, no job runs a third time, and the worker
    rides through the restart."""
    with _server() as server:
        admin = server.client()
        q = Queue(admin, "rdb-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("rr-nap", 0.2) for _ in range(32)]
        log, records = capture()
        STARTS.clear()
        done_at_snapshot: list[str] = []
        done_after: list[str] = []

        def restore_older(admin: redis.Redis) -> None:
            deadline = time.monotonic() + 20
            while sum(q.status(j) == "done" for j in jobs) < 6:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            admin.save()
            done_at_snapshot.extend(j for j in jobs if q.status(j) == "done")
            while sum(q.status(j) == "done" for j in jobs) < len(done_at_snapshot) + 8:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            done_after.extend(j for j in jobs if q.status(j) == "done")
            server.restart(hard=True)  # loads the snapshot

        assert _drain(server, q, jobs, restore_older, log) == 0
        runs = Counter(STARTS)
        assert set(runs) == set(jobs)  # every acknowledged job ran; all are done
        assert all(runs[j] == 1 for j in done_at_snapshot)
        assert max(runs.values()) <= 2
        assert not [m for m in records if "stopping the worker" in m], records
        redone = [j for j in done_after if j not in done_at_snapshot]
        assert redone and all(runs[j] == 2 for j in redone)  # their completions were lost


# -- the worker's ACL user loses EVALSHA mid-run --------------------------------------------------
def test_evalsha_removed_from_the_acl_user_mid_run_stops_the_worker_with_one_line() -> None:
    """ACL SETUSER <user> -evalsha while jobs run: the worker stops with exit 5 (a supervisor
    does not restart into the same refusal) and one line naming the command; the jobs it held
    stay leased (their leases lapse, nothing lost) and the others stay due."""
    with _server() as server:
        admin = server.client()
        user = "w" + uuid.uuid4().hex[:6]
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", user, *documented_acl_line("app")[3:]
        )
        q = Queue(admin, "acl-" + uuid.uuid4().hex[:8])
        jobs = [q.enqueue("rr-gate", None) for _ in range(3)]
        log, records = capture()
        STARTS.clear()

        async def main() -> int:
            client = aredis.Redis(unix_socket_path=server.socket, username=user,
                                  password=PASSWORD, decode_responses=True)  # fmt: skip
            w = Worker(client, registry, _settings(q, concurrency=2), logger=log)
            task = asyncio.create_task(w.run(install_signals=False))
            try:
                await poll(lambda: len(STARTS) == 2, "two jobs started")
                admin.acl_setuser(user, enabled=True, commands=["-evalsha"])
                return await asyncio.wait_for(task, 30)
            finally:
                _open_gates(jobs)
                if not task.done():
                    w.request_stop()
                    await asyncio.wait_for(task, 30)
                await client.aclose()

        assert asyncio.run(main()) == 5
        stop = [m for m in records if "stopping the worker (exit 5)" in m]
        assert len(stop) == 1 and "'evalsha'" in stop[0], records
        states = Counter(str(q.status(j)) for j in jobs)
        assert states == Counter({"leased": 2, "due": 1}), states
