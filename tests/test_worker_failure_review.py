"""End-to-end review of "crash-safe" and "contained failure" with real `scheduler worker`
processes (and a pool), not only the client API: handlers that kill their own process,
hang past their timeout, workers stopped by SIGTERM while jobs run, undecodable payloads and
unknown tasks in a batch, and the private Redis server killed and restarted under a running
worker. Each test checks that every acknowledged job ends done or dead with a sensible reason,
that innocent jobs are not parked, that nothing runs before its run time and that the worker
exits with the documented code.

The handlers live here (the worker imports `tests.test_worker_failure_review:registry`); they
write a ledger (`frv:ledger:<queue>`, one `id|attempt|event|pid|server ms` entry per event)
on the worker's own server, read by the tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler import JobSpec, Queue
from scheduler._spawn import RedisProcess
from scheduler.core.connection import connect, connect_async
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import Clock
from tests.redis_server import require_server
from tests.workers.procs import spawn_worker, stop_all, wait_for

REG = "tests.test_worker_failure_review:registry"
LEDGER = "frv:ledger:"
FAST = "frv:fast:"  # set: the long handlers end at once (a second worker finishes them)

registry = Registry()
_client: redis.Redis | None = None


def _r() -> redis.Redis:
    global _client
    if _client is None:
        _client = connect(os.environ["TEST_REDIS_URL"])
    return _client


def _mark(ctx: JobContext, what: str) -> None:
    sec, usec = _r().time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    _r().rpush(LEDGER + ctx.queue, f"{ctx.job_id}|{ctx.attempt}|{what}|{os.getpid()}|{now_ms}")


@registry.task(name="frv-ok")
async def ok(payload: Any, ctx: JobContext) -> int:
    _mark(ctx, "start")
    await asyncio.sleep(float((payload or {}).get("s", 0.3)))
    _mark(ctx, "end")
    return ctx.attempt


@registry.task(name="frv-kill")
async def kill(payload: Any, ctx: JobContext) -> None:
    _mark(ctx, "start")
    await asyncio.sleep(float(payload.get("after", 0.05)))  # its batch-mates have started
    if payload.get("how") == "exit":
        os._exit(int(payload.get("code", 0)))
    os.kill(os.getpid(), signal.SIGKILL)


@registry.task(name="frv-kill-sync")
def kill_sync(payload: Any, ctx: JobContext) -> None:
    """As frv-kill, from a sync handler's thread."""
    _mark(ctx, "start")
    time.sleep(float(payload.get("after", 0.05)))
    if payload.get("how") == "exit":
        os._exit(int(payload.get("code", 0)))
    os.kill(os.getpid(), signal.SIGKILL)


@registry.task(name="frv-selfterm")
async def selfterm(payload: Any, ctx: JobContext) -> str:
    """Sends SIGTERM to its own process (a cleanup's os.killpg(0, SIGTERM), a library's
    'shut down' call), then works on past the grace."""
    _mark(ctx, "start")
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(3600)
    return "never"


@registry.task(name="frv-long")
async def long(payload: Any, ctx: JobContext) -> str:
    """Runs until FAST:<queue> is set (a SIGTERM's grace ends before it)."""
    _mark(ctx, "start")
    try:
        while not _r().exists(FAST + ctx.queue):
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        _mark(ctx, "cancelled:" + str(ctx.stop_reason))
        raise
    _mark(ctx, "end")
    return "long"


@registry.task(name="frv-quick")
async def quick(payload: Any, ctx: JobContext) -> int:
    _mark(ctx, "start")
    return ctx.attempt


@registry.task(name="frv-gate")
async def gate(payload: Any, ctx: JobContext) -> str:
    """Waits (awaiting) until FAST:<queue> is set."""
    _mark(ctx, "start")
    while not _r().exists(FAST + ctx.queue):
        await asyncio.sleep(0.02)
    _mark(ctx, "end")
    return "open"


@registry.task(name="frv-sync-long")
def sync_long(payload: Any, ctx: JobContext) -> str:
    """A sync handler that ignores ctx.should_stop(): runs until FAST:<queue> is set."""
    _mark(ctx, "start")
    while not _r().exists(FAST + ctx.queue):
        time.sleep(0.05)
    _mark(ctx, "end")
    return "sync-long"


@registry.task(name="frv-freeze")
async def freeze(payload: Any, ctx: JobContext) -> str:
    """An async handler that never awaits: the event loop is frozen until FAST:<queue> is set."""
    _mark(ctx, "start")
    while not _r().exists(FAST + ctx.queue):
        time.sleep(0.05)
    _mark(ctx, "end")
    return "thawed"


@registry.task(name="frv-stubborn", timeout_s=0.5)
async def stubborn(payload: Any, ctx: JobContext) -> str:
    """An async handler that swallows its cancellation (timeout, stop) until FAST:<queue> is
    set or payload['s'] seconds passed."""
    _mark(ctx, "start")
    deadline = time.monotonic() + float(payload.get("s", 15))
    while time.monotonic() < deadline and not _r().exists(FAST + ctx.queue):
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            _mark(ctx, "swallowed:" + str(ctx.stop_reason))
    _mark(ctx, "end")
    return "stubborn"


@registry.task(name="frv-hang", timeout_s=0.5)
def hang(payload: Any, ctx: JobContext) -> str:
    """A sync handler blocking far past its timeout (a thread cannot be killed)."""
    _mark(ctx, "start")
    time.sleep(float(payload.get("s", 8)))
    _mark(ctx, "end")
    return "late"


