"""A Redis call the worker bounds (core._within) whose own wait is cancelled: shutdown cancels a
loop that did not notice its stop flag in time ('loop heartbeat did not stop in 1.0s;
cancelled'), and the call it was waiting on must go with it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any

from scheduler.worker.core import _within


def test_a_cancelled_wait_takes_its_call_with_it() -> None:
    """Before: cancelling the wait left the call running on its own, and when it failed later
    (Redis paused past the shutdown, then its connection closed), asyncio printed 'Task
    exception was never retrieved' and a traceback past the worker's logs (not JSON under
    --json-logs; seen at a SIGTERM while Redis was paused). Now the call is cancelled with its
    wait, and an error it still ends in is read."""
    seen: list[dict[str, Any]] = []
    ended: list[str] = []

    async def call() -> None:
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise ConnectionError("closed while cancelled") from None
        ended.append("ran on")
        raise ConnectionError("Connection closed by server.")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        outer = asyncio.ensure_future(_within(call(), 10.0))
        await asyncio.sleep(0.05)
        outer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await outer
        await asyncio.sleep(0.4)
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    assert ended == ["cancelled"]
    assert [c.get("message") for c in seen] == []
