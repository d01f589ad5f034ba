"""Recurring schedules: cron slots, intervals, misfire and jitter (used by the operations)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if not TYPE_CHECKING:  # hidden from mypy: a misspelt `scheduler.schedules.X` stays a type error
    from scheduler._lazy import submodules

    __getattr__ = submodules(__name__, globals())  # its modules load on first access
    del submodules