# -- helpers --------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    """A private server per test, AOF with fsync always: a kill -9 of it loses nothing
    acknowledged (the restart test), and no test shares its keyspace."""
    extra = ("--appendonly", "yes", "--appendfsync", "always")
    with RedisProcess(require_server("the failure review's private server"), extra=extra) as s:
        yield s


@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


def _queue(admin: redis.Redis) -> Queue:
    return Queue(admin, "frv-" + uuid.uuid4().hex[:10])


def _ledger(admin: redis.Redis, q: Queue) -> list[tuple[str, int, str, int, int]]:
    out = []
    for line in admin.lrange(LEDGER + q.name, 0, -1):
        i, attempt, what, pid, ms = str(line).split("|")
        out.append((i, int(attempt), what, int(pid), int(ms)))
    return out


def _starts(admin: redis.Redis, q: Queue, job_id: str) -> int:
    return sum(1 for e in _ledger(admin, q) if e[0] == job_id and e[2] == "start")


def _state(q: Queue, job_id: str) -> str:
    return q.get_job(job_id).state


def _settled(q: Queue, ids: list[str]) -> bool:
    return all(_state(q, i) in ("done", "dead", "cancelled") for i in ids)


def _describe(q: Queue, ids: list[str]) -> dict[str, tuple[str, str | None, int | None]]:
    out = {}
    for i in ids:
        j = q.get_job(i)
        out[i] = (j.state, j.dead_reason, j.attempts)
    return out


def _run_until_settled(
    server: RedisProcess, q: Queue, ids: list[str], args: tuple[str, ...], max_workers: int = 12
) -> list[int | None]:
    """Start one worker after another (each crash is a new process, as a supervisor would)
    until every job settled; the exit codes of those that ended."""
    procs: list[subprocess.Popen[bytes]] = []
    codes: list[int | None] = []
    try:
        for _ in range(max_workers):
            p = spawn_worker(server.url, q.name, *args, registry=REG)
            procs.append(p)
            wait_for(lambda p=p: p.poll() is not None or _settled(q, ids),  # type: ignore[misc]
                     timeout_s=40, what="the worker to end or every job to settle")  # fmt: skip
            if _settled(q, ids):
                break
            codes.append(p.poll())
    finally:
        stop_all(procs)
    return codes


ARGS = ("--lease-ms", "1000", "--heartbeat-ms", "250", "--log-level", "warning", "--grace", "5")


# -- a handler that kills its own process ---------------------------------------------------


@pytest.mark.parametrize(
    ("how", "max_attempts", "concurrency"),
    [("sigkill", 2, 8), ("exit", 2, 1), ("sync-sigkill", 2, 8), ("sync-exit", 3, 8)],
)
def test_a_self_killing_job_parks_alone(
    server: RedisProcess, admin: redis.Redis, how: str, max_attempts: int, concurrency: int
) -> None:
    """A job that ends its own process (SIGKILL, os._exit(0)) batched with innocent jobs:
    only it is parked ('lease expired'), every innocent completes, and a run of each innocent
    is one start per claim (no start without a claim: at-least-once only)."""
    q = _queue(admin)
    innocents = [q.enqueue("frv-ok", {"i": i}, max_attempts=max_attempts) for i in range(5)]
    task = "frv-kill-sync" if how.startswith("sync-") else "frv-kill"
    how = how.removeprefix("sync-")
    poison = q.enqueue(task, {"how": how}, max_attempts=max_attempts)
    # A longer lease than ARGS's (the last --lease-ms counts): an innocent's last attempt must
    # not lapse while a loaded machine holds its heartbeats (CI: dead, 'lease expired', once).
    slow = ("--lease-ms", "2500", "--heartbeat-ms", "500")
    codes = _run_until_settled(
        server, q, [*innocents, poison], (*ARGS, *slow, "--concurrency", str(concurrency))
    )
    got = _describe(q, innocents)
    assert _state(q, poison) == "dead", _describe(q, [poison])
    assert q.get_job(poison).dead_reason == "lease expired"
    assert all(s == "done" for s, _, _ in got.values()), got
    expected = -signal.SIGKILL if how == "sigkill" else 0
    assert codes and all(c == expected for c in codes), codes
    for i in innocents:  # each start is a claim's: attempts count them
        assert _starts(admin, q, i) <= (q.get_job(i).attempts or 0)


def test_an_innocent_on_its_last_attempt_is_not_batched_with_a_fresh_poison(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """Was a defect: claim.lua isolated a suspect from other suspects only. A job whose lease
    lapsed once and whose next attempt is its last (max_attempts=2) is a suspect, and a
    worker takes it alongside plain (never lapsed) jobs. When one of those plain jobs is
    another job of the same poison task (a bad deploy: every job of a task crashes its worker,
    and more are enqueued meanwhile), it kills the worker while the innocent suspect runs its
    last attempt: the reaper parks the innocent 'lease expired'. A user sees innocent jobs in
    the dead list after a poison task crashed workers, which docs/durability.md says cannot
    happen with max_attempts=2 ("only it is parked"). Now such a suspect runs alone: only on a
    worker holding nothing, which takes nothing else until it ends (lua/claim.lua)."""
    q = _queue(admin)
    innocents = [q.enqueue("frv-ok", {"i": i, "s": 1.0}, max_attempts=2) for i in range(3)]
    first = q.enqueue("frv-kill", {"how": "sigkill"}, max_attempts=2)
    args = (*ARGS, "--concurrency", "8")
    p = spawn_worker(server.url, q.name, *args, registry=REG)
    try:
        assert p.wait(30) == -signal.SIGKILL  # the first crash: every lease lapses once
    finally:
        stop_all([p])

    # The crashed batch's leases lapse and are reaped (a claim of limit 0, as any worker's
    # claim would): each has lapsed once with one attempt left, so each is now a suspect.
    def reaped() -> bool:
        q.claim("frv-reaper", limit=0, lease_ms=1000)
        return all(_state(q, i) == "due" for i in [*innocents, first])

    wait_for(reaped, what="the crashed batch reaped")
    # More jobs of the crashing task arrive meanwhile (a producer still enqueues them).
    fresh = [q.enqueue("frv-kill", {"how": "sigkill"}, max_attempts=2) for _ in range(3)]
    _run_until_settled(server, q, [*innocents, first, *fresh], args)
    got = _describe(q, innocents)
    assert all(s == "done" for s, _, _ in got.values()), got
    assert all(_state(q, i) == "dead" for i in [first, *fresh])


def test_a_pool_child_killed_by_its_job_is_replaced_and_the_pool_stops_cleanly(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """--processes 2: a child killed by its job is restarted by the supervisor; the poison
    job ends parked, the innocents done; SIGTERM then stops the pool with exit 0."""
    q = _queue(admin)
    innocents = [q.enqueue("frv-ok", {"i": i}, max_attempts=2) for i in range(6)]
    poison = q.enqueue("frv-kill", {"how": "sigkill"}, max_attempts=2)
    ids = [*innocents, poison]
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "4", "--processes", "2",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, ids), timeout_s=45,
                 what="every job to settle under the pool")  # fmt: skip
        assert p.poll() is None, "the pool ended by itself"
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert got[poison][0] == "dead" and got[poison][1] == "lease expired", got
    assert all(got[i][0] == "done" for i in innocents), got
    assert code == 0


# -- SIGTERM while handlers run ------------------------------------------------------------


def test_sigterm_finishes_short_jobs_and_releases_long_ones(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """A worker SIGTERMed with jobs running: those that end within --grace complete; those
    still running at its end are released (due again, attempt given back), none lost; exit 0.
    A second worker runs the released ones: each job started at most twice, ended once."""
    q = _queue(admin)
    short = [q.enqueue("frv-ok", {"s": 0.8}, max_attempts=1) for _ in range(2)]
    longs = [q.enqueue("frv-long", {}, max_attempts=1) for _ in range(2)]
    waiting = [q.enqueue("frv-ok", {"s": 0.0}, max_attempts=1) for _ in range(3)]
    ids = [*short, *longs, *waiting]
    p = spawn_worker(server.url, q.name, "--lease-ms", "3000", "--heartbeat-ms", "500",
                     "--concurrency", "4", "--grace", "1.5", registry=REG)  # fmt: skip
    try:
        wait_for(lambda: all(_starts(admin, q, i) == 1 for i in [*short, *longs]),
                 what="the four running")  # fmt: skip
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    assert code == 0
    got = _describe(q, ids)
    assert all(got[i][0] == "done" for i in short), got
    for i in longs:  # released at the grace's end: due again, its one attempt given back
        assert got[i][0] == "due" and got[i][2] == 0, got
    admin.set(FAST + q.name, 1)
    codes = _run_until_settled(
        server, q, ids, ("--lease-ms", "3000", "--heartbeat-ms", "500", "--burst")
    )
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), (got, codes)
    for i in ids:
        starts = _starts(admin, q, i)
        ends = sum(1 for e in _ledger(admin, q) if e[0] == i and e[2] == "end")
        assert ends == 1 and starts <= 2, (i, starts, ends)


# -- a handler past its timeout ---------------------------------------------------------------


def test_a_sync_handler_hung_past_its_timeout_is_parked_and_the_worker_stops(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """A sync handler blocking far past timeout_s: its attempts fail (timeout, then
    StillRunning) and it is parked after its last; its batch-mates complete; a SIGTERM then
    stops the worker with exit 0 within --grace plus a bound, though the thread still runs."""
    q = _queue(admin)
    hung = q.enqueue("frv-hang", {"s": 20}, max_attempts=2,
                     backoff=None)  # fmt: skip
    innocents = [q.enqueue("frv-ok", {"s": 0.2}, max_attempts=2) for _ in range(4)]
    ids = [hung, *innocents]
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "4", "--grace", "1",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, ids), timeout_s=40,
                 what="every job to settle")  # fmt: skip
        assert p.poll() is None, "the worker ended by itself"
        got = _describe(q, ids)
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    assert got[hung][0] == "dead", got
    assert got[hung][1] == "attempts exhausted", got
    assert [e["type"] for e in q.get_job(hung).errors] == ["JobTimeout", "StillRunning"]
    assert all(got[i][0] == "done" for i in innocents), got
    assert code == 0


# -- jobs the worker cannot start, in a batch ------------------------------------------------


def test_undecodable_payload_and_unknown_task_in_a_batch(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """A batch with a payload no JSON reader takes (written by another client), a task no
    handler exists for (max_attempts=1: parked UnknownTask at once), and innocent jobs: the
    two are parked with their reasons, the innocents complete; --burst ends with exit 0."""
    q = _queue(admin)
    innocents = [q.enqueue("frv-ok", {"s": 0.1}) for _ in range(4)]
    bad = q.enqueue("frv-ok", {"s": 0.1})
    spec = str(admin.get(q.keys.spec(bad)))
    admin.set(q.keys.spec(bad), spec[: spec.rindex("|") + 1] + '{"s": NaN')
    unknown = q.enqueue("frv-no-such-task", {}, max_attempts=1)
    ids = [*innocents, bad, unknown]
    p = spawn_worker(server.url, q.name, *ARGS, "--burst", registry=REG)
    try:
        code = p.wait(40)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert code == 0
    assert all(got[i][0] == "done" for i in innocents), got
    assert got[bad][0] == "dead" and got[unknown][0] == "dead", got
    errors = {i: str(q.get_job(i).errors) for i in (bad, unknown)}
    assert "InvalidPayload" in errors[bad], errors
    assert "UnknownTask" in errors[unknown], errors
    assert _starts(admin, q, bad) == 0


# -- Redis killed and restarted under a running worker ----------------------------------------


@pytest.mark.parametrize("processes", [1, 2])
def test_redis_killed_and_restarted_while_the_worker_runs(
    server: RedisProcess, admin: redis.Redis, processes: int
) -> None:
    """The private server (AOF, fsync always) is killed -9 while jobs run and started again on
    the same socket: the worker rides it out (still running), every job ends done, none ran
    before its run time, and SIGTERM then stops the worker with exit 0."""
    q = _queue(admin)
    now = q.counts().now_ms
    now_ids = [q.enqueue("frv-ok", {"s": 0.5}) for _ in range(6)]
    later = [q.enqueue("frv-ok", {"s": 0.1}, delay_ms=2500) for _ in range(3)]
    run_at = {i: q.get_job(i).run_at_ms for i in later}
    ids = [*now_ids, *later]
    p = spawn_worker(server.url, q.name, "--lease-ms", "3000", "--heartbeat-ms", "500",
                     "--concurrency", "2", "--log-level", "warning", "--processes", str(processes),
                     registry=REG)  # fmt: skip
    try:
        # Every process ready and running jobs (a pool child still starting when the server
        # goes away fails its start: the pool then stops with exit 3 by design).
        wait_for(lambda: len({e[3] for e in _ledger(admin, q)}) >= processes,
                 what="every process running a job")  # fmt: skip
        server.restart(hard=True)
        admin.connection_pool.disconnect()
        wait_for(lambda: p.poll() is not None or _settled(q, ids), timeout_s=40,
                 what="every job to settle after the restart")  # fmt: skip
        assert p.poll() is None, "the worker ended by itself"
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got
    for e in _ledger(admin, q):
        if e[0] in run_at and e[2] == "start":
            assert e[4] >= (run_at[e[0]] or now), (e, run_at[e[0]])
    assert code == 0


# -- a job prefetched (leased, not started) then cancelled --------------------------------------


def test_a_prefetched_job_cancelled_before_its_start_never_runs(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """Short jobs (prefetch regime), concurrency 1: a gate job runs and the jobs claimed with
    it wait behind it, leased. One of them cancelled then ('leased'), and its worker told at
    its next heartbeats (README: "its worker learns it at the next heartbeat"), must never
    start; the others run once the gate opens, and the worker stops with exit 0."""
    q = _queue(admin)
    warm = q.enqueue_many([JobSpec("frv-quick", {"w": i}) for i in range(40)])
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "1", registry=REG)
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, warm), what="the warm-up jobs")
        ids = q.enqueue_many(
            [JobSpec("frv-gate"), *(JobSpec("frv-quick", {"x": i}) for i in range(5))]
        )
        gate_id, behind = ids[0], ids[1:]
        wait_for(lambda: p.poll() is not None or _starts(admin, q, gate_id) == 1, what="the gate")
        leased = [i for i in behind if _state(q, i) == "leased"]
        assert leased, "nothing prefetched behind the gate: " + str(_describe(q, behind))
        victim = leased[-1]
        assert q.cancel(victim) == "leased"
        # The worker learns it at its next heartbeat (README): two of the gate's lease renewals.
        for _ in range(2):
            seen = q.get_job(gate_id).lease_until_ms or 0
            wait_for(lambda seen=seen: (q.get_job(gate_id).lease_until_ms or 0) > seen,  # type: ignore[misc]
                     what="a heartbeat")  # fmt: skip
        admin.set(FAST + q.name, 1)
        wait_for(lambda: p.poll() is not None or _settled(q, ids), what="every job to settle")
        assert p.poll() is None, "the worker ended by itself"
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert got[victim][0] == "cancelled", got
    assert _starts(admin, q, victim) == 0, "a cancelled job ran"
    assert all(got[i][0] == "done" for i in ids if i != victim), got
    assert code == 0


# -- a pool child killed from outside ----------------------------------------------------------


def test_pool_children_killed_from_outside_lose_no_job(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """--processes 2, each child SIGKILLed while running jobs (the OOM killer): the pool
    restarts them, every job ends done (each run again after its lease), the pool keeps
    running and a SIGTERM stops it with exit 0."""
    from tests.test_worker_pool import children

    q = _queue(admin)
    ids = [q.enqueue("frv-ok", {"s": 1.5}, max_attempts=3) for _ in range(6)]
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "2", "--processes", "2",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: len({e[3] for e in _ledger(admin, q)}) == 2, what="both children run jobs")
        victims = sorted({e[3] for e in _ledger(admin, q)})
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(set(children(p.pid)) - set(victims)) == 2, what="two new children")
        wait_for(lambda: p.poll() is not None or _settled(q, ids), timeout_s=40,
                 what="every job to settle")  # fmt: skip
        assert p.poll() is None, "the pool ended by itself"
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got
    assert code == 0


def test_sigterm_to_a_pool_releases_sync_and_async_jobs_past_the_grace(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """SIGTERM to a --processes 2 pool while sync (ignoring should_stop) and async handlers run
    past --grace: every such job is released (due, its attempt given back, max_attempts=1 so a
    spent attempt would park it later), the pool exits 0 though a sync thread still runs, and
    a later worker completes them, each started at most twice."""
    q = _queue(admin)
    ids = [q.enqueue(t, {}, max_attempts=1) for t in ("frv-sync-long", "frv-long") * 2]
    p = spawn_worker(server.url, q.name, "--lease-ms", "3000", "--heartbeat-ms", "500",
                     "--concurrency", "2", "--processes", "2", "--grace", "1",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: all(_starts(admin, q, i) == 1 for i in ids), what="all four running")
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert code == 0, got
    assert all(s == "due" and a == 0 for s, _, a in got.values()), got
    admin.set(FAST + q.name, 1)
    _run_until_settled(server, q, ids, ("--lease-ms", "3000", "--heartbeat-ms", "500", "--burst"))
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got
    assert all(_starts(admin, q, i) <= 2 for i in ids)


def test_a_frozen_event_loop_is_ended_and_its_batch_mates_survive(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """An async handler that never awaits freezes the loop: the stall watchdog ends the
    process after its lease (at least 10 s) with exit 1 (docs/durability.md); its batch-mates'
    leases lapse with it. With max_attempts=2 none of them is parked: a later worker (the
    handler fixed: FAST set) completes them all."""
    q = _queue(admin)
    innocents = [q.enqueue("frv-ok", {"s": 2.0}, max_attempts=2) for _ in range(3)]
    frozen = q.enqueue("frv-freeze", {}, max_attempts=2)
    ids = [*innocents, frozen]
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "8", registry=REG)
    try:
        wait_for(lambda: all(_starts(admin, q, i) == 1 for i in ids), what="all running")
        code = p.wait(40)
    finally:
        stop_all([p])
    assert code == 1
    admin.set(FAST + q.name, 1)
    _run_until_settled(server, q, ids, (*ARGS, "--burst"))
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got


def test_a_redis_outage_longer_than_the_lease_loses_no_job(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """The server killed -9 while jobs run and kept down until the worker has stopped them at
    their local lease end (README: "A lease whose heartbeats fail ... is stopped at its local
    end"), then started again: the worker is still running, every job ends done (a lapse on a
    job of max_attempts=2 leaves it its last attempt), and SIGTERM stops it with exit 0."""
    q = _queue(admin)
    ids = [q.enqueue("frv-ok", {"s": 1.5}, max_attempts=2) for _ in range(3)]
    log = os.path.join(server.dir, "worker.log")
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "4", "--log-level", "info",
                     registry=REG, log=log)  # fmt: skip

    def expired() -> int:
        with open(log, errors="replace") as f:
            return sum(1 for line in f if '"event": "expired"' in line)

    try:
        wait_for(lambda: all(_starts(admin, q, i) == 1 for i in ids), what="all running")
        server.kill()
        wait_for(lambda: p.poll() is not None or expired() == len(ids), timeout_s=20,
                 what="the worker to stop the handlers at their lease end")  # fmt: skip
        server.start()
        admin.connection_pool.disconnect()
        wait_for(lambda: p.poll() is not None or _settled(q, ids), timeout_s=40,
                 what="every job to settle after the outage")  # fmt: skip
        assert p.poll() is None, "the worker ended by itself"
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got
    assert code == 0


def test_an_async_handler_swallowing_its_timeout_is_parked_and_the_worker_stops(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """An async handler that swallows the cancellation of its timeout (and of the stop): its
    attempts fail (JobTimeout, then StillRunning while the first run lives) and it is parked
    after its last; its batch-mates complete; SIGTERM then stops the worker with exit 0 while
    the stubborn run is still going (it cannot hold the process for ever)."""
    q = _queue(admin)
    stub = q.enqueue("frv-stubborn", {"s": 120}, max_attempts=2)
    innocents = [q.enqueue("frv-ok", {"s": 0.2}, max_attempts=2) for _ in range(4)]
    ids = [stub, *innocents]
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "4", "--grace", "1",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, ids), timeout_s=40,
                 what="every job to settle")  # fmt: skip
        assert p.poll() is None, "the worker ended by itself"
        got = _describe(q, ids)
        p.send_signal(signal.SIGTERM)
        try:
            code: int | None = p.wait(30)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        stop_all([p])
    assert got[stub][0] == "dead", got
    assert got[stub][1] == "attempts exhausted", got
    assert [e["type"] for e in q.get_job(stub).errors] == ["JobTimeout", "StillRunning"]
    assert all(got[i][0] == "done" for i in innocents), got
    assert code == 0, "the worker did not stop within 30 s of SIGTERM (grace 1 s)"


@pytest.mark.parametrize("max_attempts", [3])
def test_a_self_killing_job_among_prefetched_short_jobs(
    server: RedisProcess, admin: redis.Redis, max_attempts: int
) -> None:
    """The prefetch regime (short jobs: the worker leases up to --concurrency + prefetch and
    runs them in turn): a job that SIGKILLs its worker in the middle of such a batch. The jobs
    prefetched behind it lapse with it (never started); none of them is parked, the poison job
    is, and every innocent runs once to its end."""
    q = _queue(admin)
    warm = q.enqueue_many([JobSpec("frv-quick", {"w": i}) for i in range(40)])
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "1", registry=REG)
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, warm), what="the warm-up jobs")
        specs = [JobSpec("frv-quick", {"x": i}, max_attempts=max_attempts) for i in range(60)]
        poison_spec = JobSpec("frv-kill", {"how": "sigkill", "after": 0.3},
                              max_attempts=max_attempts)  # fmt: skip
        ids = q.enqueue_many([*specs[:20], poison_spec, *specs[20:]])
        assert p.wait(30) == -signal.SIGKILL
    finally:
        stop_all([p])
    poison, innocents = ids[20], ids[:20] + ids[21:]
    _run_until_settled(server, q, ids, (*ARGS, "--concurrency", "2"))
    got = _describe(q, innocents)
    assert _state(q, poison) == "dead", _describe(q, [poison])
    assert all(s == "done" for s, _, _ in got.values()), [g for g in got.values() if g[0] != "done"]
    lapsed = [i for i in innocents if admin.hget(q.keys.job(i), "lapses")]
    assert len(lapsed) >= 2, "no innocent was in the crashed batch: the scenario did not happen"


def test_sigterm_gives_back_prefetched_jobs_at_once_and_starts_none(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """README: on SIGTERM the worker stops claiming and gives back the jobs claimed but never
    started, then waits up to --grace for the running ones. Concurrency 1, short jobs
    (prefetch): while the gate job runs, SIGTERM; the jobs prefetched behind it are due again
    (attempt given back) before the gate ends, none of them starts during the grace, the gate
    completes within it, and the worker exits 0."""
    q = _queue(admin)
    warm = q.enqueue_many([JobSpec("frv-quick", {"w": i}) for i in range(40)])
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "1", "--grace", "20",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, warm), what="the warm-up jobs")
        ids = q.enqueue_many(
            [JobSpec("frv-gate", max_attempts=1),
             *(JobSpec("frv-quick", {"x": i}, max_attempts=1) for i in range(5))]
        )  # fmt: skip
        gate_id, behind = ids[0], ids[1:]
        wait_for(lambda: p.poll() is not None or _starts(admin, q, gate_id) == 1, what="the gate")
        held = [i for i in behind if _state(q, i) == "leased"]
        assert held, "nothing prefetched behind the gate: " + str(_describe(q, behind))
        p.send_signal(signal.SIGTERM)
        wait_for(lambda: all(_state(q, i) == "due" for i in held),
                 what="the prefetched jobs given back before the grace ends")  # fmt: skip
        admin.set(FAST + q.name, 1)
        code = p.wait(30)
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert code == 0
    assert got[gate_id][0] == "done", got
    for i in held:
        assert got[i][0] == "due" and got[i][2] == 0, got
        assert _starts(admin, q, i) == 0


def test_a_second_sigterm_forces_the_stop_and_loses_no_job(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """Two SIGTERMs: the worker exits at once with 130 (README); the running jobs are left to
    their leases and a later worker completes them (max_attempts=2: a lapse leaves one)."""
    q = _queue(admin)
    ids = [q.enqueue("frv-long", {}, max_attempts=2) for _ in range(3)]
    log = os.path.join(server.dir, "worker.log")
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "4", "--grace", "30",
                     "--log-level", "info", registry=REG, log=log)  # fmt: skip

    def stopping() -> bool:
        with open(log, errors="replace") as f:
            return "stopping (grace" in f.read()

    try:
        wait_for(lambda: all(_starts(admin, q, i) == 1 for i in ids), what="all running")
        p.send_signal(signal.SIGTERM)
        wait_for(stopping, what="the first signal taken")
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        stop_all([p])
    assert code == 130
    admin.set(FAST + q.name, 1)
    _run_until_settled(server, q, ids, (*ARGS, "--burst"))
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got


def _max_overlap(admin: redis.Redis, q: Queue) -> int:
    """The most runs that had started and not ended at one instant (ended runs only)."""
    starts: dict[tuple[str, int], int] = {}
    spans = []
    for i, attempt, what, _pid, ms in _ledger(admin, q):
        if what == "start":
            starts[(i, attempt)] = ms
        elif what == "end" and (i, attempt) in starts:
            spans.append((starts[(i, attempt)], ms))
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def test_a_self_killing_job_with_a_concurrency_key(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """A job that SIGKILLs its worker shares a concurrency key (limit 2) with innocent jobs:
    the crashed leases give their key slots back when reaped (nothing held for ever), the
    poison job is parked alone, every innocent completes, and no more than 2 of the key ran
    at once."""
    q = _queue(admin)
    kw: dict[str, Any] = {"concurrency_key": "frv:k", "concurrency_limit": 2, "max_attempts": 2}
    poison = q.enqueue("frv-kill", {"how": "sigkill", "after": 0.1}, **kw)  # in the first pair
    innocents = [q.enqueue("frv-ok", {"s": 0.4}, **kw) for _ in range(6)]
    ids = [poison, *innocents]
    _run_until_settled(server, q, ids, (*ARGS, "--concurrency", "8"))
    got = _describe(q, ids)
    assert got[poison][0] == "dead" and got[poison][1] == "lease expired", got
    assert all(got[i][0] == "done" for i in innocents), got
    assert _max_overlap(admin, q) <= 2


def test_sigterm_while_redis_is_down_ends_in_bounded_time_and_loses_no_job(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """SIGTERM, then the server killed during the grace and kept down: the worker cannot
    release its jobs; it must still end in bounded time (its stop's settle bound) with exit 0
    (README: a stop is exit 0), and once the server is back a later worker completes every
    job (their leases lapse: max_attempts=2 leaves one)."""
    q = _queue(admin)
    ids = [q.enqueue("frv-long", {}, max_attempts=2) for _ in range(3)]
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "4", "--grace", "1",
                     registry=REG)  # fmt: skip
    try:
        wait_for(lambda: all(_starts(admin, q, i) == 1 for i in ids), what="all running")
        p.send_signal(signal.SIGTERM)
        server.kill()
        try:
            code: int | None = p.wait(40)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        stop_all([p])
    server.start()
    admin.connection_pool.disconnect()
    assert code == 0
    admin.set(FAST + q.name, 1)
    _run_until_settled(server, q, ids, (*ARGS, "--burst"))
    got = _describe(q, ids)
    assert all(s == "done" for s, _, _ in got.values()), got


# -- the claim script under a test clock: why the innocent above is parked ------------------------


def test_a_worker_running_a_last_attempt_suspect_is_given_more_jobs(
    tq: tuple[Queue, Clock],
) -> None:
    """Was a defect: claim.lua's one-suspect rule kept a second suspect from a
    worker, not a plain job. A suspect on its last attempt (lapsed once, max_attempts=2) runs
    beside plain jobs claimed with it or, as here, after it by the same worker; when one of
    those kills the worker, the suspect's lease lapses on its last attempt and the next claim
    parks it 'lease expired' (the end-to-end test above): an innocent job dead after a crash
    it did not cause. This pins the fix of running such a suspect alone (the worker is given
    nothing else while it runs); the end-to-end test is the one any fix must pass."""
    q, clock = tq
    t0 = 1_000_000
    clock.set_ms(t0)
    innocent = q.enqueue("t", max_attempts=2)
    q.claim("crashed", limit=10, lease_ms=1000)  # the first batch; its worker is killed
    clock.set_ms(t0 + 1001)
    (suspect,) = q.claim("w1", limit=10, lease_ms=1000).jobs  # reaped, then claimed as suspect
    assert suspect.id == innocent and suspect.attempts == 2
    poison = q.enqueue("t", max_attempts=2)  # a plain job (of a task that kills its worker)
    got = [j.id for j in q.claim("w1", limit=10, lease_ms=1000).jobs]
    # w1 runs its suspect alone until it ends: nothing else may share the process with it.
    assert got == [], "a plain job was leased beside a last-attempt suspect"
    assert q.get_job(poison).state == "due"  # left for another worker


# -- an embedded worker ---------------------------------------------------------------------------


def test_an_embedded_worker_cancelled_gives_its_jobs_back(
    server: RedisProcess, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker(...).run() embedded in an app, its task cancelled while jobs run (a lifespan
    exit): README says the same shutdown runs without the grace, then CancelledError. The
    running jobs are released (due, attempt given back; max_attempts=1, so a spent attempt
    would park them at the next lapse), the one claimed with them that had not started too,
    and nothing is left leased."""
    monkeypatch.setenv("TEST_REDIS_URL", server.url)
    monkeypatch.setattr(f"{__name__}._client", None)
    q = _queue(admin)
    ids = [q.enqueue("frv-long", {}, max_attempts=1) for _ in range(3)]

    async def main() -> None:
        client = connect_async(server.url)
        settings = WorkerSettings(queues=(q.name,), concurrency=2, lease_ms=3000,
                                  heartbeat_ms=500, grace_s=30)  # fmt: skip
        task = asyncio.create_task(Worker(client, registry, settings).run(install_signals=False))
        deadline = time.monotonic() + 30
        while sum(_starts(admin, q, i) for i in ids) < 2:
            assert time.monotonic() < deadline and not task.done(), "two jobs never started"
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        await client.aclose()

    asyncio.run(main())
    got = _describe(q, ids)
    assert all(s == "due" and a == 0 for s, _, a in got.values()), got
    assert q.counts().leased == 0


@pytest.mark.xfail(
    strict=True,
    reason="a documented limit (docs/durability.md): a graceful stop gives a running job its "
    "attempt back, so a job that stops its own worker (SIGTERM) is never parked",
)
def test_a_job_that_sigterms_its_own_worker_is_parked_after_its_attempts(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """Defect: a handler that sends SIGTERM to its own process (os.killpg(0, SIGTERM) to clean
    up the children it started, a library's shutdown) makes its worker stop gracefully: at the
    grace's end the job is released with its attempt given back (release.lua), due again at
    once, first in line. Every worker that claims it stops the same way, exit 0, and the job
    never spends an attempt, so it is never parked: with Restart=on-failure the queue is left
    with no worker (exit 0 is not restarted), with a pool or Restart=always workers stop and
    restart for ever. A self-killing job (SIGKILL, os._exit) is parked after max_attempts
    (docs/guide/workers.md); this one, after max_attempts + 2 workers, is still due."""
    q = _queue(admin)
    job = q.enqueue("frv-selfterm", {}, max_attempts=2)
    codes = []
    for _ in range(4):  # max_attempts + 2 workers, one after another
        p = spawn_worker(server.url, q.name, *ARGS, "--grace", "0.5", registry=REG)
        try:
            codes.append(p.wait(30))
        finally:
            stop_all([p])
        if _state(q, job) in ("dead", "done"):
            break
    got = _describe(q, [job])
    assert got[job][0] == "dead", (got, codes, _starts(admin, q, job))


def test_a_prefetched_job_held_past_its_start_deadline_is_given_back(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """Defect: README says a job a busy worker claimed ahead (prefetched) and held past its
    start deadline "is given back unstarted" and parked 'start deadline passed'
    (scheduler/worker/starting.py's _late_to_start: "given back unstarted at the next
    heartbeat"). But the check runs only in Dispatch._pump (dispatch.py:235), when a slot
    frees: behind a job that runs on (a long or hung handler, no timeout) the late jobs stay
    leased to the worker, heartbeated, for as long as it runs, neither parked (visible,
    requeueable) nor free for another worker. A user sees jobs 'leased' long past their
    deadline. Here concurrency 1, a gate job runs, jobs with start_within_ms=800 wait behind
    it: 4 s later (5 deadlines, 16 heartbeats) they are still leased."""
    q = _queue(admin)
    warm = q.enqueue_many([JobSpec("frv-quick", {"w": i}) for i in range(40)])
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "1", registry=REG)
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, warm), what="the warm-up jobs")
        ids = q.enqueue_many(
            [JobSpec("frv-gate"),
             *(JobSpec("frv-quick", {"x": i}, start_within_ms=800) for i in range(4))]
        )  # fmt: skip
        gate_id, behind = ids[0], ids[1:]
        wait_for(lambda: p.poll() is not None or _starts(admin, q, gate_id) == 1, what="the gate")
        held = [i for i in behind if _state(q, i) == "leased"]
        assert held, "nothing prefetched behind the gate: " + str(_describe(q, behind))
        try:
            wait_for(lambda: all(_state(q, i) != "leased" for i in held), timeout_s=4,
                     what="the late jobs given back")  # fmt: skip
            given_back = True
        except AssertionError:
            given_back = False
        states = _describe(q, behind)
        admin.set(FAST + q.name, 1)
        wait_for(lambda: p.poll() is not None or _settled(q, ids), what="every job settled")
        assert p.poll() is None, "the worker ended by itself"
    finally:
        stop_all([p])
    got = _describe(q, ids)
    assert got[gate_id][0] == "done", got
    for i in behind:
        assert got[i][:2] == ("dead", "start deadline passed"), got
        assert _starts(admin, q, i) == 0
    assert given_back, f"4 s past their start deadline, still leased behind the gate: {states}"


