"""An operator's stop of a `--processes` pool's slot (`scheduler workers stop|quiet`: the child
exits EXIT_RETIRED / EXIT_QUIETED) against the supervisor's rolling reload (SIGHUP) in every
order, and what the pool's metrics say of a retired slot. The supervisor (Pool, worker_pool.py)
runs stand-in children: small scripts that say `ready` and exit with the code the test writes
for them, so each ordering is set up exactly, without Redis or timing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.worker_pool_child import EXIT_QUIETED, EXIT_RETIRED
from tests.fixtures.pools import kill_leftovers
from tests.test_worker_pool import alive
from tests.test_worker_pool_metrics import free_port, per_process, scrape
from tests.workers.procs import ROOT, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# The supervisor of worker_pool.py over the children given as JSON argv lists; with a port as
# its second argument it serves the pool's metrics there (PoolMetrics).
SUPERVISOR = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from scheduler.cli.worker_pool import Pool
from scheduler.cli.worker_pool_metrics import PoolMetrics
argv = json.loads(sys.argv[1])
metrics = PoolMetrics(int(sys.argv[2])) if len(sys.argv) > 2 else None
sys.exit(Pool(len(argv), argv, [dict(os.environ) for _ in argv], metrics).run())
"""

# A stand-in child of slot argv[2], its flags in the directory argv[1]: it says `ready` (and
# leaves `isready-<pid>`) at once, unless `hold-<slot>` exists, then once `ready-<pid>` does; it
# exits with the code in `exit-<pid>` once that exists; the supervisor's stop
# (SIGUSR1) leaves `stopped-<pid>` and ends it with 0, unless `linger-<pid>` exists (it runs on,
# as a worker finishing its jobs). It gives up after 120 s.
CHILD = """
import os, signal, sys, time
d, slot, pid = sys.argv[1], sys.argv[2], os.getpid()
def at(name):
    return os.path.join(d, name)
def on_stop(*_):
    open(at("stopped-%d" % pid), "w").close()
    if not os.path.exists(at("linger-%d" % pid)):
        os._exit(0)
signal.signal(signal.SIGUSR1, on_stop)
fd = int(os.environ["SCHEDULER_WORKER_READY_FD"])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if fd >= 0 and (not os.path.exists(at("hold-" + slot)) or os.path.exists(at("ready-%d" % pid))):
        os.write(fd, b"ready\\n")
        os.close(fd)
        fd = -1
        open(at("isready-%d" % pid), "w").close()
    if os.path.exists(at("exit-%d" % pid)):
        os._exit(int(open(at("exit-%d" % pid)).read()))
    time.sleep(0.02)
sys.exit(1)
"""


