"""_within (the worker's bounded await) on a call that swallows its cancellation and then
fails (redis-py's retry around a read cut by a stalled server): the error is read, so asyncio
reports no "Task exception was never retrieved" with a traceback into the worker's log stream
(which broke --json-logs at a SIGTERM while Redis hung, an audit found)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from scheduler.worker.core import _Deadline, _within


def test_a_call_that_fails_after_its_deadline_leaves_no_unretrieved_error() -> None:
    reported: list[dict[str, Any]] = []

    ended = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # swallows the cancellation, then fails
        ended.set()
        raise ConnectionError("Connection closed by server.")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        with pytest.raises(_Deadline):
            await _within(stubborn(), 0.05)
        await ended.wait()  # the call is about to end with its error
        for _ in range(3):
            await asyncio.sleep(0)  # its task finishes, its done callbacks run
        gc.collect()  # a dropped task's unread error is reported when it is collected

    asyncio.run(main())
    gc.collect()
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported


def test_a_refused_loop_call_stops_the_worker_and_points_to_doctor() -> None:
    """An ACL edited mid-run can refuse a script part-way; Redis keeps its earlier writes, so
    the worker's last line says to run `scheduler doctor` once the user is fixed."""
    from redis.exceptions import NoPermissionError

    from scheduler import Registry
    from scheduler.core.connection import connect_async
    from scheduler.worker import Worker, WorkerSettings
    from scheduler.worker.core import _Fatal

    w = Worker(connect_async("redis://127.0.0.1:1/0"), Registry(), WorkerSettings(queues=("q",)))
    with pytest.raises(_Fatal) as fatal:
        w._loop_error("claim", NoPermissionError("no permissions to run the 'hset' command"))
    assert fatal.value.code == 5 and "scheduler doctor" in str(fatal.value)
