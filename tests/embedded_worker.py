"""One in-process Worker run until a condition holds (the tests that patch a worker's insides):
started on its own client, cancelled and its client closed whatever happens; or run in a thread
for the length of a `with` block (worker_thread)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis.asyncio as aredis

from scheduler import Registry
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings


async def until(done: Callable[[], bool], bound_s: float = 30.0) -> None:
    """Until done() holds, or `bound_s` (a liveness bound, not a window a test's verdict depends
    on: the test checks what it needs afterwards)."""
    deadline = time.monotonic() + bound_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def run_until(
    url: str,
    registry: Registry,
    settings: WorkerSettings,
    done: Callable[[], bool],
    *,
    timeout_s: float = 15.0,
    setup: Callable[[Worker], None] | None = None,
) -> bool:
    """Run a worker until `done()` (polled every 20 ms; True) or `timeout_s` (False).
    `setup` sees the worker before it starts (to patch it)."""

    async def main() -> bool:
        client = connect_async(url)
        worker = Worker(client, registry, settings)
        if setup is not None:
            setup(worker)
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            for _ in range(int(timeout_s / 0.02)):
                await asyncio.sleep(0.02)
                if done():
                    return True
            return False
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()

    return asyncio.run(main())


@contextmanager
def worker_thread(
    url: str,
    registry: Registry,
    settings: WorkerSettings,
    *,
    logger: logging.Logger | None = None,
    setup: Callable[[Worker], None] | None = None,
    exit_codes: list[int] | None = None,
) -> Iterator[Worker]:
    """A Worker (a plain asyncio client, text replies) run on its own event loop in a thread
    while the block runs; then asked to stop, joined (30 s) and its client closed. `setup` sees
    the worker before it starts; its run's exit code is appended to `exit_codes`."""
    loop = asyncio.new_event_loop()
    client = aredis.Redis.from_url(url, decode_responses=True)
    w = Worker(client, registry, settings, logger=logger)
    if setup is not None:
        setup(w)
    codes = [] if exit_codes is None else exit_codes
    t = threading.Thread(
        target=lambda: codes.append(loop.run_until_complete(w.run(install_signals=False)))
    )
    t.start()
    try:
        yield w
    finally:
        loop.call_soon_threadsafe(w.request_stop)
        t.join(30)
        loop.run_until_complete(client.aclose())
        loop.close()
