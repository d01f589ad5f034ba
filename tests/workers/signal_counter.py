"""A uvloop process counting the callbacks of scheduler.worker.signals.add for SIGTERM and
SIGUSR1 (tests/test_contained_handlers.py): SIGUSR2 prints the counts. A thread sleeping in a
loop competes for the GIL, as a sync handler's does, which widens uvloop's window."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import uvloop

from scheduler.worker import signals

counts: dict[int, int] = {signal.SIGTERM: 0, signal.SIGUSR1: 0}


def _on(sig: int) -> None:
    counts[sig] += 1


def _report() -> None:
    os.write(1, f"{counts[signal.SIGTERM]} {counts[signal.SIGUSR1]}\n".encode())


def _sleeper() -> None:
    while True:
        time.sleep(0.01)


async def main() -> None:
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signals.add(loop, s, _on, s)
    loop.add_signal_handler(signal.SIGUSR2, _report)
    threading.Thread(target=_sleeper, daemon=True).start()
    os.write(1, b"ready\n")
    while True:
        await asyncio.sleep(0.001)
        sum(range(200))


if __name__ == "__main__":
    uvloop.new_event_loop().run_until_complete(main())
