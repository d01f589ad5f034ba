"""kill -9 of a durable redis-server (appendonly yes, appendfsync always) at random moments while
enqueuers and a claim/complete loop run; restarted on the same data dir. Every id an enqueue
returned must exist afterwards and end exactly once in done or dead; the clients reconnect by
themselves (redis-py Retry), so no error reaches them."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from scheduler import Backoff, JobCancelled, Queue, StaleToken
from tests.faults.conftest import Server, retrying_client
from tests.workers.procs import wait_for

QUICK_RETRY = Backoff(base_ms=20, factor=2.0, cap_ms=200, jitter=0.0)


class Run:
    """Shared bookkeeping of one crash run (appended to by several threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[str] = []
        self.completed: Counter[str] = Counter()  # complete() returned normally
        self.claims = 0
        self.refused: Counter[str] = Counter()  # expected protocol answers, not errors
        self.errors: list[BaseException] = []
        self.stop_enqueue = threading.Event()
        self.stop_work = threading.Event()

    def guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                with self.lock:
                    self.errors.append(exc)

        return run


def enqueuer(q: Queue, run: Run, seed: int) -> None:
    rng = random.Random(seed)
    n = 0
    while not run.stop_enqueue.is_set():
        jid = q.enqueue("crash.t", {"n": n, "seed": seed}, max_attempts=3, backoff=QUICK_RETRY,
                        delay_ms=rng.choice([0, 0, 0, 50]))  # fmt: skip
        with run.lock:
            run.ids.append(jid)
        n += 1
        time.sleep(0.002)


def worker(q: Queue, run: Run, wid: str, seed: int) -> None:
    rng = random.Random(seed)
    while not run.stop_work.is_set():
        batch = q.claim(wid, limit=10, lease_ms=1_000)
        with run.lock:
            run.claims += len(batch.jobs)
        if not batch.jobs:
            time.sleep(0.01)
        for job in batch.jobs:
            try:
                if rng.random() < 0.15:
                    q.fail(job.id, job.token, ("Flaky", "handler failed", ""))
                else:
                    q.complete(job.id, job.token, {"ok": job.id})
                    with run.lock:
                        run.completed[job.id] += 1
            except (StaleToken, JobCancelled) as exc:
                # The lease lapsed while the server was down and another claim took the job.
                with run.lock:
                    run.refused[type(exc).__name__] += 1


@pytest.mark.parametrize("seed", [7, 11])
def test_kill_9_during_load_loses_nothing(durable_server: Server, seed: int) -> None:
    server = durable_server
    rng = random.Random(seed)
    run = Run()
    queues = [Queue(retrying_client(server), "crash") for _ in range(4)]
    threads = [
        threading.Thread(target=run.guard(lambda: enqueuer(queues[0], run, 1))),
        threading.Thread(target=run.guard(lambda: enqueuer(queues[1], run, 2))),
        threading.Thread(target=run.guard(lambda: worker(queues[2], run, "w1", 3))),
        threading.Thread(target=run.guard(lambda: worker(queues[3], run, "w2", 4))),
    ]
    for t in threads:
        t.start()
    kills = 0
    try:
        for _ in range(6):
            time.sleep(rng.uniform(0.2, 0.9))
            server.restart(hard=True)
            kills += 1
        time.sleep(0.3)
        run.stop_enqueue.set()
        for t in threads[:2]:  # every enqueue has returned before the drain is judged
            t.join(timeout=60)
        admin = server.admin()
        q = Queue(admin, "crash")

        def settled() -> bool:
            c = q.counts()
            return c.due + c.scheduled + c.leased == 0

        wait_for(lambda: bool(run.errors) or settled(), timeout_s=90, what="queue drained")
    finally:
        run.stop_enqueue.set()
        run.stop_work.set()
        for t in threads:
            t.join(timeout=30)

    assert run.errors == [], f"errors reached the clients: {run.errors[:3]!r}"
    states: Counter[str] = Counter()
    lost = []
    pipe = admin.pipeline(transaction=False)
    for jid in run.ids:
        pipe.hget(q.keys.job(jid), "state")
    for jid, state in zip(run.ids, pipe.execute(), strict=True):
        states[state] += 1
        if state not in ("done", "dead"):
            lost.append((jid, state))
    dead_list = admin.zrange(q.keys.dead, 0, -1)
    done = {j for j in run.ids if run.completed[j]}
    print(f"\ncrash run seed={seed}: kills={kills} jobs={len(run.ids)} states={dict(states)} "
          f"claims={run.claims} refused={dict(run.refused)} losses={len(lost)}")  # fmt: skip
    assert len(set(run.ids)) == len(run.ids)
    assert lost == [], f"{len(lost)} jobs lost or stuck, e.g. {lost[:3]}"
    assert len(dead_list) == len(set(dead_list)) == states["dead"]
    assert set(dead_list).isdisjoint(done)
    # Exactly one successful complete per done job, none for a dead one.
    assert all(run.completed[j] == 1 for j in done)
    assert states["done"] == len(done)
    assert kills == 6 and server.restarts == 6
