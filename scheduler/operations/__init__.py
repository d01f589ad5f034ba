"""Operations: every transition written once, sans-I/O, as requests a driver runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if not TYPE_CHECKING:  # hidden from mypy: a misspelt `scheduler.operations.X` stays a type error
    from scheduler._lazy import submodules

    __getattr__ = submodules(__name__, globals())  # its modules load on first access
    del submodules
