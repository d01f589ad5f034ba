"""The one serialiser of a Backoff: 'base_ms,factor,cap_ms,jitter', the form the job hash's and
the schedule hash's `backoff` field store (lua/lib/util.lua parse_backoff reads it), written
by backoff_text and read by parse_stored_backoff; check_backoff checks the ranges."""

from __future__ import annotations

import functools
import re
from typing import Any

from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument
from scheduler.core.limits import DEFAULT_BACKOFF, FLOAT_LIMITS, LIMITS, check_int, stored_int

_FLOAT_TEXT = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


def check_backoff(b: Any) -> Backoff:
    """A Backoff whose every field is within LIMITS / FLOAT_LIMITS (Backoff itself checks only
    the lower bounds and types)."""
    if not isinstance(b, Backoff):
        raise BadArgument(f"backoff must be a Backoff, got {b!r}")
    check_int(b.base_ms, "backoff base_ms", "backoff.base_ms")
    check_int(b.cap_ms, "backoff cap_ms", "backoff.cap_ms")
    for name, v in (("factor", b.factor), ("jitter", b.jitter)):
        lo, hi = FLOAT_LIMITS["backoff." + name]
        if not lo <= v <= hi:
            raise BadArgument(f"backoff {name} must be in [{lo}, {hi}], got {v!r}")
    return b


@functools.lru_cache(maxsize=256)
def backoff_text(b: Backoff) -> str:
    """'base_ms,factor,cap_ms,jitter', as the job and schedule hashes store it (the one writer)."""
    # + 0.0: a jitter of -0.0 (== 0.0, so in range) is written '0.0', which the scripts read.
    return f"{b.base_ms},{float(b.factor)!r},{b.cap_ms},{float(b.jitter) + 0.0!r}"


def parse_backoff_text(text: str) -> Backoff:
    """'base_ms,factor,cap_ms,jitter' -> Backoff, read as strictly as lua/lib/util.lua
    parse_backoff (decimal digits, every field within LIMITS / FLOAT_LIMITS); BadArgument
    naming what is wrong otherwise. The CLI's --backoff and the stored field both read it here."""
    parts = text.split(",")
    if len(parts) != 4:
        raise BadArgument(
            f"invalid backoff {text!r}: give base_ms,factor,cap_ms,jitter, e.g. 1000,2,3600000,0.25"
        )
    ints = []
    for name, part in (("base_ms", parts[0]), ("cap_ms", parts[2])):
        lo, hi = LIMITS["backoff." + name]
        n = stored_int(part)
        if n is None:
            raise BadArgument(f"invalid backoff {text!r}: {name} must be an integer")
        if not lo <= n <= hi:
            raise BadArgument(f"invalid backoff {text!r}: {name} must be in [{lo}, {hi}]")
        ints.append(n)
    floats = []
    for name, part in (("factor", parts[1]), ("jitter", parts[3])):
        lo_f, hi_f = FLOAT_LIMITS["backoff." + name]
        if len(part) > 32 or not _FLOAT_TEXT.fullmatch(part):
            raise BadArgument(f"invalid backoff {text!r}: {name} must be a decimal number >= 0")
        x = float(part)
        if not lo_f <= x <= hi_f:
            raise BadArgument(f"invalid backoff {text!r}: {name} must be in [{lo_f}, {hi_f}]")
        floats.append(x)
    return Backoff(ints[0], floats[0], ints[1], floats[1])


# Cached: every job of a task stores the same text, and a claim parses it once per job (the
# worker's hot path); Backoff is frozen, so one object serves them all. Bounded by maxsize.
@functools.lru_cache(maxsize=256)
def parse_stored_backoff(text: str) -> Backoff | None:
    """The stored `backoff` field: '' is the default; None when unreadable."""
    if text == "":
        return DEFAULT_BACKOFF
    try:
        return parse_backoff_text(text)
    except BadArgument:
        return None


def stored_backoff(text: str) -> Backoff:
    """parse_stored_backoff, with the default for an unreadable value."""
    b = parse_stored_backoff(text)
    return DEFAULT_BACKOFF if b is None else b
