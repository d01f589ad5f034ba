"""A claim the server runs only after a stall longer than the lease (CLIENT PAUSE, a slow
command, a long fork). The server's lease began when it ran the claim, after the stall, so the
worker still holds about a whole lease. It used to count the lease from when it sent the claim:
every job of that batch started and was stopped at once as "expired", its result thrown away
(parked as "lease expired" at max_attempts 1, run again otherwise). Now such a batch learns its
leases from a heartbeat sent at once, as a re-sent claim does.

The stall is made exact: the worker's first claim call waits 4 s before it is sent (t_sent is
read before, as a claim held up in a paused server's input). The audit that found it used
`CLIENT PAUSE 5000 ALL` on a CLI worker (tests can not time that pause against the claim)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from scheduler import JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import Worker, WorkerSettings
from tests.embedded_worker import run_until

registry = Registry()
runs: list[str] = []


def stall_first_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's first claim call waits 4 s (> the 3 s lease) before it is sent."""
    real = Worker._claim_call
    stalled: list[bool] = []

    async def claim_call(self: Worker, call: Any) -> Any:
        if not stalled:
            stalled.append(True)
            await asyncio.sleep(4.0)  # the server runs this claim 4 s after t_sent
        return await real(self, call)

    monkeypatch.setattr(Worker, "_claim_call", claim_call)


def finished(q: Queue, jobs: list[str]) -> bool:
    return all(q.status(j) in ("done", "dead") for j in jobs)


@registry.task("stall.once")
def once(payload: Any, ctx: JobContext) -> str:
    runs.append(ctx.job_id)
    time.sleep(1.0)  # heartbeat ticks meanwhile: each checks the local lease end
    return "ok"


def test_a_claim_run_after_a_stall_runs_its_jobs_once_to_the_end(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue.from_url(module_server.url, "stall")
    jobs = [q.enqueue("stall.once", {"n": i}, max_attempts=1) for i in range(3)]
    stall_first_claim(monkeypatch)

    settings = WorkerSettings(queues=("stall",), lease_ms=3_000, heartbeat_ms=500, grace_s=0)
    runs.clear()
    run_until(module_server.url, registry, settings, lambda: finished(q, jobs))
    states = {j: (q.get_job(j).state, q.get_job(j).dead_reason) for j in jobs}
    assert all(s == ("done", None) for s in states.values()), states
    assert sorted(runs) == sorted(jobs)  # each ran once


def test_an_expiry_check_while_the_learning_heartbeat_is_out_stops_nothing(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat sent to learn such a batch's leases marked its runs as beaten before it
    was answered; a cluster worker checks lease ends while its per-node calls are out, and it
    stopped them at their stale end (an audit: every job of a partition back from a reshard ran
    twice, one lease apart). Here every call the worker sends runs that check first."""
    q = Queue.from_url(module_server.url, "stall2")
    jobs = [q.enqueue("stall.once", {"n": i}, max_attempts=1) for i in range(3)]
    stall_first_claim(monkeypatch)

    def check_while_out(w: Worker) -> None:
        sent = w._pipe.run

        async def checked(items: Any) -> Any:
            w._expire_leases()  # as _send_parts does while a node's call is out
            return await sent(items)

        monkeypatch.setattr(w._pipe, "run", checked)

    settings = WorkerSettings(queues=("stall2",), lease_ms=3_000, heartbeat_ms=500, grace_s=0)
    runs.clear()
    run_until(module_server.url, registry, settings, lambda: finished(q, jobs),
              setup=check_while_out)  # fmt: skip
    states = {j: (q.get_job(j).state, q.get_job(j).dead_reason) for j in jobs}
    assert all(s == ("done", None) for s in states.values()), states
    assert sorted(runs) == sorted(jobs)
