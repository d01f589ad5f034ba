"""faulthandler has one timer per process: the stall watchdog's GIL backstop
(scheduler/cli/stall_watchdog.py) and an app's own dump_traceback_later (its registry's, a
handler's) must not cancel each other. Each case runs in a process of its own (pytest's own
faulthandler is not in the way), with the watchdog re-arming every 0.05 s instead of 5 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.procs import ROOT

_SCRIPT = """
import asyncio, faulthandler, json, sys, time
from pathlib import Path
from scheduler.cli import stall_watchdog as sw

sw.TICK_S = sw._REARM_S = 0.05
case, dump = sys.argv[1], Path(sys.argv[2])
out = dump.open("w")
GUARD_S = 20.0  # a hang guard only: a timer that was not cancelled fires after 1 s


async def dumped() -> bool:
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline and dump.stat().st_size == 0:
        await asyncio.sleep(0.05)
    return dump.stat().st_size > 0


async def until(what, guard_s=GUARD_S) -> bool:
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline and not what():
        await asyncio.sleep(0.05)
    return what()


async def main() -> dict:
    dog = sw.StallWatchdog(asyncio.get_running_loop(), lease_s=60)
    dog.start()
    seen = {"ours_at_start": await until(lambda: sw._TIMER._ours)}
    await asyncio.sleep(0.3)  # the backstop re-armed a few times
    if case == "rearm":  # the app's one-shot timer, the watchdog running on
        faulthandler.dump_traceback_later(1.0, file=out)
        seen["fired"] = await dumped()
        seen["ours_after_it_fired"] = await until(lambda: sw._TIMER._ours)
    elif case == "stop":  # the worker stops while the app's timer is armed
        faulthandler.dump_traceback_later(1.0, file=out)
        dog.stop()
        seen["fired"] = await dumped()
    elif case == "cancel":  # the app's repeating timer, then cancelled
        faulthandler.dump_traceback_later(3600, repeat=True, file=out)
        await asyncio.sleep(0.5)  # ten re-arm intervals
        seen["ours_while_theirs"] = sw._TIMER._ours
        faulthandler.cancel_dump_traceback_later()
        seen["ours_after_cancel"] = await until(lambda: sw._TIMER._ours)
    dog.stop()
    seen["unwrapped"] = faulthandler.dump_traceback_later is sw._TIMER._real[0]
    return seen


print(json.dumps(asyncio.run(main())))
"""


def _run(case: str, tmp_path: Path) -> dict[str, bool]:
    dump = tmp_path / "dump.txt"
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, case, str(dump)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out
    seen: dict[str, bool] = json.loads(out.stdout.splitlines()[-1])
    assert seen.pop("ours_at_start") and seen.pop("unwrapped"), seen
    return seen


def test_an_apps_timer_is_not_replaced_by_the_watchdogs_rearm(tmp_path: Path) -> None:
    """Before: the backstop's next re-arm replaced the app's timer, whose dump never came.
    Now it is left alone until it has fired, and the backstop is armed again after."""
    seen = _run("rearm", tmp_path)
    assert seen == {"fired": True, "ours_after_it_fired": True}, seen
    assert "Thread" in (tmp_path / "dump.txt").read_text(), "the app's own dump"


def test_the_watchdogs_stop_does_not_cancel_an_apps_timer(tmp_path: Path) -> None:
    """Before: the watchdog's stop cancelled faulthandler's timer, the app's too."""
    assert _run("stop", tmp_path) == {"fired": True}


def test_the_backstop_stands_down_while_an_apps_timer_repeats_and_is_back_after(
    tmp_path: Path,
) -> None:
    """A repeating timer is the app's until it cancels it; then the backstop is armed again
    (a handler holding the GIL still ends the process)."""
    seen = _run("cancel", tmp_path)
    assert seen == {"ours_while_theirs": False, "ours_after_cancel": True}, seen


@pytest.mark.parametrize("bad", [0, -1])
def test_an_apps_bad_timeout_is_refused_as_faulthandler_does(bad: float) -> None:
    """The wrapper is faulthandler's own for the app: a bad timeout raises its ValueError and
    leaves the backstop's state as it was."""
    from scheduler.cli import stall_watchdog as sw

    timer = sw._Timer()
    with pytest.raises(ValueError):
        timer._their_dump(bad)
    assert timer._theirs_until is None
