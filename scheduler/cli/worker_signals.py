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

After the worker has stopped (its run returned, its exit code decided) and up to the process's
end (the loop's close, the interpreter's exit: its non-daemon threads, atexit hooks), a stop
signal is noted and ignored (`_late`): the process exits with the code its stop decided. Before,
the worker's handlers were removed for the defaults, so a supervisor's second SIGTERM there
(systemd's, after a slow exit) turned a clean stop's 0 into 143. The worker leaves `_late` in
place of its own (scheduler/worker/signals.after_stop); the command's end swaps the start's for
it too, and the last atexit hook for SIG_IGN (the interpreter's own end resets Python handlers
to the defaults). Only when the command is the process (`scheduler`, `python -m scheduler`):
run in-process, the command's end puts back what was there before.

Before the command runs (the interpreter's start and the CLI's imports, a fraction of a
second) no Python handler can be in place: a signal then is its default, exit 128+N (143 for
SIGTERM, which systemd counts as a clean stop). docs/guide/workers.md says so."""

from __future__ import annotations

import atexit
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
from scheduler.worker import signals
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
        before = _installed[sig] = signal.getsignal(sig)
        if before is not signal.SIG_IGN:  # ignored by whoever started us (nohup's SIGHUP): so
            signal.signal(sig, _exit_now)
    signals.after_stop(_late)  # the worker's own, once removed: until the process ends
    if not _registered:
        os.register_at_fork(after_in_child=_defaults_in_child)
        atexit.register(_ignore_from_now)  # registered first, so run last
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


def _late(signum: int, _frame: object) -> None:
    with contextlib.suppress(Exception):  # the interpreter's exit may have closed the log
        logging.getLogger(LOGGER).warning(
            "stop asked (%s) after the worker stopped: ignored, the process is exiting with "
            "the code its stop decided",
            signal.Signals(signum).name,
        )


def command_ended() -> None:
    """The command is over and the process ends next: the start's handlers become `_late`."""
    for sig in _installed:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is _exit_now:
                signal.signal(sig, _late)


def _ignore_from_now() -> None:
    """The last atexit hook: past it the interpreter resets Python's handlers to the defaults
    (its signal module's end), so a late signal there would still be 128+N."""
    with contextlib.suppress(ValueError, OSError):
        for sig in (*_STOPS, STOP_SIGNAL):
            if signal.getsignal(sig) is _late:
                signal.signal(sig, signal.SIG_IGN)


def _is_the_process() -> bool:
    """The command runs as the process (the `scheduler` script, `python -m scheduler`, a pool's
    child), not in another program's (click's CliRunner, an app calling it)."""
    cli = sys.modules.get("scheduler.cli.main")
    main = getattr(sys.modules.get("__main__"), "main", None)
    return cli is not None and main is getattr(cli, "main", None)


def restored(command: Callable[P, R]) -> Callable[P, R]:
    """Around the worker command: on its way out (its sys.exit too) the process that ends
    with it keeps ignoring stop signals (command_ended); run in-process (click's CliRunner, an
    app), each handler of ours still in place gets back the one before, so the command leaves
    its caller's handlers as it found them."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        finally:
            if _is_the_process():
                command_ended()
            else:
                _put_back()

    return run


def _put_back() -> None:
    signals.after_stop(None)
    for sig, before in list(_installed.items()):
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(sig) in (_exit_now, _late):
                signal.signal(sig, signal.SIG_DFL if before is None else before)
    _installed.clear()


def _defaults_in_child() -> None:
    signals.after_stop(None)
    with contextlib.suppress(ValueError, OSError):
        for sig, before in _installed.items():
            if signal.getsignal(sig) in (_exit_now, _late):
                default = _DEFAULTS.get(sig, signal.SIG_DFL)
                signal.signal(sig, before if before is signal.SIG_IGN else default)  # nohup's
    _installed.clear()
