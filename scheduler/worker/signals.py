"""The worker's SIGTERM/SIGINT handlers on its event loop, and what a process forked from it
keeps of them: nothing. asyncio (and uvloop) have the C-level handler write the signal number
to a wake-up fd that a forked child shares with the worker, so a handler's helper process
(multiprocessing's "fork" start method, os.fork) signalled on its own (`p.terminate()`) stopped
the worker, and one SIGTERM to the process group counted twice ("second signal": exit 130,
no grace); the helper itself ignored SIGTERM. A forked child gets Python's defaults back.

And one callback per delivery: uvloop (0.23) calls a handler both for the signal's byte on the
wake-up fd and for its own Python-level handler's record of it (Loop._invoke_signals), so when
another signal's byte is read in between (a pool child gets SIGTERM and its supervisor's stop
signal at once) one SIGTERM was called back twice, the second taken for an operator's second
signal (exit 130, no grace: a rare CI failure of tests/test_worker_pool.py). A no-op
Python-level handler leaves the byte, which CPython writes for any signal handled in Python,
the one source, as on asyncio's own loop.

And kept in place: a handler that changes them (`signal.signal(SIGTERM, SIG_IGN)` or a
function of its own on the loop's thread, `loop.add_signal_handler` / `remove_signal_handler`)
left a worker that SIGTERM could not stop, or killed without its shutdown; every CHECK_S the
worker's own are put back (signal_guard.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from scheduler.worker import signal_guard

_registered = False
# While a worker's handlers are installed: the handler object each signal had then (asyncio's
# or our no-op), so a child forked later is reset only where the worker's still is; and the
# callback each one calls on the loop, which signal_guard puts back.
_ours: dict[int, object] = {}
_callbacks: dict[int, tuple[Callable[..., None], tuple[Any, ...]]] = {}


def install(loop: asyncio.AbstractEventLoop, on_signal: Callable[[int], None]) -> None:
    """SIGTERM and SIGINT call on_signal(signum) on the loop; forked children do not inherit
    it (registered once per process: os.register_at_fork has no undo, so the hook acts only
    while these handlers are installed)."""
    global _registered
    for sig in (signal.SIGTERM, signal.SIGINT):
        keep(loop, sig, on_signal, sig)
    signal_guard.start(loop, _restore)
    if not _registered:
        os.register_at_fork(
            before=_block, after_in_parent=_unblock, after_in_child=_defaults_in_child
        )
        _registered = True


def add(
    loop: asyncio.AbstractEventLoop, sig: int, callback: Callable[..., None], *args: Any
) -> None:
    """loop.add_signal_handler, called back once per delivery (see above)."""
    loop.add_signal_handler(sig, callback, *args)
    if type(loop).__module__.startswith("uvloop"):
        signal.signal(sig, _no_op)


def _no_op(_signum: int, _frame: object) -> None:
    pass


def keep(
    loop: asyncio.AbstractEventLoop, sig: int, callback: Callable[..., None], *args: Any
) -> None:
    """add, kept in place (signal_guard) and reset in a forked child until remove(): a pool
    child's stop signal (STOP_SIGNAL) too, which a handler that took it over (SIG_IGN, the
    loop's handler removed: the default ends the process) kept the pool's stop from reaching
    the worker, or ended the worker without its shutdown."""
    add(loop, sig, callback, *args)
    _ours[sig] = signal.getsignal(sig)
    _callbacks[sig] = (callback, args)


def _restore(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Put back the worker's handlers no longer in place; the signals that were not."""
    put_back = []
    for sig, (callback, args) in list(_callbacks.items()):
        if not signal_guard.intact(loop, sig, _ours.get(sig), callback):
            add(loop, sig, callback, *args)
            _ours[sig] = signal.getsignal(sig)
            put_back.append(sig)
    return put_back


# Set by a process that ends with its worker (the CLI: scheduler/cli/worker_signals.py): the
# handler remove() leaves on every signal the worker kept, in place of its default, so a stop
# signal between the worker's stop and the process's exit cannot end it with 128+N.
_after_stop: Any = None


def after_stop(handler: Any) -> None:
    """What remove() leaves on each signal kept (None: SIGTERM's and SIGINT's defaults)."""
    global _after_stop
    _after_stop = handler


def remove(loop: asyncio.AbstractEventLoop) -> None:
    signal_guard.stop()
    then = _after_stop
    kept = [*_callbacks] if then is not None else [signal.SIGTERM, signal.SIGINT]
    _ours.clear()  # an app's forks from now on inherit its own handlers again
    _callbacks.clear()
    for sig in kept:
        loop.remove_signal_handler(sig)
        if then is not None:
            signal.signal(sig, then)


_DEFAULTS: dict[int, Any] = {
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGINT: signal.default_int_handler,
}


# The forking thread's signal mask before the fork (the child inherits the thread). Blocked
# across the fork: a SIGTERM reaching the child before its handlers are reset would still be
# written to the worker's wake-up fd (a terminate() right after start()); it waits, pending,
# and lands on the defaults. The worker's own thread keeps them unblocked meanwhile.
_mask = threading.local()


def _block() -> None:
    if _ours:
        _mask.old = signal.pthread_sigmask(signal.SIG_BLOCK, _ours.keys())


def _unblock() -> None:
    old = getattr(_mask, "old", None)
    if old is not None:
        _mask.old = None
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _defaults_in_child() -> None:
    if _ours:
        # The forking thread is the child's main thread, which may set these; suppress: a
        # child forked where that fails must still run. Only what is still the worker's.
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
            for sig, handler in _ours.items():
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, _DEFAULTS.get(sig, signal.SIG_DFL))
        _ours.clear()
        _callbacks.clear()
    _unblock()
