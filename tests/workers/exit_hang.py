"""A child of tests/test_worker_exit_watchdog.py: the worker's run_loop around a main that
returns `code`, then an exit that hangs in one of two ways.

    python -m tests.workers.exit_hang <code> <watchdog_s> close|thread|none|inprocess

close: the event loop's close() never returns (as uvloop's once did); thread: main leaves a
non-daemon thread that never ends (the interpreter's exit joins it); none: nothing hangs;
inprocess: the caller goes on after run_loop (as click's CliRunner does) for 4 watchdog
delays, prints `went on`, and exits 0."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

sys.modules["uvloop"] = None  # type: ignore[assignment]  # run_loop takes asyncio's loop

from scheduler.cli import exit_watchdog, worker_start  # noqa: E402
from scheduler.worker import logs  # noqa: E402


class _HangingClose(asyncio.SelectorEventLoop):
    def close(self) -> None:
        time.sleep(3600)


def main() -> None:
    code, watchdog_s, how = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    logs.setup("INFO")
    exit_watchdog.EXIT_WATCHDOG_S = watchdog_s
    if how == "close":
        asyncio.new_event_loop = _HangingClose

    async def worker() -> int:
        if how == "thread":
            threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
        return code

    code = worker_start.run_loop(worker())
    if how == "inprocess":
        time.sleep(4 * watchdog_s)
        print("went on", flush=True)
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
