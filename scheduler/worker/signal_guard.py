"""Keeps the worker's SIGTERM/SIGINT handlers (signals.py) in place against a handler that
changes them. An async handler runs on the loop's thread, the one where `signal.signal` works:
`signal.signal(SIGTERM, SIG_IGN)` or `loop.add_signal_handler(SIGTERM, ...)` left a worker
that SIGTERM could not stop (only SIGKILL, its leases left to lapse), and
`loop.remove_signal_handler(SIGTERM)` one that SIGTERM killed without its shutdown; the same
for a pool child's stop signal (SIGUSR1, `signals.keep`). Every
CHECK_S a timer on the loop puts the worker's own back and logs which it restored; a signal
that arrives in between is still lost (the check is a timer, not a hook on `signal.signal`).
A sync handler cannot change them (Python refuses outside the main thread)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from scheduler.worker.logs import LOGGER

CHECK_S = 0.5

Restore = Callable[[asyncio.AbstractEventLoop], list[int]]

_timer: asyncio.TimerHandle | None = None


def start(loop: asyncio.AbstractEventLoop, restore: Restore) -> None:
    """Check every CHECK_S on loop, until stop(); restore(loop) puts back the worker's
    handlers no longer in place and returns their signals."""
    global _timer
    stop()

    def check() -> None:
        global _timer
        try:
            put_back = restore(loop)
        except Exception as exc:  # never out of a timer: the next check tries again
            logging.getLogger(LOGGER).warning("could not check the signal handlers: %r", exc)
        else:
            if put_back:
                logging.getLogger(LOGGER).warning(
                    "a handler changed the worker's %s handling: restored",
                    " and ".join(signal.Signals(s).name for s in put_back),
                )
        _timer = loop.call_later(CHECK_S, check)

    _timer = loop.call_later(CHECK_S, check)


def stop() -> None:
    global _timer
    if _timer is not None:
        _timer.cancel()
        _timer = None


def intact(
    loop: asyncio.AbstractEventLoop, sig: int, ours: object, on_signal: Callable[..., None]
) -> bool:
    """sig's Python-level handler is still the one the worker installed and, on asyncio's own
    loop (whose add_signal_handler always installs the same function), its callback still the
    worker's. uvloop installs a function of its own, replaced by the worker's no-op
    (signals.add): another add_signal_handler changes the Python-level one."""
    if ours is None or signal.getsignal(sig) is not ours:
        return False
    handlers = getattr(loop, "_signal_handlers", None)
    if isinstance(handlers, dict):
        handle = handlers.get(sig)
        return handle is not None and getattr(handle, "_callback", None) == on_signal
    return True
