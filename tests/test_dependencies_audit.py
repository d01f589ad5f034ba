"""Dependencies and cancellation, from an audit (docs/flow-control.md 'Dependencies'): what
happens to a job others wait for (after=[it]) when something else than its own end touches it,
against the real scripts."""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
from typing import Any

import pytest

from scheduler import BadArgument, JobOutcome, JobSpec, Queue, Registry
from scheduler.core.errors import JobNotFound, LeaseRefused
from scheduler.worker import Worker, WorkerSettings
from tests.conftest import Clock
from tests.embedded_worker import run_until

T0 = 1_000_000


def _claim(q: Queue) -> list[str]:
    return [j.id for j in q.claim("w", limit=100, lease_ms=10_000).jobs]


def test_a_debounced_job_other_jobs_wait_for_is_still_replaced(q: Queue) -> None:
    """A child enqueued after=[the debounced job] marks that job's hash (`kids`): the next
    debounced call took the mark for a claim and wrote a second job, so the digest ran twice,
    once with the stale data, against 'while the job the key names has not been claimed, the
    call replaces it' (README)."""
    first = q.enqueue("d", {"n": 1}, key="d", debounce=True, delay_ms=0)
    child = q.enqueue("c", after=[first])
    assert q.enqueue("d", {"n": 2}, key="d", debounce=True, delay_ms=0) == first
    leases = q.claim("w", limit=10, lease_ms=10_000).jobs
    assert [(j.id, j.payload()) for j in leases] == [(first, {"n": 2})]
    assert q.get_job(child).fields["flow_reason"] == "waiting for 1 jobs"
    q.complete(first, leases[0].token, None)
    assert _claim(q) == [child]
    assert json.loads(q.get_job(first).payload_json or "null") in ({"n": 2}, None)


