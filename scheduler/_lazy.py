"""The loads behind the package's lazy `__getattr__`s (PEP 562), serialised by one lock."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

# Threads of a fresh process first reading public names at once would otherwise import redis-py's
# modules concurrently, and a cycle among them raises importlib's _DeadlockError. Re-entrant: a
# load may trigger another. Holding it while importing cannot deadlock against the package's own
# imports: no lazy load imports a module that reads a lazy name while it is imported (only
# scheduler/cli/worker_start.py does, `from scheduler.worker import Worker`, and no lazy load
# reaches the CLI), and `from scheduler.core import codec` never waits for it (submodules).
_LOCK = threading.RLock()


def _fresh_lock() -> None:
    # A child forked while another thread held the lock would wait on it for ever at its first
    # lazy read (that thread does not exist in the child): it gets a lock of its own.
    global _LOCK
    _LOCK = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock)


def load(namespace: dict[str, Any], name: str, get: Callable[[], Any]) -> Any:
    """`get()` under the lock, cached as `namespace[name]`: later reads skip `__getattr__`."""
    with _LOCK:
        value = get()
        namespace[name] = value
    return value


def submodules(
    package: str, namespace: dict[str, Any], attributes: dict[str, str] | None = None
) -> Callable[[str], Any]:
    """A `__getattr__` for `package` that imports its submodule `name` on first access
    (`scheduler.core.errors` after a bare `import scheduler`, as `import scheduler` used to
    allow), and each of `attributes` (name -> the module defining it)."""

    def __getattr__(name: str) -> Any:
        home = (attributes or {}).get(name)
        if home is not None:
            return load(namespace, name, lambda: getattr(importlib.import_module(home), name))
        full = f"{package}.{name}"
        # The import system's own hasattr for `from package import name` (its caller's frame):
        # answered "no", it imports the module itself, as without this function. Taking the lock
        # there, in the middle of an import holding module locks, could wait forever on a thread
        # that holds the lock and waits for one of those modules.
        by_import = sys._getframe(1).f_globals is vars(importlib._bootstrap)
        # A dotted name is no submodule attribute (find_spec would import its 'parent').
        if (
            name.startswith("__")
            or "." in name
            or by_import
            or importlib.util.find_spec(full) is None
        ):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return load(namespace, name, lambda: importlib.import_module(full))

    return __getattr__
