"""Protocol: key names, the argument/reply codec, models, errors, the backoff policy, script loading
and the one script driver. Nothing above this layer formats a key or parses a reply."""

from __future__ import annotations

from typing import TYPE_CHECKING

if not TYPE_CHECKING:  # hidden from mypy: a misspelt `scheduler.core.X` stays a type error
    from scheduler._lazy import submodules

    __getattr__ = submodules(__name__, globals())  # its modules load on first access
    del submodules
