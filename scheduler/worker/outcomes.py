"""Outcome hooks (`@registry.on_outcome`): the app's own callback on each outcome of a job this
worker counts in its metrics and logs, under the same word (glossary.md): `done`, `retry`,
`dead`, `expired`, `cancelled`, `timeout`, `stale` (also a job gone), `released`. For an error
tracker (Sentry's capture_exception), an alert on `dead`, the app's own metrics.

A hook runs on the worker's event loop once the server has answered (a `retry` or `dead` is
what fail.lua decided, never a guess), but for `timeout` (when the run's timer fires, ahead of
its fail) and an `expired` the worker's own lease clock decided; it must be quick: hand slow
work to a thread or a task. One that raises is logged (a few lines a minute at most) and
changes nothing: the job's outcome stands and the other hooks still run.

A hook gets no time limit: it runs on the loop (which it may use: `create_task`), and Python
cannot interrupt a synchronous call. One that takes SLOW_HOOK_S or more is named in a warning
(capped as its errors are): it held heartbeats, claims and timeouts meanwhile. One that never
returns is a stalled loop: a `scheduler worker` process's stall watchdog ends it after its lease
(cli/stall_watchdog.py), the outcome it was given already stored."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduler.worker.context import JobContext
from scheduler.worker.log_limit import LogLimit

if TYPE_CHECKING:
    from scheduler.worker.execution import Running


@dataclass(frozen=True)
class JobOutcome:
    """One outcome of one run: `ctx` is the run's JobContext (job_id, task, queue, attempt,
    token, fence)."""

    outcome: str
    ctx: JobContext
    # The exception the handler raised, on the `retry` or `dead` it led to (None when the
    # failure was the worker's: a timeout, an unknown task, an unreadable payload, a result
    # that cannot be stored, parked as InvalidResult).
    error: BaseException | None = None
    error_type: str | None = None  # `retry` / `dead`: the recorded type name, e.g. JobTimeout
    error_message: str | None = None  # its first 200 characters
    retry_at_ms: int | None = None  # `retry`: when it runs again (server ms)
    dead_reason: str | None = None  # `dead`: why it was parked


OutcomeHook = Callable[[JobOutcome], Any]
SLOW_HOOK_S = 1.0  # a hook that held the loop this long is named in a warning
_LIMIT = LogLimit(burst=3)
_UNAWAITED = (
    "the hook returned a coroutine, never awaited: a hook is a plain function (start a task"
    " for async work: asyncio.get_running_loop().create_task)"
)


def emit(
    hooks: Sequence[OutcomeHook], event: str, r: Running, extra: dict[str, Any], log: logging.Logger
) -> None:
    """Call every hook with `event` of run `r` (`extra`: what its log line carries)."""
    failed = event in ("retry", "dead")
    out = JobOutcome(
        event,
        r.ctx,
        r.error if failed else None,
        extra.get("error_type"),
        extra.get("error"),
        extra.get("retry_at_ms"),
        extra.get("reason"),
    )
    r.error = None  # delivered: its frames are not kept with the run
    for hook in hooks:
        started = time.monotonic()
        try:
            back = hook(out)
            if inspect.iscoroutine(back):  # a sync wrapper around an async def: never run
                back.close()  # no "never awaited" warning at some later collection
                raise TypeError(_UNAWAITED)
        except KeyboardInterrupt:  # Ctrl-C of an embedded worker stops it, wherever it lands
            raise
        except BaseException as exc:  # SystemExit too: a hook never stops the worker
            try:
                _log_raised(hook, exc, event, r, log)
            except KeyboardInterrupt:
                raise
            except BaseException:  # its name cannot be read either: the reporter goes on
                if _LIMIT.admit(("?", "?")) is not None:
                    log.error(
                        "an outcome hook raised on job %s %s (the outcome stands)", event, r.job.id
                    )
        took = time.monotonic() - started
        if took >= SLOW_HOOK_S:
            _log_slow(hook, took, event, r, log)


def _log_slow(hook: OutcomeHook, took: float, event: str, r: Running, log: logging.Logger) -> None:
    try:
        name = _name(hook)
    except KeyboardInterrupt:
        raise
    except BaseException:  # its name cannot be read (a hostile object): the reporter goes on
        name = "?"
    note = _LIMIT.admit((name, "slow"))
    if note is not None:
        log.warning(
            "outcome hook %s held the worker's event loop %.1f s on job %s %s (heartbeats, "
            "claims and timeouts waited): hand slow work to a thread or a task%s",
            name, took, event, r.job.id, note,
        )  # fmt: skip


def _name(hook: OutcomeHook) -> str:
    name = getattr(hook, "__qualname__", None)
    if not isinstance(name, str):  # a hook object: its class's (its repr is its own code)
        name = type.__dict__["__qualname__"].__get__(type(hook))
    return str(name)


def _log_raised(
    hook: OutcomeHook, exc: BaseException, event: str, r: Running, log: logging.Logger
) -> None:
    name = _name(hook)
    kind: str = type.__dict__["__name__"].__get__(type(exc))  # a metaclass's may raise
    note = _LIMIT.admit((name, kind))
    if note is not None:
        log.error(
            "outcome hook %s raised %s on job %s %s (the outcome stands)%s",
            name, kind, event, r.job.id, note, exc_info=exc,
        )  # fmt: skip
