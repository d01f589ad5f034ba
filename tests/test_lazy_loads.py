"""The subpackages' lazy `__getattr__`s (scheduler/_lazy.py): importing a subpackage loads none of
its modules, an attribute read loads one, a misspelt name is an AttributeError, and the lock
shared by every lazy load never hangs a thread importing the package's modules the plain way
while others read lazy names (`from scheduler.core import codec` is left to the import system)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("admin", "client", "core", "operations", "schedules", "worker")


def _fresh(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_subpackage_loads_no_module_until_one_is_read() -> None:
    out = _fresh(
        f"""
        import json, sys
        import scheduler
        for name in {PACKAGES!r}:
            getattr(scheduler, name)
        before = sorted(m for m in sys.modules if m.startswith("scheduler."))
        codec = scheduler.core.codec
        bad = []
        for pkg in (scheduler.core, scheduler.client):
            try:
                pkg.nope
            except AttributeError as exc:
                bad.append("nope" in str(exc))
        print(json.dumps([before, codec is sys.modules["scheduler.core.codec"], bad]))
        """
    )
    before, same, bad = json.loads(out.splitlines()[-1])
    packages = {f"scheduler.{p}" for p in PACKAGES}
    # The worker package imports its settings (and what they need) eagerly, as before.
    assert packages | {"scheduler._lazy"} <= set(before)
    assert [m for m in before if m.startswith(("scheduler.client.", "scheduler.operations."))] == []
    assert same is True and bad == [True, True]


_MIXED = """
import importlib, os, threading, time, scheduler
plain = ["scheduler.client.queue", "scheduler.operations.producing", "scheduler.worker.registry",
         "scheduler.admin.doctor", "scheduler.client.partitioned", "scheduler.worker.runtime",
         "scheduler.operations.leasing", "scheduler.schedules.stored"] * 4
jobs = [(getattr, (scheduler, n)) for n in scheduler.__all__ * 2]
jobs += [(importlib.import_module, (m,)) for m in plain]
barrier = threading.Barrier(len(jobs))
def run(call, args):
    barrier.wait()
    try:
        call(*args)
    except BaseException:  # plain imports racing may see partial modules (importlib's own): no hang
        pass
ts = [threading.Thread(target=run, args=j, daemon=True) for j in jobs]
for t in ts: t.start()
end = time.monotonic() + 60
for t in ts: t.join(max(0.0, end - time.monotonic()))
print(sum(t.is_alive() for t in ts), flush=True)
os._exit(0)
"""


def test_plain_imports_racing_lazy_reads_never_hang_in_fresh_processes() -> None:
    """With the lock taken in `from scheduler.core import codec`'s hasattr, every run here left
    over 100 threads waiting for each other (the lock against a module lock) for good."""
    for _ in range(3):
        assert _fresh(_MIXED).strip() == "0"
