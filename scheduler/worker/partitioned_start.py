"""A Worker given a partitioned queue's logical name claims its partitions, as `scheduler worker`
does (cli/worker_start.py expands the names before it makes the Worker): embedded
(docs/guide/workers.md), it claimed the logical name's own queue, which no job is ever in, and
ran nothing while reporting nothing wrong. The names are read before the first claim, retried
while Redis does not answer: a worker started during an outage claimed the logical names as
given, so ran nothing once Redis came back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from scheduler.client.partitioned_merge import expand_labelled_async
from scheduler.core.errors import SchedulerError
from scheduler.core.exits import EXIT_FAILED

if TYPE_CHECKING:
    from scheduler.worker.core import WorkerCore


async def expand_until_read(w: WorkerCore, deadline_s: float) -> None:
    """expand_logical, retried with a growing delay (transient errors logged and counted as
    any loop's) until it is read or the worker is stopped; a fatal error stops the worker."""
    from scheduler.worker import self_stop
    from scheduler.worker.core import _Deadline, _within
    from scheduler.worker.execution import RetryDelay
    from scheduler.worker.settings import EXIT_ERROR

    if w.names_read:
        return
    delay, since = RetryDelay(), time.monotonic()
    while not w._stop_claiming.is_set():
        try:
            await _within(expand_logical(w), deadline_s)
            w.names_read = True
            return
        except _Deadline:
            w.log.warning("queues: no answer from Redis in %.1fs; retrying", deadline_s)
        except Exception as exc:
            w._loop_error("queues", exc)  # transient: logged, counted; else raises
        # A burst worker stops as one whose claims keep failing does (self_stop): it would
        # never find its queues empty, so never end.
        if w.settings.burst and time.monotonic() - since > self_stop.BURST_FAILING_S:
            w._fatal(EXIT_ERROR, "burst: its queues' partitions records have not been read "
                                 f"for over {self_stop.BURST_FAILING_S:g} s")  # fmt: skip
            return
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(w._stop_claiming.wait(), delay())


async def expand_logical(w: WorkerCore) -> None:
    """Replace each logical name among the worker's queues by its partitions (one read of each
    name's partitions record); its metrics label each partition by its logical name."""
    from scheduler.worker.core import _Fatal, _Queue  # core imports nothing of this module

    try:
        names, logical = await expand_labelled_async(w.client, w.settings.queues)
    except SchedulerError as exc:  # a partitions record edited by hand: one line, as the CLI's
        raise _Fatal(EXIT_FAILED, f"cannot start: {exc}") from None
    if not logical:
        return
    w.settings = replace(w.settings, queues=names)
    w.queues = [_Queue(w.client, n, w._clock) for n in names]
    w._by_name = {q.name: q for q in w.queues}
    w.metrics.logical.update(logical)
