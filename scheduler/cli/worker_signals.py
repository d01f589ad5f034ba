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
own handlers.

Before the command runs (the interpreter's start and the CLI's imports, a fraction of a
second) no Python handler can be in place: a signal then is its default, exit 128+N (143 for
SIGTERM, which systemd counts as a clean stop). docs/guide/workers.md says so."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from typing import Any

from scheduler.cli.worker_pool_child import STOP_SIGNAL
from scheduler.core.exits import EXIT_OK
from scheduler.worker.logs import LOGGER

_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_DEFAULTS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler}
_installed: set[int] = set()
_registered = False


def stop_while_starting(in_pool: bool) -> None:
    """Each stop signal ends the starting process with exit 0, until the worker's own handler
    for it replaces this one (first thing in the command: before the registry's import)."""
    global _registered
    for sig in (*_STOPS, STOP_SIGNAL) if in_pool else _STOPS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored by whoever started us (nohup's SIGHUP): left so
        signal.signal(sig, _exit_now)
        _installed.add(sig)
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


def _defaults_in_child() -> None:
    with contextlib.suppress(ValueError, OSError):
        for sig in _installed:
            if signal.getsignal(sig) is _exit_now:
                signal.signal(sig, _DEFAULTS.get(sig, signal.SIG_DFL))
    _installed.clear()
