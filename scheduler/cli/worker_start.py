"""The worker's process around its run: importing its registry, the start sequence (`serve`:
connect, check access, preflight, metrics, then run), the one line and exit code
(scheduler/core/exits.py) of each way the start can fail, and the event loop it runs on."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    InvalidResponse,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from scheduler.admin.startup import (
    APP_ROLE_HINT,
    AccessDenied,
    UnsafeServer,
    check_access_async,
    check_or_warn_async,
    credentials_hint,
    is_permission_error,
    permission_message,
    url_refusal,
)
from scheduler.cli.exit_watchdog import ExitWatchdog
from scheduler.cli.stall_watchdog import StallWatchdog
from scheduler.cli.worker_pool_child import (
    STOP_SIGNAL,
    hand_over_metrics,
    notify_ready,
    retired_code,
)
from scheduler.client.partitioned_merge import expand_labelled_async
from scheduler.core.connection import connect_async
from scheduler.core.errors import (
    CorruptKey,
    NewerStorage,
    SchedulerError,
    cluster_refusal,
    edited_by_hand,
    refused_for_now,
)
from scheduler.core.exits import EXIT_FAILED, EXIT_FORBIDDEN, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from scheduler.core.safety import redact
from scheduler.worker import SettingsError, Worker, WorkerSettings, logs
from scheduler.worker import signals as signals
from scheduler.worker.execution import TRANSIENT, classify
from scheduler.worker.metrics import METRICS_ADDR
from scheduler.worker.registry import Registry
from scheduler.worker.self_stop import memory_at_start_error


class RegistryImportError(Exception):
    pass


def load_registry(target: str) -> Registry:
    """Import `module:attribute` (the current directory is importable, as with uvicorn)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RegistryImportError(f"expected module:attribute, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RegistryImportError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    except SystemExit as exc:  # a setting missing, argparse at import: not a stop, nor a crash
        raise RegistryImportError(
            f"module {module_name!r} called sys.exit({exc.code!r}) while imported"
        ) from None
    obj = getattr(module, attr, None)
    if not isinstance(obj, Registry):
        raise RegistryImportError(
            f"{target!r} is {type(obj).__name__ if obj is not None else 'missing'}, "
            "not a scheduler.worker.registry.Registry"
        )
    return obj


def start_failure(exc: BaseException, url: str) -> int:
    """Print why the start failed (one line; the URL's password never) and return its exit
    code. Only a server that cannot be reached or cannot serve yet (LOADING, BUSY, a cluster
    failover: classify's 'transient') is 3, which a supervisor retries; a key of another type or
    an unreadable stored record is 1: restarting cannot help, `scheduler doctor` says what; a
    URL only another URL mends (a certificate refused, a database or node not the queue's) 2."""
    exc = cluster_refusal(exc) or exc  # a cluster's refused login or CLUSTER SLOTS: as one's
    if (wrong := url_refusal(exc, url)) is not None:  # each try refused alike: no doctor either
        line, code = wrong, EXIT_USAGE
    elif is_permission_error(exc):  # e.g. SCRIPT LOAD refused
        line, code = permission_message(exc, APP_ROLE_HINT), EXIT_FORBIDDEN
    elif isinstance(exc, AuthenticationError):  # a ConnectionError, but retrying cannot help
        line = f"Redis at {redact(url)} refused the credentials: {exc}; {credentials_hint(exc)}"
        code = EXIT_FORBIDDEN
    elif isinstance(exc, InvalidResponse):  # not a ConnectionError: a service, but not Redis
        why = f"did not answer as a Redis server ({exc})"
        line, code = f"cannot reach Redis: {redact(url)} {why}", EXIT_UNREACHABLE
    elif isinstance(exc, CorruptKey):  # transient to a running worker, but no reason to start
        line, code = f"a queue key was edited by hand: {exc} (run scheduler doctor)", EXIT_FAILED
    elif isinstance(exc, NewerStorage):  # the same: an upgrade, not a restart, helps
        line, code = str(exc), EXIT_FAILED
    elif isinstance(exc, ResponseError) and refused_for_now(exc):  # NOREPLICAS, LOADING, ...
        line, code = f"Redis at {redact(url)} refused the start for now: {exc}", EXIT_UNREACHABLE
    elif isinstance(exc, (*TRANSIENT, RedisClusterException)) or classify(exc) == "transient":
        line, code = f"cannot reach Redis at {redact(url)}: {exc}", EXIT_UNREACHABLE
    elif isinstance(exc, SettingsError):
        line, code = str(exc), EXIT_USAGE
    elif isinstance(exc, SchedulerError):
        line, code = f"unreadable stored data: {exc} (run scheduler doctor)", EXIT_FAILED
    else:  # doctor reads stored data: named for a reply about it (WRONGTYPE) only
        hand = isinstance(exc, ResponseError) and edited_by_hand(exc)
        doctor = " (run scheduler doctor)" if hand else ""
        line, code = f"Redis refused the start: {type(exc).__name__}: {exc}{doctor}", EXIT_FAILED
    logs.console(line)  # `error: ...`, or a JSON line under --json-logs
    return code


# After the worker returned, how long its leftover tasks may take to end once cancelled: a
# handler that ignores its cancellation (its job already released at the end of --grace) must
# not hold the process, as asyncio.run's own unbounded wait for every task would.
_LEFTOVER_WAIT_S = 1.0


def run_loop(main: Coroutine[Any, Any, int], lease_s: float | None = None) -> int:
    """Run the worker on uvloop when installed (a faster event loop: fewer microseconds per
    job in the claim / report cycle), else asyncio's own; as asyncio.run, but the tasks left
    when it returns get a bounded wait (_LEFTOVER_WAIT_S), not an unbounded one. With
    `lease_s`, a loop that stops turning for longer ends the process (stall_watchdog.py)."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    code = EXIT_FAILED  # main raised: cli/worker.py logs the crash and exits with this
    stall = StallWatchdog(loop, lease_s) if lease_s is not None else None
    if stall is not None:
        stall.start()
    try:
        code = _run_through_stops(loop, loop.create_task(main))
        return code
    finally:
        if stall is not None:
            stall.stop()
        watchdog = ExitWatchdog(code)
        watchdog.arm()
        try:
            _end_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            _own_stdio()
            watchdog.closed()


def _run_through_stops(loop: asyncio.AbstractEventLoop, task: asyncio.Task[int]) -> int:
    """Run task to its end though a handler stops the loop (`loop.stop()`): before, the
    worker died of "Event loop stopped before Future completed" (exit 1, a traceback, no
    shutdown: every job it held waited for its lease to lapse). The loop runs on."""
    while True:
        try:
            return loop.run_until_complete(task)
        except RuntimeError:
            if task.done() or loop.is_closed():
                raise
            logging.getLogger(logs.LOGGER).warning(
                "the event loop was stopped (a handler's loop.stop()?): the worker runs on"
            )


def _own_stdio() -> None:
    """The interpreter's own sys.stdout / sys.stderr back for its exit: a handler that put a
    stream of its own there (one whose flush fails) turned a clean stop's exit 0 into 120."""
    for name in ("stdout", "stderr"):
        own = getattr(sys, f"__{name}__")
        if own is not None and getattr(sys, name) is not own:
            setattr(sys, name, own)


def _end_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=_LEFTOVER_WAIT_S))
    for t in left:
        if not t.done():
            # Known and given up on: no "Task was destroyed but it is pending" at exit.
            t._log_destroy_pending = False  # type: ignore[attr-defined]
        elif not t.cancelled():
            t.exception()  # retrieved: a handler's late error is not the worker's outcome


