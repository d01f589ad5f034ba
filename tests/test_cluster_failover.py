"""kill -9 of the primary owning a queue's slot, while a producer enqueues with wait_replicas=1
and a worker drains: both recover by themselves and no acknowledged job is lost. Own cluster
(the kill would break a shared one); cluster-node-timeout 5 s as in production defaults.

The measured times are printed (`pytest -s`), never asserted; docs/durability.md has them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scheduler import NotDurable, Queue
from scheduler._spawn import RedisProcess
from scheduler._spawn_cluster import LocalCluster
from tests.redis_server import require_server
from tests.workers.procs import spawn_worker, stop_all, wait_for

pytestmark = pytest.mark.slow


class Producer(threading.Thread):
    """Enqueues j0, j1, ... with wait_replicas=1; an id is retried until Redis answers (the
    same id again is idempotent). `acked`: WAIT confirmed a replica has it; `not_durable`:
    accepted by the primary only (NotDurable)."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.q = Queue.from_url(url, queue, wait_replicas=1, wait_timeout_ms=300)
        self.acked: list[str] = []
        self.not_durable: list[str] = []
        self.errors = 0
        self.last_error_s = 0.0
        self.answers: list[tuple[float, str]] = []  # (monotonic, 'acked' | 'not_durable')
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            job_id = f"j{i}"
            try:
                self.q.enqueue("noop", None, job_id=job_id)
            except NotDurable:
                self.not_durable.append(job_id)
                self.answers.append((time.monotonic(), "not_durable"))
            except Exception:  # the primary is gone: connection refused, CLUSTERDOWN, ...
                self.errors += 1
                self.last_error_s = time.monotonic()
                time.sleep(0.05)
                continue
            else:
                self.acked.append(job_id)
                self.answers.append((time.monotonic(), "acked"))
            i += 1
            time.sleep(0.005)


def test_primary_killed_producer_and_worker_recover_and_no_acked_job_is_lost(
    tmp_path: Path,
) -> None:
    with LocalCluster(require_server("a local Redis Cluster"), node_timeout_ms=5000) as cluster:
        name = "failover"
        check = Queue.from_url(cluster.url, name)
        primary = cluster.primary_for(check.keys.prefix)
        producer = Producer(cluster.url, name)
        worker = spawn_worker(cluster.url, name, "--lease-ms", "3000", "--heartbeat-ms", "1000",
                              log=str(tmp_path / "worker.log"))  # fmt: skip
        try:
            producer.start()
            wait_for(lambda: len(producer.acked) >= 200, what="jobs acknowledged before")
            wait_for(lambda: check.counts().due < 50, what="the worker draining")
            before = len(producer.acked)
            # LocalCluster makes node i + primaries the replica of primary i.
            replica = cluster.nodes[cluster.nodes.index(primary) + cluster.primaries]
            primary.kill()  # returns once the process is gone: later answers are the new one's
            killed_s = time.monotonic()
            promoted = _Promotion(cluster, replica)
            promoted.start()
            # The shard's replica is promoted; until the dead node comes back it has no
            # replica, so each acknowledgement is NotDurable (accepted, not replicated).
            wait_for(lambda: _answered_after(producer, killed_s), 60, "the producer recovered")
            producer_s = min(t for t, _ in producer.answers if t > killed_s) - killed_s
            assert producer.answers[-1][1] == "not_durable"
            # The worker drains what the new primary took meanwhile.
            after_kill = [j for t, j in _answers_with_ids(producer) if t > killed_s]
            try:
                wait_for(lambda: _quiet(lambda: check.status(after_kill[0]) == "done"), 60,
                         what="the worker recovered")  # fmt: skip
            except AssertionError as exc:  # once seen under CI load: say what the worker did
                log = (tmp_path / "worker.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"{exc}; worker alive: {worker.poll() is None}; "
                                     f"status: {_said(lambda: check.status(after_kill[0]))}; "
                                     f"counts: {_said(check.counts)}\n{log}") from None  # fmt: skip
            worker_s = time.monotonic() - killed_s
            # The old primary comes back as a replica of the new one: durable again.
            primary.start()
            wait_for(lambda: producer.answers[-1][1] == "acked", 60, "a replica again")
            producer.stop.set()
            producer.join(10)
            acked = list(producer.acked)
            wait_for(lambda: _quiet(lambda: check.counts().due + check.counts().leased == 0), 60,
                     what="the backlog drained")  # fmt: skip
            lost = [j for j in acked if check.status(j) != "done"]
            promoted.join(1)
            promoted_s = promoted.at_s - killed_s
            print(
                f"\nfailover: {before} acked before the kill; replica promoted {promoted_s:.1f}s "
                f"after it; producer answered again {producer_s:.1f}s after the kill, the worker "
                f"ran a job enqueued after it {worker_s:.1f}s after the kill; "
                f"{len(producer.not_durable)} NotDurable while the shard had no replica; "
                f"{producer.errors} failed calls; {len(acked)} acked, {len(lost)} not done"
            )
            assert lost == []
            assert worker.poll() is None  # it never gave up
        finally:
            producer.stop.set()
            stop_all([worker])
            check.client.close()


class _Promotion(threading.Thread):
    """When the replica says it is a primary (ROLE polled every 20 ms)."""

    def __init__(self, cluster: LocalCluster, replica: RedisProcess) -> None:
        super().__init__(daemon=True)
        self.cluster, self.replica, self.at_s = cluster, replica, float("nan")

    def run(self) -> None:
        with self.cluster.node_client(self.replica) as c:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if str(c.execute_command("ROLE")[0]) == "master":
                    self.at_s = time.monotonic()
                    return
                time.sleep(0.02)


def _quiet(pred: Callable[[], bool]) -> bool:
    """pred(), False while the cluster still answers errors (this client refreshes then)."""
    try:
        return pred()
    except Exception:
        return False


def _said(call: Callable[[], object]) -> str:
    try:
        return repr(call())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _answered_after(producer: Producer, t: float) -> bool:
    return any(at > t for at, _ in producer.answers)


def _answers_with_ids(producer: Producer) -> list[tuple[float, str]]:
    """(time, job id) of each answer: ids are j0, j1, ... in answer order."""
    return [(t, f"j{i}") for i, (t, _) in enumerate(producer.answers)]
