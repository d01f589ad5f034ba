"""The restart plan of a `--processes` pool's child (worker_pool.py, Pool._reap), driven with
the stand-in children of tests/test_pool_retire.py: each exits with the code the test writes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_pool_retire import Stand
from tests.workers.procs import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    p = Stand(tmp_path, 1)
    yield p
    p.end()


def _line_of(p: Stand, pid: int) -> str:
    """The supervisor's log line about pid's exit."""
    wait_for(lambda: f"(pid {pid}) " in p.text(), what=f"the exit of {pid} logged")
    return next(line for line in p.text().splitlines() if f"(pid {pid}) " in line)


def test_a_restarted_child_that_exits_0_before_it_is_ready_backs_off(stand: Stand) -> None:
    """A restarted child that exits 0 without ever saying ready (its registry's import calls
    sys.exit(), say) did not stop for --max-jobs / --max-memory-mb, which only a ready worker
    reaches. Before: logged as 'stopped cleanly (--max-jobs/-memory-mb)' and started again
    after 1 s, for ever, with no backoff (a first start exiting so already failed the pool).
    Now it is a failed start: restarted with the crash backoff, doubling."""
    p = stand
    first = p.pid(0, 0)
    p.flag("hold-0")  # the processes started from now on never say ready
    p.exit_with(first, 1)  # a crash once ready: restarted in 1 s, then 2 s
    assert "exited with code 1; restarting in 1.0 s" in _line_of(p, first)
    second = p.pid(0, 1)
    p.exit_with(second, 0)
    line = _line_of(p, second)
    assert "exited with code 0; restarting in 2.0 s" in line, p.text()
    third = p.pid(0, 2)
    p.exit_with(third, 0)
    assert "exited with code 0; restarting in 4.0 s" in _line_of(p, third), p.text()
    assert p.sup.poll() is None  # a restart, not the pool's failure