def test_prefetched_jobs_behind_a_hung_handler_reach_an_idle_worker(
    server: RedisProcess, admin: redis.Redis
) -> None:
    """Defect: jobs a worker claimed ahead (prefetch, short jobs) wait in its backlog
    (Dispatch._backlog) until one of its slots frees, with no bound: behind a handler that
    hangs (no timeout) they stay leased to it, heartbeated, for as long as it hangs, while
    another worker of the queue sits idle. A job claimed again behind its own earlier run goes
    back after a whole lease (README); a prefetched innocent never does. A user sees innocent
    jobs 'leased' and not running for as long as some other job hangs. Here: concurrency 1,
    a gate job that does not end, jobs prefetched behind it, a second worker idle: 5 leases
    later they have not run."""
    q = _queue(admin)
    warm = q.enqueue_many([JobSpec("frv-quick", {"w": i}) for i in range(40)])
    p = spawn_worker(server.url, q.name, *ARGS, "--concurrency", "1", registry=REG)
    procs = [p]
    try:
        wait_for(lambda: p.poll() is not None or _settled(q, warm), what="the warm-up jobs")
        ids = q.enqueue_many(
            [JobSpec("frv-gate"), *(JobSpec("frv-quick", {"x": i}) for i in range(4))]
        )
        gate_id, behind = ids[0], ids[1:]
        wait_for(lambda: p.poll() is not None or _starts(admin, q, gate_id) == 1, what="the gate")
        held = [i for i in behind if _state(q, i) == "leased"]
        assert held, "nothing prefetched behind the gate: " + str(_describe(q, behind))
        procs.append(spawn_worker(server.url, q.name, *ARGS, registry=REG))  # idle
        try:
            wait_for(lambda: all(_state(q, i) == "done" for i in held), timeout_s=5,
                     what="the held jobs run elsewhere")  # fmt: skip
            ran = True
        except AssertionError:
            ran = False
        states = _describe(q, held)
        admin.set(FAST + q.name, 1)
        wait_for(lambda: _settled(q, ids), what="every job settled")
    finally:
        stop_all(procs)
    assert all(s == "done" for s, _, _ in _describe(q, ids).values())
    assert ran, f"5 leases behind a hung job, with a worker idle, still: {states}"
