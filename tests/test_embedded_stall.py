"""docs/guide/workers.md "An embedded worker's bounds": an embedded worker has no stall
watchdog (the app owns its process), and the doc's recipe for an app's own ends a process whose
loop a handler holds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import Queue

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs/guide/workers.md"

_APP = """
import asyncio, os, time
from scheduler import AsyncQueue
from scheduler.worker import Worker, WorkerSettings
from scheduler.worker.registry import Registry

registry = Registry()


@registry.task(name="hold_loop")
async def hold_loop(payload, ctx):
    time.sleep(3600)  # a blocking call in an async def: the loop is held


async def main() -> None:
    async with AsyncQueue.from_url(os.environ["REDIS_URL"], os.environ["QUEUE"]) as q:
        worker = Worker(q.client, registry, WorkerSettings(queues=(q.name,)))
        if os.environ["WATCHDOG"] == "1":
            asyncio.create_task(stall_watchdog(2))
        await worker.run(install_signals=False)


asyncio.run(main())
"""


def _recipe() -> str:
    section = GUIDE.read_text().split("## An embedded worker's bounds", 1)[1].split("\n## ")[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(block)


@pytest.mark.parametrize("watchdog", [True, False])
def test_the_docs_watchdog_ends_an_app_whose_loop_a_handler_holds(
    redis_url: str, q: Queue, tmp_path: Path, watchdog: bool
) -> None:
    """With the recipe: exit 1 and the held handler's frame on stderr. Without: still running
    (what the doc says of an embedded worker), ended by the test."""
    app = tmp_path / "app.py"
    app.write_text(_recipe() + _APP)
    q.enqueue("hold_loop", {})
    env = dict(os.environ, REDIS_URL=redis_url, QUEUE=q.name, WATCHDOG=str(int(watchdog)),
               PYTHONPATH=str(ROOT))  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(app)], env=env, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=60 if watchdog else 8)
    except subprocess.TimeoutExpired:
        assert not watchdog, "the recipe's watchdog did not end the process"
        proc.kill()
        proc.communicate()
        return
    assert watchdog, f"ended without a watchdog: {proc.returncode} {err!r}"
    assert proc.returncode == 1, err
    assert b"Timeout" in err and b"hold_loop" in err, err
