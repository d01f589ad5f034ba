"""The worker process: one claim loop, handlers on an event loop (async) or in threads (sync),
batched reporting, one heartbeat call per interval for every lease held.

Timeouts: an async handler past its timeout is cancelled; a sync handler past it is abandoned
(Python cannot kill a thread): its slot is freed at once, the job is failed with JobTimeout
(retried per its backoff), `ctx.stopped` is set so a cooperative handler can stop, and whatever
it returns later is dropped. The same applies when a lease is lost or the job is cancelled,
except that nothing is reported (the server refuses a stale token anyway). Abandoned threads
are bounded (`max_abandoned_threads`): at the cap the worker stops claiming until one ends, and
a job whose earlier run is still alive in this process is held back until that run ends.

Every background loop (claim, heartbeat, presence, reporter, wake-up) stops on a flag it checks,
treats each Redis error as worker.execution.classify says (transient: log, count, back off;
fatal: stop the worker with EXIT_REDIS_REFUSED), and a loop that dies of anything else stops
the worker with EXIT_ERROR: never a silently dead task.

Shutdown (first SIGTERM/SIGINT), each wait bounded: stop claiming; re-send a claim whose
answer was lost (its nonce replays the same jobs) and give back those jobs with the ones never
started; wait up to the grace period for running handlers; stop the reporter and flush every
outcome known (also those of a call still in flight); release the jobs still running; only
then stop heartbeats; remove the presence entry; exit. Cancelling the task of an embedded
`run()` runs the same shutdown without the grace period, then raises CancelledError.

`Worker` (the runtime: claiming, execution, metrics) is imported on first use (PEP 562): a
producer's `from scheduler import Registry` loads this package but not the runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.worker.settings import (
    EXIT_ERROR,
    EXIT_FORCED,
    EXIT_IMPORT,
    EXIT_OK,
    EXIT_REDIS,
    EXIT_REDIS_REFUSED,
    EXIT_USAGE,
    PREFETCH_MAX_RUN_S,
    SettingsError,
    WorkerSettings,
)

if TYPE_CHECKING:
    from scheduler.worker.runtime import Worker

__all__ = [
    "EXIT_ERROR",
    "EXIT_FORCED",
    "EXIT_IMPORT",
    "EXIT_OK",
    "EXIT_REDIS",
    "EXIT_REDIS_REFUSED",
    "EXIT_USAGE",
    "PREFETCH_MAX_RUN_S",
    "SettingsError",
    "Worker",
    "WorkerSettings",
]


if not TYPE_CHECKING:  # hidden from mypy: a misspelt `scheduler.worker.X` stays a type error
    from scheduler._lazy import submodules

    # Its modules load on first access too.
    __getattr__ = submodules(__name__, globals(), {"Worker": f"{__name__}.runtime"})
    del submodules


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Worker"})
