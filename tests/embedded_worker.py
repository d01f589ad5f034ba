"""One in-process Worker run until a condition holds (the tests that patch a worker's insides):
started on its own client, cancelled and its client closed whatever happens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from scheduler import Registry
from scheduler.core.connection import connect_async
from scheduler.worker import Worker, WorkerSettings


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