class _Run:
    """One seeded program of enqueues (plain, debounced, enqueue_many with in-call parents,
    idempotency keys and batch sizes that split them), claims by two workers, completes
    (current and stale tokens), fails, releases, cancels, requeues and purges of dead jobs and
    clock moves past the leases. It records each job's parents and checks at every claim that
    they are done, unless the job was requeued while one of them had ended dead, cancelled or
    was gone (docs: it then runs), and at the end, after a drain, that nothing is left due,
    held or leased."""

    def __init__(self, q: Queue, clock: Clock, seed: int) -> None:
        self.q, self.clock, self.rnd = q, clock, random.Random(seed)
        self.now = T0
        self.ids: list[str] = []
        self.parents: dict[str, set[str]] = {}
        self.excused: set[str] = set()  # requeued beside a parent that had ended
        self.tainted: set[str] = set()  # keys of a refused call: other batches wrote jobs
        self.leases: dict[str, str] = {}
        self.done: set[str] = set()
        self.log: list[str] = []

    def new(self, job_id: str, parents: set[str]) -> None:
        if job_id not in self.parents:
            self.parents[job_id] = parents
            self.ids.append(job_id)

    def check_claimed(self, job_id: str) -> None:
        if job_id in self.excused:
            return
        early = self.parents.get(job_id, set()) - self.done
        assert not early, f"{job_id} claimed before its parents {early} were done: {self.log}"

    def pick_parents(self, pool: list[str]) -> list[str]:
        return self.rnd.sample(pool, min(len(pool), self.rnd.randint(0, 2)))

    def enqueue(self, step: int) -> None:
        ps = self.pick_parents(self.ids)
        try:
            jid = self.q.enqueue("t", step, after=ps or None, max_attempts=self.rnd.choice([1, 2]))
        except BadArgument:  # a parent purged
            return
        self.log.append(f"enqueue {jid} after {ps}")
        self.new(jid, set(ps))

    def debounce(self, step: int) -> None:
        key = f"d{self.rnd.randint(0, 2)}"
        jid = self.q.enqueue("t", step, key=key, debounce=True, delay_ms=self.rnd.choice([0, 500]))
        self.log.append(f"debounce {key} -> {jid}")
        self.new(jid, set())

    def many(self, step: int) -> None:
        specs, made = [], []
        for k in range(self.rnd.randint(1, 4)):
            key = self.rnd.choice([None, None, f"k{self.rnd.randint(0, 3)}"])
            made.append(f"m{step}-{k}")
            after = self.pick_parents(self.ids + made[:-1])
            attempts = self.rnd.choice([1, 2])
            job_id = None if key else made[-1]
            specs.append(
                JobSpec(
                    "t", step, job_id=job_id, key=key, after=after or None, max_attempts=attempts
                )
            )
        try:
            got = self.q.enqueue_many(specs, batch_size=self.rnd.randint(1, 4))
        except BadArgument as exc:
            self.log.append(f"many refused: {exc}")
            self.tainted.update(s.key for s in specs if s.key)
            return
        alias = dict(zip(made, got, strict=True))
        for spec, jid in zip(specs, got, strict=True):
            if spec.key in self.tainted:
                self.excused.add(jid)
            self.new(jid, {alias.get(p, p) for p in spec.after or ()})
        self.log.append(f"many {[(s.after, s.key) for s in specs]} -> {got}")

    def claim(self) -> None:
        for j in self.q.claim(f"w{self.rnd.randint(0, 1)}", limit=3, lease_ms=2_000).jobs:
            self.log.append(f"claim {j.id}")
            self.check_claimed(j.id)
            self.leases[j.id] = j.token

    def settle(self, op: str) -> None:
        jid = self.rnd.choice(sorted(self.leases))
        if op == "stale":
            bad = self.q.complete_many([(jid, self.leases[jid] + "x", None)])
            assert bad[0] in ("stale", "missing", "cancelled"), bad
        elif op == "complete":
            (status,) = self.q.complete_many([(jid, self.leases.pop(jid), None)])
            self.log.append(f"complete {jid} {status}")
            if status == "done":
                self.done.add(jid)
        elif op == "release":
            self.log.append(f"release {jid} {self.q.release([(jid, self.leases.pop(jid))])}")
        else:
            try:
                out = self.q.fail(jid, self.leases.pop(jid), ("E", "m", "")).status
            except (LeaseRefused, JobNotFound) as exc:
                out = type(exc).__name__
            self.log.append(f"fail {jid} {out}")

    def state(self, job_id: str) -> str:
        try:
            return self.q.get_job(job_id).state
        except JobNotFound:
            return "gone"

    def requeue(self) -> None:
        dead = self.q.dead_ids()
        if not dead:
            return
        pick = self.rnd.sample(dead, self.rnd.randint(1, len(dead)))
        for child in pick:
            ended = {p for p in self.parents.get(child, ()) if p not in pick}
            if any(self.state(p) in ("dead", "cancelled", "gone") for p in ended):
                self.excused.add(child)
        self.log.append(f"requeue {pick} {self.q.requeue_dead(pick)}")

    def step(self, step: int) -> None:
        op = self.rnd.choice(["enqueue", "enqueue", "debounce", "many", "claim", "claim",
                              "complete", "fail", "stale", "release", "cancel", "requeue",
                              "purge", "tick"])  # fmt: skip
        if op == "enqueue":
            self.enqueue(step)
        elif op == "debounce":
            self.debounce(step)
        elif op == "many":
            self.many(step)
        elif op == "claim":
            self.claim()
        elif op in ("complete", "fail", "stale", "release") and self.leases:
            self.settle(op)
        elif op == "cancel" and self.ids:
            jid = self.rnd.choice(self.ids)
            with contextlib.suppress(JobNotFound):  # purged
                self.log.append(f"cancel {jid} {self.q.cancel(jid)}")
        elif op == "requeue":
            self.requeue()
        elif op == "purge" and (dead := self.q.dead_ids()):
            self.log.append(f"purge {dead[0]} {self.q.purge_dead(dead[:1])}")
        elif op == "tick":
            self.now += self.rnd.choice([100, 1_000, 3_000])  # 3 s: past every lease
            self.clock.set_ms(self.now)

    def drain(self) -> None:
        for _ in range(200):
            self.now += 3_000
            self.clock.set_ms(self.now)
            got = self.q.claim("drain", limit=50, lease_ms=2_000).jobs
            for j in got:
                self.check_claimed(j.id)
                if self.q.complete_many([(j.id, j.token, None)]) == ["done"]:
                    self.done.add(j.id)
            if not got and self.q.counts().leased == 0:
                break
        counts = self.q.counts()
        assert (counts.due, counts.leased) == (0, 0), (counts, self.log)
        final = ("done", "dead", "cancelled", "gone")
        left = {i: s for i in self.ids if (s := self.state(i)) not in final}
        assert not left, (left, self.log)


