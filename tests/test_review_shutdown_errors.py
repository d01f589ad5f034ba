"""The worker's graceful stop and its handling of rare server errors, from a review: each test
failed on the code it was written against. In-process workers on the module's private
redis-server (never the shared one)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import redis.asyncio as aredis

from scheduler.core.scripts import Scripts
from scheduler.worker import EXIT_OK, Worker, WorkerSettings
from scheduler.worker.registry import JobContext, Registry
from tests.conftest import delete_queue, new_queue
from tests.fixtures.polling import poll
from tests.redis_server import RedisProcess

registry = Registry()
STARTED: list[str] = []
GATES: dict[str, asyncio.Event] = {}


@registry.task(name="rs-quick")
async def quick(payload: Any, ctx: JobContext) -> None:
    return None


@registry.task(name="rs-mark")
async def mark(payload: Any, ctx: JobContext) -> None:
    STARTED.append(ctx.job_id)


@registry.task(name="rs-gate")
async def gated(payload: Any, ctx: JobContext) -> None:
    STARTED.append(ctx.job_id)
    await GATES.setdefault(ctx.job_id, asyncio.Event()).wait()


class HoldClaimReplies(aredis.Redis):
    """While `hold` is set, a claim runs on the server and its reply is kept back until
    `let_go` is set (a slow network, a server busy answering others): the worker's claim call
    is in flight, its jobs already leased."""

    claim_sha = Scripts().sha["claim"]
    hold = False

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.held = asyncio.Event()
        self.let_go = asyncio.Event()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if args[:2] == ("EVALSHA", self.claim_sha) and self.hold:
            self.held.set()
            await self.let_go.wait()
        return reply


# -- 1. a stop while a claim is in flight ------------------------------------------------------
def test_jobs_of_a_claim_answered_after_the_stop_are_given_back_not_started(
    module_server: RedisProcess,
) -> None:
    """README (Workers): on SIGTERM the worker stops claiming and gives back the jobs claimed
    but never started; runtime._stop_sequence: "a claim in flight may finish (its jobs are then
    given back)". Before: the claim's answer, arriving after the stop, started its jobs' handlers
    (_take -> _run) during the grace period; with a short grace a sync handler so started runs
    on in its thread after its job was released."""
    q = new_queue(module_server.client(), "rs-")
    tag = uuid.uuid4().hex[:8]
    STARTED.clear()

    async def main() -> int:
        client = HoldClaimReplies(unix_socket_path=module_server.socket, decode_responses=True)
        settings = WorkerSettings(
            queues=(q.name,), concurrency=4, grace_s=5, lease_ms=30_000, heartbeat_ms=1_000
        )
        w = Worker(client, registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            await poll(lambda: w._idle.is_set(), "the worker idle", timeout_s=5)
            client.hold = True
            q.enqueue("rs-mark", job_id=f"late-{tag}")  # wakes the worker: its claim is held
            await poll(client.held.is_set, "a claim in flight", timeout_s=5)
        finally:
            w.request_stop()  # SIGTERM's first step
            client.let_go.set()  # the claim's answer arrives after the stop
            code = await asyncio.wait_for(task, 20)
            await client.aclose()
        return code

    try:
        assert asyncio.run(main()) == EXIT_OK
        assert f"late-{tag}" not in STARTED, (
            f"job late-{tag} was claimed by a call answered after the stop, yet its handler "
            f"was started during shutdown (handlers started: {STARTED})"
        )
        assert q.status(f"late-{tag}") == "due"  # released at once, not left leased 30 s
    finally:
        delete_queue(q.client, q)


def test_no_backlog_job_starts_while_shutdown_waits_for_a_claim_in_flight(
    module_server: RedisProcess,
) -> None:
    """Shutdown waits (up to the grace) for a claim in flight before it takes the backlog.
    Before: a running job that ended during that wait _pump()ed the next backlog job into a
    handler after the stop (_pump checked only _shutting_down, which shutdown never set)."""
    q = new_queue(module_server.client(), "rs-")
    tag = uuid.uuid4().hex[:8]
    STARTED.clear()
    a, b, c = f"a-{tag}", f"b-{tag}", f"c-{tag}"

    async def main() -> int:
        client = HoldClaimReplies(unix_socket_path=module_server.socket, decode_responses=True)
        settings = WorkerSettings(
            queues=(q.name,), concurrency=1, grace_s=5, lease_ms=30_000, heartbeat_ms=1_000
        )
        w = Worker(client, registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            for _ in range(3):  # short jobs: the worker then claims ahead (prefetch)
                q.enqueue("rs-quick")
            await poll(lambda: w._mean_run_s is not None, "short jobs to run", timeout_s=5)
            GATES[a] = asyncio.Event()
            q.enqueue("rs-gate", job_id=a)
            q.enqueue("rs-mark", job_id=b)
            # A's handler starts on the loop's next turn after B is backlogged: wait for both.
            await poll(
                lambda: a in STARTED and any(r.job.id == b for r in w._backlog),
                lambda: f"A started ({STARTED}) and B backlogged",
                timeout_s=5,
            )
            client.hold = True
            q.enqueue("rs-mark", job_id=c)  # its claim is in flight when the stop comes
            await poll(client.held.is_set, "a claim in flight", timeout_s=5)
            w.request_stop()
            GATES[a].set()  # A ends while shutdown waits for that claim
            await poll(lambda: not w.running, "A to end", timeout_s=5)
            await asyncio.sleep(0.05)
        finally:
            w.request_stop()
            client.let_go.set()
            code = await asyncio.wait_for(task, 20)
            await client.aclose()
        return code

    try:
        assert asyncio.run(main()) == EXIT_OK
        assert b not in STARTED and c not in STARTED, (
            f"jobs never started when the worker was stopped were started during shutdown "
            f"(handlers started: {STARTED})"
        )
        assert (q.status(a), q.status(b), q.status(c)) == ("done", "due", "due")
    finally:
        delete_queue(q.client, q)


# -- 2. a fatal error met during the grace period ----------------------------------------------
def test_a_fatal_error_during_the_grace_stops_the_handlers_before_their_lease_ends(
    module_server: RedisProcess,
) -> None:
    """WorkerCore._fatal: "Stop the worker (no grace period)". The heartbeat loop dies of a
    refusal (ACL: NOPERM, exit 5) while shutdown waits out a long grace. Before: _shutdown
    read the exit code once, before the wait, so the handler ran on for the rest of the grace
    with no heartbeat and no local lease check (both live in the dead loop): past its lease,
    when the server may hand the job to another worker."""
    q = new_queue(module_server.client(), "rs-")
    admin = q.client
    tag = uuid.uuid4().hex[:8]
    job = f"long-{tag}"
    user = "rs" + tag
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    STARTED.clear()
    seen: dict[str, Any] = {}

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, username=user,
                              password="pw", decode_responses=True)  # fmt: skip
        settings = WorkerSettings(
            queues=(q.name,), concurrency=2, grace_s=60, lease_ms=3000, heartbeat_ms=100
        )
        w = Worker(client, registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            q.enqueue("rs-gate", job_id=job)
            await poll(lambda: job in STARTED, "the long job to start", timeout_s=5)
            r = w.running[(q.name, job)]
            w.request_stop()  # SIGTERM: the grace (60 s) begins
            await poll(lambda: w._closed, "the stop under way", timeout_s=5)
            admin.acl_setuser(user, enabled=True, commands=["-evalsha", "-eval"])  # for good
            await poll(lambda: w._exit_code != EXIT_OK, "the refusal to be met", timeout_s=5)
            # The last lease the worker knows of ends at r.lease_deadline_s (local clock).
            end_s = r.lease_deadline_s
            await poll(lambda: time.monotonic() > end_s + 0.2, "the lease end", timeout_s=5)
            seen["stopped"] = r.ctx.stopped.is_set()
            seen["running"] = (q.name, job) in w.running
            GATES[job].set()
            return int(await asyncio.wait_for(task, 70))
        finally:
            if not task.done():
                GATES.setdefault(job, asyncio.Event()).set()
                task.cancel()
            await client.aclose()

    try:
        code = asyncio.run(main())
        assert seen == {"stopped": True, "running": False}, (
            f"the handler was still running after its lease ran out ({seen}): a fatal error "
            "during the grace period did not stop it"
        )
        assert code == 5  # EXIT_REDIS_REFUSED
    finally:
        admin.acl_deluser(user)
        delete_queue(q.client, q)


# -- 3. heartbeats that hang while a long handler runs --------------------------------------------
def test_a_hung_heartbeat_stops_the_run_before_the_presence_call(
    module_server: RedisProcess,
) -> None:
    """README: a lease whose heartbeats hang is stopped at its local end, "a little before the
    server's" (_LEASE_MARGIN_S, 50 ms). The heartbeat call is cut at that end; then the presence
    call ran, bounded by the same (already past) end, which _within rounds up to 50 ms, and only
    after it was the lease checked: the run was stopped ~52 ms after its local end, at or past
    the server's end, when another worker may already hold the job."""
    q = new_queue(module_server.client(), "rs-")
    tag = uuid.uuid4().hex[:8]
    job = f"hb-{tag}"
    STARTED.clear()
    seen: dict[str, Any] = {}

    async def main() -> int:
        client = aredis.Redis(unix_socket_path=module_server.socket, decode_responses=True)
        settings = WorkerSettings(
            queues=(q.name,), concurrency=2, grace_s=0, lease_ms=1000, heartbeat_ms=300
        )
        w = Worker(client, registry, settings)
        task = asyncio.create_task(w.run(install_signals=False))
        try:
            q.enqueue("rs-gate", job_id=job)
            await poll(lambda: job in STARTED, "the job to start", timeout_s=5)
            r = w.running[(q.name, job)]
            hung = asyncio.Event()

            async def heartbeat() -> None:  # the server stalls: no answer, no error
                hung.set()
                await asyncio.sleep(60)

            async def presence(*, remove: bool = False) -> None:
                if hung.is_set() and "stopped" not in seen:
                    seen["stopped"] = r.ctx.stopped.is_set()
                    seen["after_end_ms"] = round((time.monotonic() - r.lease_deadline_s) * 1e3)
                await asyncio.sleep(60)

            w._heartbeat = heartbeat  # type: ignore[method-assign]
            w._beat_workers = presence  # type: ignore[method-assign]
            await poll(lambda: "stopped" in seen, "a presence call after the hang", timeout_s=10)
            await poll(r.ctx.stopped.is_set, "the run to be stopped", timeout_s=5)
        finally:
            w.request_stop()
            GATES.setdefault(job, asyncio.Event()).set()
            code = await asyncio.wait_for(task, 20)
            await client.aclose()
        return code

    try:
        assert asyncio.run(main()) == EXIT_OK
        assert seen["stopped"], (
            f"the heartbeat ran out the lease, yet the run was not stopped before the presence "
            f"call ({seen['after_end_ms']} ms after the local lease end): it was stopped only "
            "after that call's 50 ms, the whole margin before the server's lease end"
        )
    finally:
        delete_queue(q.client, q)
