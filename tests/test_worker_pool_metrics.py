"""`scheduler worker --processes N --metrics-port P`: one endpoint, served by the supervisor, with
every child's samples labelled process="<slot>" (scheduler/cli/worker_pool_metrics.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from scheduler import Queue
from scheduler.cli.worker_pool_child import parse_ready, ready_message
from scheduler.cli.worker_pool_metrics import relabel_merge
from tests.test_worker_pool import (
    alive,
    children,
    ledger_pids,
    spawn_pool,
    stop,
    wait_started,
)
from tests.workers.procs import wait_for

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Tests fetch 127.0.0.1 directly, whatever http_proxy the environment sets.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

SLOT0 = """# HELP jobs_total Jobs.
# TYPE jobs_total counter
jobs_total{queue="a",outcome="done"} 3.0
# HELP in_flight Running now.
# TYPE in_flight gauge
in_flight 1.0
# HELP run_seconds Run time.
# TYPE run_seconds histogram
run_seconds_bucket{le="0.1"} 1.0
run_seconds_bucket{le="+Inf"} 2.0
run_seconds_count 2.0
run_seconds_sum 0.75
"""
SLOT1 = """# HELP jobs_total Jobs.
# TYPE jobs_total counter
jobs_total{queue="a",outcome="done"} 5.0
jobs_total{queue="b",outcome="done"} 7.0
# HELP in_flight Running now.
# TYPE in_flight gauge
in_flight{process="mine"} 2.0
# HELP run_seconds Run time.
# TYPE run_seconds histogram
run_seconds_bucket{le="0.1"} 0.0
run_seconds_bucket{le="+Inf"} 4.0
run_seconds_count 4.0
run_seconds_sum 9.5
"""


def _samples(fam: Metric) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}


def test_relabel_merge_gives_one_family_per_name_with_each_process_labelled() -> None:
    fams = {f.name: f for f in relabel_merge({0: SLOT0, 1: SLOT1})}
    assert sorted(fams) == ["in_flight", "jobs", "run_seconds"]
    assert (fams["jobs"].type, fams["in_flight"].type, fams["run_seconds"].type) == (
        "counter", "gauge", "histogram",
    )  # fmt: skip
    p0, p1 = ("process", "0"), ("process", "1")
    assert _samples(fams["jobs"]) == {
        ("jobs_total", (("outcome", "done"), p0, ("queue", "a"))): 3.0,
        ("jobs_total", (("outcome", "done"), p1, ("queue", "a"))): 5.0,
        ("jobs_total", (("outcome", "done"), p1, ("queue", "b"))): 7.0,
    }
    # A child's own `process` label is kept, renamed, never overwritten.
    assert _samples(fams["in_flight"]) == {
        ("in_flight", (p0,)): 1.0,
        ("in_flight", (("exported_process", "mine"), p1)): 2.0,
    }
    assert _samples(fams["run_seconds"]) == {
        ("run_seconds_bucket", (("le", "0.1"), p0)): 1.0,
        ("run_seconds_bucket", (("le", "+Inf"), p0)): 2.0,
        ("run_seconds_count", (p0,)): 2.0,
        ("run_seconds_sum", (p0,)): 0.75,
        ("run_seconds_bucket", (("le", "0.1"), p1)): 0.0,
        ("run_seconds_bucket", (("le", "+Inf"), p1)): 4.0,
        ("run_seconds_count", (p1,)): 4.0,
        ("run_seconds_sum", (p1,)): 9.5,
    }
    # Rendered by prometheus_client: one HELP/TYPE per family, and it reads back the same.
    registry = CollectorRegistry()
    registry.register(_Fixed(list(fams.values())))
    text = generate_latest(registry).decode()
    assert text.count("# TYPE jobs_total counter") == 1
    assert text.count("# TYPE run_seconds histogram") == 1
    again = {f.name: _samples(f) for f in text_string_to_metric_families(text)}
    assert again == {name: _samples(f) for name, f in fams.items()}


def test_relabel_merge_leaves_out_what_would_make_the_exposition_invalid() -> None:
    other_type = "# TYPE in_flight counter\nin_flight_total 4.0\n"
    fams = {f.name: f for f in relabel_merge({0: SLOT0, 1: other_type, 2: "not { metrics"})}
    assert _samples(fams["in_flight"]) == {("in_flight", (("process", "0"),)): 1.0}
    assert {s.labels["process"] for s in fams["jobs"].samples} == {"0"}


QUEUE_SLOT0 = """\
# HELP scheduler_queue_jobs Jobs per place
# TYPE scheduler_queue_jobs gauge
scheduler_queue_jobs{queue="a",state="due"} 3.0
scheduler_queue_jobs{queue="a",state="leased"} 1.0
# HELP scheduler_queue_held_jobs Held
# TYPE scheduler_queue_held_jobs gauge
"""
QUEUE_SLOT1 = """\
# HELP scheduler_queue_jobs Jobs per place
# TYPE scheduler_queue_jobs gauge
scheduler_queue_jobs{queue="a",state="due"} 4.0
scheduler_queue_jobs{queue="a",state="leased"} 2.0
# HELP scheduler_queue_held_jobs Held
# TYPE scheduler_queue_held_jobs gauge
scheduler_queue_held_jobs{queue="a",reason="waiting"} 6.0
"""


def test_queue_gauges_are_served_once_without_a_process_label() -> None:
    # Every process reads the same queue: summing N copies would count its jobs N times. The
    # lowest slot with samples answers (slot 0 has no held sample yet: slot 1's is taken).
    fams = {f.name: f for f in relabel_merge({1: QUEUE_SLOT1, 0: QUEUE_SLOT0 + SLOT0})}
    assert _samples(fams["scheduler_queue_jobs"]) == {
        ("scheduler_queue_jobs", (("queue", "a"), ("state", "due"))): 3.0,
        ("scheduler_queue_jobs", (("queue", "a"), ("state", "leased"))): 1.0,
    }
    assert _samples(fams["scheduler_queue_held_jobs"]) == {
        ("scheduler_queue_held_jobs", (("queue", "a"), ("reason", "waiting"))): 6.0,
    }
    assert {s.labels["process"] for s in fams["jobs"].samples} == {"0"}  # others still labelled


def test_the_ready_message_names_the_metrics_port_or_none() -> None:
    assert parse_ready(ready_message(41234)) == 41234
    assert ready_message(None) == b"ready\n" and parse_ready(ready_message(None)) is None


class _Fixed:
    def __init__(self, fams: list[Metric]) -> None:
        self.fams = fams

    def collect(self) -> list[Metric]:
        return self.fams


# -- a real pool -------------------------------------------------------------------------------


def free_port() -> int:
    """A port free on every interface, for --metrics-port: the pool's endpoint binds 0.0.0.0
    (checked below), which fails when any address holds the port. tests/redis_server.py's
    free_port checks 127.0.0.1 only: right for a server or client on loopback, not for this."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, Metric]:
    """One scrape of the pool's endpoint, parsed (30 s: a timeout only to detect a hang)."""
    with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    fams = list(text_string_to_metric_families(text))
    assert len({f.name for f in fams}) == len(fams), "a family twice: " + text
    return {f.name: f for f in fams}


