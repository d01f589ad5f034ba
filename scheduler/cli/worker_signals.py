"""`scheduler worker`'s stop signals while it starts, before its worker's own handlers are in
place (scheduler/worker/signals.py: installed by `Worker.run`, and `serve`'s SIGHUP and a pool
child's STOP_SIGNAL). Python's defaults killed the starting process: a supervisor's SIGTERM
(systemd, Kubernetes stopping a worker that was importing its registry, connecting, checking)
ended it with 143, a code outside the table (scheduler/core/exits.py), SIGHUP with 129, and
Ctrl-C printed 'Aborted!' with exit 1, a crash to a supervisor.

From the command's first line, SIGTERM, SIGINT, SIGHUP (and a pool child's STOP_SIGNAL) end
the process at once with exit 0 and one log line: nothing is claimed, leased or registered
before the worker runs, so there is nothing to give back. The exit is `os._exit`: a registry's
import that swallows SystemExit or started a thread of its own cannot keep the process up.
A process forked meanwhile (an import's helper) gets the defaults back, as with the worker's
own handlers; the command's end puts back what was there before (`restored`: the CLI run
in-process, by click's CliRunner or an app, leaves that process's handlers as it found them).

Before the command runs (the interpreter's start and the CLI's imports, a fraction of a
second) no Python handler can be in place: a signal then is its default, exit 128+N (143 for
SIGTERM, which systemd counts as a clean stop). docs/guide/workers.md says so."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from scheduler.cli.worker_pool_child import STOP_SIGNAL
from scheduler.core.exits import EXIT_OK
from scheduler.worker.logs import LOGGER

P = ParamSpec("P")
R = TypeVar("R")
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_DEFAULTS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler}
_installed: dict[int, Any] = {}  # signal -> its handler before
_registered = False


def stop_while_starting(in_pool: bool) -> None:
    """Each stop signal ends the starting process with exit 0, until the worker's own handler
    for it replaces this one (first thing in the command: before the registry's import).
    Only on the main thread (the only one where Python sets handlers); restored()
    puts back what was there before."""
    global _registered
    if threading.current_thread() is not threading.main_thread():
        return  # the CLI run in-process from another thread: that process's handlers stay
    for sig in (*_STOPS, STOP_SIGNAL) if in_pool else _STOPS:
        before = signal.getsignal(sig)
        if before is signal.SIG_IGN:
            continue  # ignored by whoever started us (nohup's SIGHUP): left so
        signal.signal(sig, _exit_now)
        _installed[sig] = before
    if not _registered:
        os.register_at_fork(after_in_child=_defaults_in_child)
        _registered = True


def _exit_now(signum: int, _frame: object) -> None:
    with contextlib.suppress(Exception):
        logging.getLogger(LOGGER).warning(
            "stop asked (%s) while the worker was starting: exiting (exit 0), no job was "
            "claimed yet",
            signal.Signals(signum).name,
        )
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a flush the signal interrupted: re-entrant
            stream.flush()
    os._exit(EXIT_OK)


def restored(command: Callable[P, R]) -> Callable[P, R]:
    """Around the worker command: on its way out (its sys.exit too) each handler of
    stop_while_starting still in place gets back the one before, so the CLI run in-process
    (click's CliRunner, an app) leaves its process's handlers as it found them."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        finally:
            for sig, before in list(_installed.items()):
                with contextlib.suppress(ValueError, OSError, TypeError):
                    if signal.getsignal(sig) is _exit_now:
                        signal.signal(sig, signal.SIG_DFL if before is None else before)
            _installed.clear()

    return run


def _defaults_in_child() -> None:
    with contextlib.suppress(ValueError, OSError):
        for sig in _installed:
            if signal.getsignal(sig) is _exit_now:
                signal.signal(sig, _DEFAULTS.get(sig, signal.SIG_DFL))
    _installed.clear()