def metrics_port_failure(port: int, exc: OSError) -> int:
    """--metrics-port taken, or not ours to bind (a worker's or a pool's): one line, no trace."""
    logs.console(f"cannot serve metrics on port {port}: {exc.strerror or exc}")
    return EXIT_FAILED


# Each one line and an exit code (worker_start.start_failure); a hand-edited partition record
# is an UnreadableRecord (a SchedulerError).
_START_ERRORS: tuple[type[BaseException], ...]
_START_ERRORS = (*TRANSIENT, RedisError, RedisClusterException, SchedulerError)


async def serve(
    url: str,
    registry: Registry,
    settings: WorkerSettings,
    port: int | None,
    *,
    strict: bool,
    worker_id: str | None,
    in_pool: bool = False,
) -> int:
    client = connect_async(url, socket_connect_timeout=5, socket_timeout=30)
    try:
        # The names asked for first: expand_queues reads each one's partitions record, and a
        # queue the user's ACL leaves out must be refused naming it (docs/security.md).
        await check_access_async(client, settings.queues)
        queues, logical = await expand_labelled_async(client, settings.queues)
        worker = Worker(client, registry, replace(settings, queues=queues), worker_id=worker_id)
        logs.name_lines(worker.id)  # a pool's children share one stream
        worker.metrics.logical = logical  # a partition is labelled by its logical queue
        worker.names_read = True  # a node down after this read must not hold its start (run())
        await worker.preflight()
        # A partition on a cluster node that does not answer is skipped here, while others
        # answer (its claims retry until it does); the names asked for were read above.
        await check_access_async(client, queues, skip_down=True)
    except AccessDenied as exc:
        logs.console(str(exc))
        await client.aclose()
        return EXIT_FORBIDDEN
    except _START_ERRORS as exc:  # what the first reads and script loads can meet
        await client.aclose()
        return start_failure(exc, url)
    try:
        await check_or_warn_async(client, strict=strict, log=worker.log.warning, url=url,
                                  keys=[q.keys.due for q in worker.queues])  # fmt: skip
    except UnsafeServer as exc:  # a refusal, as with `enqueue --strict`
        logs.console(str(exc))
        await client.aclose()
        return EXIT_FAILED
    refused = memory_at_start_error(settings.max_memory_mb)
    if refused:  # before ready: a pool's first start fails, not a restart loop
        logs.console(refused)
        await client.aclose()
        return EXIT_USAGE
    bound: int | None = None
    if port is not None:
        # A pool's child serves only its supervisor, which relabels and serves every child's
        # metrics on the pool's port (worker_pool_metrics.py): loopback, any free port.
        addr, port = ("127.0.0.1", 0) if in_pool else (METRICS_ADDR, port)
        try:
            bound = worker.metrics.serve(port, addr=addr)
        except OSError as exc:
            await client.aclose()
            return metrics_port_failure(port, exc)
        worker.log.info("metrics on %s:%d/metrics", addr if in_pool else "", bound)
    # The supervisor's stop, and a hangup (a terminal's, `kill -HUP`; Python's default killed
    # the worker on the spot, its jobs left to their leases): requests, never a (second) signal.
    if in_pool:
        signals.keep(
            asyncio.get_running_loop(), STOP_SIGNAL, _asked, worker, "the pool's supervisor"
        )
    signals.keep(asyncio.get_running_loop(), signal.SIGHUP, _asked, worker, "a hangup (SIGHUP)")
    notify_ready(bound)  # to a pool's supervisor (--processes): this child started
    try:
        code = await worker.run()
    finally:
        await client.aclose()
    if in_pool:  # its last counts, carried on in its slot by the supervisor
        hand_over_metrics(worker.metrics.registry)
    # A pool's child an operator stopped tells its supervisor not to start another in its place,
    # and with which verb (stop: 86, quiet: 87).
    stopped_by = worker.operator_stop
    return retired_code(stopped_by) if in_pool and code == EXIT_OK and stopped_by else code


def _asked(worker: Worker, by: str) -> None:
    worker.log.info("stop asked by %s: stopping (grace %.1fs)", by, worker.settings.grace_s)
    worker.request_stop()
