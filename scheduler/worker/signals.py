"""The worker's SIGTERM/SIGINT handlers on its event loop, and what a process forked from it
keeps of them: nothing. asyncio (and uvloop) have the C-level handler write the signal number
to a wake-up fd that a forked child shares with the worker, so a handler's helper process
(multiprocessing's "fork" start method, os.fork) signalled on its own (`p.terminate()`) stopped
the worker, and one SIGTERM to the process group counted twice ("second signal": exit 130,
no grace); the helper itself ignored SIGTERM. A forked child gets Python's defaults back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

_registered = False


def install(loop: asyncio.AbstractEventLoop, on_signal: Callable[[int], None]) -> None:
    """SIGTERM and SIGINT call on_signal(signum) on the loop; forked children do not inherit
    it (registered once per process: os.register_at_fork has no undo)."""
    global _registered
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    if not _registered:
        os.register_at_fork(after_in_child=_defaults_in_child)
        _registered = True


def remove(loop: asyncio.AbstractEventLoop) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)


def _defaults_in_child() -> None:
    # The forking thread is the child's main thread, which may set these; suppress: a child
    # forked where that fails must still run.
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