def per_process(
    fams: dict[str, Metric], family: str, sample: str, **labels: str
) -> dict[str, float]:
    """Sum of the matching samples by their process label."""
    out: dict[str, float] = {}
    for s in fams[family].samples if family in fams else []:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            out[s.labels["process"]] = out.get(s.labels["process"], 0.0) + s.value
    return out


def in_flight(fams: dict[str, Metric]) -> set[str]:
    """The processes with a scheduler_jobs_in_flight sample (every worker has one)."""
    return set(per_process(fams, "scheduler_jobs_in_flight", "scheduler_jobs_in_flight"))


def answering(port: int) -> set[str]:
    """in_flight of a scrape; nothing while the pool has not bound its port yet."""
    try:
        return in_flight(scrape(port))
    except urllib.error.URLError:
        return set()


def slots(log: Path) -> dict[int, int]:
    """pid -> slot (0-based) of every worker process the pool's log says it started."""
    found = re.findall(r"worker process (\d+) started \(pid (\d+)\)", log.read_text())
    return {int(pid): int(n) - 1 for n, pid in found}


def child_ports(log: Path) -> list[int]:
    return [int(p) for p in re.findall(r"metrics on 127\.0\.0\.1:(\d+)/metrics", log.read_text())]


def listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} show them) listening on `port`."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                out.add(addr)
    return out


def pool_of_two(redis_url: str, q: Queue, pool_log: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """A pool of 2 on a free metrics port, once both slots answer a scrape (stopped by the
    caller)."""
    port = free_port()
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--metrics-port", str(port),
                      log=pool_log)  # fmt: skip
    try:
        wait_started(pool_log)
        wait_for(lambda: answering(port) == {"0", "1"}, what="both slots scraped")
    except BaseException:
        stop(pool, pool_log)
        raise
    return port, pool


