"""Retry policy: attempt number -> delay. The same formula runs inside lua/fail.lua with the
job's stored settings; this pure twin lets users and tests reason about it without Redis."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.core.errors import BadArgument


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff, jittered downward: min(cap, base*factor**(attempt-1)) * (1 - jitter*u).

    Jitter spreads retries of many jobs that failed together, so they do not hit the recovering
    dependency in the same second. jitter=0 gives the exact exponential schedule."""

    base_ms: int = 1_000
    factor: float = 2.0
    cap_ms: int = 3_600_000
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.base_ms, int) or self.base_ms < 0:
            raise BadArgument(f"backoff base_ms must be an int >= 0, got {self.base_ms!r}")
        if isinstance(self.factor, bool) or not _finite_at_least_1(self.factor):
            raise BadArgument(f"backoff factor must be a number >= 1, got {self.factor!r}")
        if not isinstance(self.cap_ms, int) or self.cap_ms < 0:
            raise BadArgument(f"backoff cap_ms must be an int >= 0, got {self.cap_ms!r}")
        if not isinstance(self.jitter, int | float) or isinstance(self.jitter, bool):
            raise BadArgument(f"backoff jitter must be within [0, 1], got {self.jitter!r}")
        if not 0 <= self.jitter <= 1:
            raise BadArgument(f"backoff jitter must be within [0, 1], got {self.jitter!r}")

    def delay_ms(self, attempt: int, u: float = 0.0) -> int:
        """Delay before the retry that follows failed attempt `attempt` (1-based)."""
        if self.base_ms == 0 or self.cap_ms == 0:
            return 0
        # As lua/fail.lua: factor ** n overflows to inf there and raises here; both mean cap.
        try:
            raw = min(float(self.cap_ms), self.base_ms * float(self.factor) ** (attempt - 1))
        except OverflowError:
            raw = float(self.cap_ms)
        return math.floor(raw * (1 - self.jitter * u))


def _finite_at_least_1(x: object) -> bool:
    if not isinstance(x, int | float):
        return False
    try:
        return math.isfinite(x) and x >= 1
    except OverflowError:  # an int too large for a float (10**400)
        return False