class Stand:
    """A supervisor of n stand-in children, its log and the children's flags."""

    def __init__(self, tmp: Path, n: int, metrics_port: int | None = None) -> None:
        self.dir, self.log = tmp / "flags", tmp / "pool.log"
        self.dir.mkdir()
        argv = [[sys.executable, "-c", CHILD, str(self.dir), str(i)] for i in range(n)]
        extra = [] if metrics_port is None else [str(metrics_port)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(self.log, "ab") as out:
            self.sup = subprocess.Popen(
                [sys.executable, "-c", SUPERVISOR, json.dumps(argv), *extra],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        wait_for(lambda: all(self.ready(self.pid(s, 0)) for s in range(n)), what="all ready")

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def pids(self, slot: int) -> list[int]:
        """The processes started in `slot` (from 0), oldest first."""
        found = re.findall(r"worker process (\d+) started \(pid (\d+)\)", self.text())
        return [int(pid) for n, pid in found if int(n) == slot + 1]

    def pid(self, slot: int, nth: int) -> int:
        wait_for(lambda: len(self.pids(slot)) > nth, what=f"process {nth} of slot {slot}")
        return self.pids(slot)[nth]

    def ready(self, pid: int) -> bool:
        return (self.dir / f"isready-{pid}").exists()

    def flag(self, name: str) -> None:
        (self.dir / name).touch()

    def exit_with(self, pid: int, code: int) -> None:
        tmp = self.dir / f"tmp-{pid}"
        tmp.write_text(str(code))
        tmp.rename(self.dir / f"exit-{pid}")

    def gone(self, pid: int, what: str) -> None:
        wait_for(lambda: not alive(pid), timeout_s=20, what=what)

    def retired(self, slot: int, pid: int, verb: str = "stop") -> None:
        line = (f"worker process {slot + 1} (pid {pid}) stopped by an operator "
                f"(scheduler workers {verb}): not replaced")  # fmt: skip
        wait_for(lambda: line in self.text(), what=f"slot {slot} retired")

    def reload(self) -> None:
        self.sup.send_signal(signal.SIGHUP)

    def exits(self) -> int:
        try:
            return self.sup.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the pool did not stop: " + self.text()[-3000:]) from None

    def end(self) -> None:
        if self.sup.poll() is None:
            self.sup.kill()
        self.sup.wait(10)
        kill_leftovers(self.log, {self.sup.pid})


@pytest.fixture
def stands(tmp_path: Path) -> Iterator[list[Stand]]:
    made: list[Stand] = []
    yield made
    for s in made:
        s.end()


def test_a_slot_stopped_while_its_new_process_starts_gets_no_new_process(
    tmp_path: Path, stands: list[Stand]
) -> None:
    """The operator's stop wins over the reload: the new process of the retired slot is stopped,
    not swapped in (it was, undoing the stop; and the pool then never saw every slot retired),
    and the reload goes on with the next slot."""
    p = Stand(tmp_path, 2)
    stands.append(p)
    old0, old1 = p.pid(0, 0), p.pid(1, 0)
    p.flag("hold-0")  # slot 0's new process starts but is not ready until told
    p.reload()
    new0 = p.pid(0, 1)
    p.exit_with(old0, EXIT_RETIRED)
    p.retired(0, old0)
    p.flag(f"ready-{new0}")
    p.gone(new0, "the retired slot's new process stopped")
    new1 = p.pid(1, 1)  # the reload went on with slot 1
    p.gone(old1, "slot 1's old process stopped once its new one was ready")
    assert len(p.pids(0)) == 2, p.text()
    p.exit_with(new1, EXIT_RETIRED)
    assert p.exits() == 0
    assert "0 of 2 processes left: the pool stops" in p.text()


def test_a_one_process_pool_stopped_during_a_reload_exits(
    tmp_path: Path, stands: list[Stand]
) -> None:
    """Its only slot retired while the reload's new process starts: the pool stops that one too
    and exits 0 (it waited for it forever: every slot retired, so no swap, and no stop sent)."""
    p = Stand(tmp_path, 1)
    stands.append(p)
    old0 = p.pid(0, 0)
    p.flag("hold-0")
    p.reload()
    new0 = p.pid(0, 1)
    p.exit_with(old0, EXIT_RETIRED)
    p.retired(0, old0)
    assert p.exits() == 0
    assert not alive(new0)


def test_a_new_process_stopped_by_an_operator_retires_its_slot(
    tmp_path: Path, stands: list[Stand]
) -> None:
    """The new process of a reload, not ready yet, exits for an operator's quiet (it runs under
    its slot's worker id, so the request was for the slot): the slot is retired and its old
    process stopped, not logged as a new process that failed to start (which ended the
    reload); the reload goes on with the next slot."""
    p = Stand(tmp_path, 2)
    stands.append(p)
    old0, old1 = p.pid(0, 0), p.pid(1, 0)
    p.flag("hold-0")
    p.reload()
    new0 = p.pid(0, 1)
    p.exit_with(new0, EXIT_QUIETED)
    p.retired(0, new0, "quiet")
    p.gone(old0, "the retired slot's old process stopped")
    new1 = p.pid(1, 1)
    p.gone(old1, "slot 1 replaced")
    p.exit_with(new1, EXIT_RETIRED)
    assert p.exits() == 0
    text = p.text()
    assert "failed to start" not in text, text
    assert len(p.pids(0)) == 2 and "0 of 2 processes left" in text, text


def test_a_slot_stopped_before_its_turn_is_skipped(tmp_path: Path, stands: list[Stand]) -> None:
    """A child still in the reload's queue, stopped by an operator, is not replaced when its
    turn comes; one stopped after it was swapped in retires its slot as any child does."""
    p = Stand(tmp_path, 2)
    stands.append(p)
    old0, old1 = p.pid(0, 0), p.pid(1, 0)
    p.flag("hold-0")
    p.reload()
    new0 = p.pid(0, 1)
    p.exit_with(old1, EXIT_RETIRED)
    p.retired(1, old1)
    p.flag(f"ready-{new0}")
    p.gone(old0, "slot 0 replaced")
    p.exit_with(new0, EXIT_QUIETED)  # the one swapped in
    p.retired(0, new0, "quiet")
    assert p.exits() == 0
    assert len(p.pids(1)) == 1, p.text()


def test_a_replaced_process_stopped_by_an_operator_retires_nothing(
    tmp_path: Path, stands: list[Stand]
) -> None:
    """The old process, already replaced and finishing its jobs, exits for an operator's stop:
    its slot has its new process, which runs on; the pool stops once that one is stopped."""
    p = Stand(tmp_path, 2)
    stands.append(p)
    old0 = p.pid(0, 0)
    p.flag(f"linger-{old0}")  # it finishes its "jobs" after the supervisor's stop
    p.reload()
    new0 = p.pid(0, 1)
    wait_for(lambda: (p.dir / f"stopped-{old0}").exists(), what="the old one asked to stop")
    p.exit_with(old0, EXIT_RETIRED)
    p.gone(old0, "the old process exited")
    new1 = p.pid(1, 1)
    p.exit_with(new1, EXIT_RETIRED)
    p.retired(1, new1)
    assert "1 of 2 processes left" in p.text()
    assert f"(pid {old0}) stopped by an operator" not in p.text()
    assert alive(new0) and p.sup.poll() is None
    p.exit_with(new0, EXIT_RETIRED)
    assert p.exits() == 0


def test_a_reload_after_a_slot_was_retired_leaves_it_retired(
    tmp_path: Path, stands: list[Stand]
) -> None:
    p = Stand(tmp_path, 2)
    stands.append(p)
    old0, old1 = p.pid(0, 0), p.pid(1, 0)
    p.exit_with(old0, EXIT_RETIRED)
    p.retired(0, old0)
    p.reload()
    new1 = p.pid(1, 1)
    p.gone(old1, "slot 1 replaced")
    assert "reload: replacing 1 worker processes" in p.text(), p.text()
    p.exit_with(new1, EXIT_QUIETED)
    assert p.exits() == 0
    assert len(p.pids(0)) == 1, p.text()


def test_a_retired_slot_is_not_a_process_down_in_the_metrics(
    tmp_path: Path, stands: list[Stand]
) -> None:
    """scheduler_pool_process_up has no sample for a retired slot (an alert on up == 0 would
    fire for a process stopped on purpose); scheduler_pool_process_retired says it is."""
    port = free_port()
    p = Stand(tmp_path, 2, metrics_port=port)
    stands.append(p)
    up = ("scheduler_pool_process_up", "scheduler_pool_process_up")
    retired = ("scheduler_pool_process_retired", "scheduler_pool_process_retired")
    wait_for(lambda: set(per_process(scrape(port), *up)) == {"0", "1"}, what="both slots")
    assert per_process(scrape(port), *retired) == {}
    p.exit_with(p.pid(0, 0), EXIT_RETIRED)
    p.retired(0, p.pid(0, 0))
    wait_for(lambda: per_process(scrape(port), *retired) == {"0": 1.0}, what="the retired gauge")
    assert set(per_process(scrape(port), *up)) == {"1"}