@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", "30"))))
def test_dependencies_with_debounce_batches_cancels_and_requeues(
    tq: tuple[Queue, Clock], seed: int
) -> None:
    q, clock = tq
    clock.set_ms(T0)
    run = _Run(q, clock, seed)
    for step in range(200):
        run.step(step)
    run.drain()


def test_a_parent_cancelled_while_a_worker_runs_it_never_releases_its_children(
    redis_url: str, q: Queue
) -> None:
    """A real worker runs the parent (a sync handler that ignores the cancel); the cancel parks
    its subtree at once; the handler's return is refused by its token ('cancelled'), so no
    child is released early, none runs, and the worker says 'cancelled'."""
    registry = Registry()
    started, finish = threading.Event(), threading.Event()
    ran: list[str] = []
    outcomes: list[tuple[str, str]] = []

    @registry.task("parent")
    def parent(payload: Any, ctx: Any) -> str:
        started.set()
        finish.wait(20)
        return "late"

    @registry.task("child")
    def child(payload: Any, ctx: Any) -> None:
        ran.append(ctx.job_id)

    @registry.on_outcome
    def seen(o: JobOutcome) -> None:
        outcomes.append((o.ctx.job_id, o.outcome))

    p = q.enqueue("parent")
    c = q.enqueue("child", after=[p])
    g = q.enqueue("child", after=[c])
    other = q.enqueue("child")

    def cancel_when_running(worker: Worker) -> None:
        def go() -> None:
            if started.wait(20):
                assert q.cancel(p) == "leased"
            finish.set()

        threading.Thread(target=go, daemon=True).start()

    settings = WorkerSettings(queues=(q.name,), heartbeat_ms=50, lease_ms=1_000)
    assert run_until(
        redis_url, registry, settings, lambda: (p, "cancelled") in outcomes and other in ran,
        setup=cancel_when_running,
    )  # fmt: skip
    assert ran == [other]
    assert q.get_job(p).state == "cancelled"
    assert q.get_job(c).dead_reason == f"parent cancelled: {p}"
    assert q.get_job(g).dead_reason == f"parent dead: {c}"
    assert q.counts().due == 0 and q.counts().leased == 0


def test_jobs_show_names_the_parents_a_child_still_waits_for(q: Queue, redis_url: str) -> None:
    """A waiting child said only 'waiting for 2 jobs' (jobs show, --json): which ones took a
    redis-cli HGET. It now lists them while it waits (the count says how many are left)."""
    from click.testing import CliRunner

    from scheduler.cli.main import main

    a = q.enqueue("parent", None, job_id="pa")
    b = q.enqueue("parent", None, job_id="pb")
    child = q.enqueue("child", None, after=[a, b], job_id="kid")

    def shown() -> dict[str, Any]:
        run = CliRunner(env={"COLUMNS": "200"}).invoke(
            main, ["jobs", "show", child, "-q", q.name, "--url", redis_url, "--json"]
        )
        assert run.exit_code == 0, run.output
        return dict(json.loads(run.output))

    assert shown()["parents"] == ["pa", "pb"]
    assert shown()["flow"] == "waiting for 2 jobs"
    text = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, ["jobs", "show", child, "-q", q.name, "--url", redis_url]
    )
    assert "pa pb" in text.output
    [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert job.id == "pa"
    q.complete(job.id, job.token, None)
    assert shown()["parents"] == ["pa", "pb"]
    assert shown()["flow"] == "waiting for 1 jobs"
    [job] = q.claim("w", limit=1, lease_ms=10_000).jobs
    assert job.id == "pb"
    q.complete(job.id, job.token, None)
    assert shown()["parents"] is None and shown()["flow"] is None
