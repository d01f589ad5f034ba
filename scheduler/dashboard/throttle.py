"""Failed-login throttling for the dashboard's basic auth and token: a client address that sent
`limit` wrong credentials within `window_s` gets 429 for the rest of that window, right
credentials included (else guessing would go on at full speed and only the hit would be let
through). Requests without credentials (a browser's first, which prompts) do not count.

Per process and in memory: several dashboard processes each keep their own count. Behind a
proxy every client shares the proxy's address, so one guesser locks out every user for a
window: put the limit on the proxy then (docs/dashboard.md)."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

FAILED_LOGINS_LIMIT = 20
FAILED_LOGINS_WINDOW_S = 60.0
# Addresses tracked at once; the oldest window is forgotten first when a new one needs room.
MAX_TRACKED = 10_000


def client_key(host: str | None) -> str:
    """The bucket of a client address: an IPv6 address by its /64 (one host owns a whole
    /64, so counting each address apart would let it rotate freely), anything else as is."""
    if not host:
        return ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class LoginThrottle:
    """Counts failed logins per client bucket in fixed windows."""

    def __init__(
        self,
        limit: int = FAILED_LOGINS_LIMIT,
        window_s: float = FAILED_LOGINS_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self.max_tracked = max_tracked
        self._failed: dict[str, tuple[float, int]] = {}  # bucket -> (window start, failures)

    def retry_after_s(self, host: str | None) -> int:
        """Whole seconds until this client may try again; 0: it may now."""
        entry = self._failed.get(client_key(host))
        if entry is None or entry[1] < self.limit:
            return 0
        left = entry[0] + self.window_s - self.clock()
        return max(int(left + 0.999), 0)

    def failed(self, host: str | None) -> None:
        key, now = client_key(host), self.clock()
        start, count = self._failed.pop(key, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        if len(self._failed) >= self.max_tracked:
            # Insertion order is last-failure order (the pop above re-inserts): drop the oldest.
            del self._failed[next(iter(self._failed))]
        self._failed[key] = (start, count + 1)