@linux_only
def test_one_scrape_of_the_pool_has_every_processs_jobs(
    redis_url: str, client: redis.Redis, q: Queue, pool_log: Path
) -> None:
    port = free_port()
    pool = spawn_pool(redis_url, q.name, "--processes", "2", "--batch", "5", "--concurrency", "2",
                      "--metrics-port", str(port), log=pool_log)  # fmt: skip
    try:
        wait_for(lambda: answering(port) == {"0", "1"}, what="both processes ready")
        ids = [q.enqueue("sync_sleep", {"s": 0.05}) for _ in range(40)]
        wait_for(lambda: all(q.status(i) == "done" for i in ids), timeout_s=60, what="all done")
        seen: dict[str, dict[str, float]] = {}

        def counted() -> bool:
            seen["done"] = per_process(scrape(port), "scheduler_jobs", "scheduler_jobs_total",
                                       queue=q.name, outcome="done")  # fmt: skip
            return sum(seen["done"].values()) >= 40

        wait_for(counted, what="the done counters in one scrape")
        done = seen["done"]
        pid_slot = slots(pool_log)
        ran = {str(pid_slot[pid]) for pid in ledger_pids(client, q)}
        assert {p for p, n in done.items() if n > 0} == ran, (done, ran)
        assert ran == {"0", "1"}  # both ran some (as in the pool's own test): both labelled
        assert sum(done.values()) == 40
        fams = scrape(port)
        up = per_process(fams, "scheduler_pool_process_up", "scheduler_pool_process_up")
        assert up == {"0": 1.0, "1": 1.0}

        # The queue's own gauges once, unlabelled: one sample per state (due, leased, ...).
        def depth_now() -> list[Sample]:
            fam = scrape(port).get("scheduler_queue_jobs")
            return [s for s in fam.samples if s.labels["queue"] == q.name] if fam else []

        wait_for(lambda: bool(depth_now()), what="the queue's depth read once")
        depth = depth_now()
        assert all("process" not in s.labels for s in depth), depth
        assert len({s.labels["state"] for s in depth}) == len(depth), depth
        # The children: loopback only, each on a port of its own, not the pool's.
        ports = child_ports(pool_log)
        assert len(set(ports)) == 2 and port not in ports, ports
        for p in ports:
            assert listening(p) == {"0100007F"}, (p, listening(p))
        assert listening(port) == {"00000000"}  # the pool's: every interface, as one worker's
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-3000:]


@linux_only
def test_after_a_reload_the_endpoint_serves_the_new_processes(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    port, pool = pool_of_two(redis_url, q, pool_log)
    try:
        old = children(pool.pid)
        pool.send_signal(signal.SIGHUP)
        wait_for(lambda: len(children(pool.pid)) == 2 and not set(children(pool.pid)) & set(old),
                 timeout_s=40, what="both children replaced")  # fmt: skip
        wait_for(lambda: not any(alive(pid) for pid in old), timeout_s=30, what="old ones gone")
        fams = scrape(port)  # only the new processes are alive to answer
        assert in_flight(fams) == {"0", "1"}
        up = per_process(fams, "scheduler_pool_process_up", "scheduler_pool_process_up")
        assert up == {"0": 1.0, "1": 1.0}
        # The new processes' counters (from 0): the one job run after the reload.
        job = q.enqueue("echo", {"n": 1})
        wait_for(lambda: q.status(job) == "done", what="the job done")
        wait_for(lambda: sum(per_process(scrape(port), "scheduler_jobs", "scheduler_jobs_total",
                                         queue=q.name, outcome="done").values()) == 1,
                 what="the new processes' count")  # fmt: skip
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-3000:]


@linux_only
def test_a_process_that_does_not_answer_is_left_out_of_the_scrape(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    port, pool = pool_of_two(redis_url, q, pool_log)
    try:
        stopped = next(pid for pid, slot in slots(pool_log).items() if slot == 0)
        os.kill(stopped, signal.SIGSTOP)
        try:
            fams = scrape(port)
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert in_flight(fams) == {"1"}
        up = per_process(fams, "scheduler_pool_process_up", "scheduler_pool_process_up")
        assert up == {"0": 0.0, "1": 1.0}
        assert "metrics of worker process 1 left out of this scrape" in pool_log.read_text()
        wait_for(lambda: in_flight(scrape(port)) == {"0", "1"}, what="slot 0 answering again")
    finally:
        code = stop(pool, pool_log)
    assert code == 0, pool_log.read_text()[-3000:]


def test_a_taken_port_fails_the_pool_as_it_fails_one_worker(
    redis_url: str, q: Queue, pool_log: Path
) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        pool = spawn_pool(redis_url, q.name, "--processes", "2", "--metrics-port", str(port),
                          log=pool_log)  # fmt: skip
        try:
            code = pool.wait(60)
        except subprocess.TimeoutExpired:
            stop(pool, pool_log)
            raise
    log = pool_log.read_text()
    assert code == 1, log
    assert f"error: cannot serve metrics on port {port}: Address already in use" in log
    assert "started (pid" not in log  # bound before any child starts
