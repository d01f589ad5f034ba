"""A registry for tests/test_pool_stop_deadline.py: a sync handler that holds the GIL for as
long as its payload says (a C call made through ctypes.PyDLL, which keeps the GIL, as a
pathological regex or a C extension that never releases it does). Every thread of its process
stops with it: the event loop, its signal handling, the stall and exit watchdogs."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import redis

from scheduler.worker.registry import JobContext, Registry

registry = Registry()


@registry.task(name="hold_gil")
def hold_gil(payload: Any, ctx: JobContext) -> None:
    """Marks `<job>:holder` with this process's pid, then holds the GIL `payload` seconds."""
    client = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
    client.set(f"{ctx.job_id}:holder", os.getpid())
    client.close()
    libc = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.sleep(int(payload))
