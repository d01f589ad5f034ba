"""Admin: read-only inspection, the invariant checker (doctor), server health and startup checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if not TYPE_CHECKING:  # hidden from mypy: a misspelt `scheduler.admin.X` stays a type error
    from scheduler._lazy import submodules

    __getattr__ = submodules(__name__, globals())  # its modules load on first access
    del submodules
