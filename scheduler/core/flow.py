"""Flow control arguments of enqueue (docs/flow-control.md): priority, concurrency key and
limit, rate limit, dependencies. Checked here before anything is sent (BadArgument naming the
field and the range); lua/lib/flow.lua checks the same ranges again."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.errors import BadArgument
from scheduler.core.keys import check_job_id
from scheduler.core.limits import DAY_MS, TASK_RE

# The valid ranges, inclusive (lua/lib/flow.lua FLOW_LIM repeats them; a test checks they agree).
FLOW_LIMITS: dict[str, tuple[int, int]] = {
    "priority": (0, 9),
    "concurrency_limit": (1, 10_000),
    "rate.count": (1, 100_000),
    "rate.window_ms": (1, DAY_MS),
    "after": (0, 100),  # parents per job
}
DEFAULT_PRIORITY_AGING_MS = 60_000
# A concurrency or rate key: the task-name alphabet, so it is safe inside a key name.
FLOW_KEY_RE = TASK_RE
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": DAY_MS}
_RATE_RE = re.compile(r"\s*(\d{1,9})\s*/\s*(\d{0,12})\s*(ms|s|m|h|d)\s*", re.ASCII)


def _bounded(value: Any, name: str) -> int:
    lo, hi = FLOW_LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadArgument(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _flow_key(value: Any, name: str) -> str:
    if not isinstance(value, str) or not FLOW_KEY_RE.fullmatch(value):
        raise BadArgument(f"invalid {name} {value!r}: use 1-200 of A-Z a-z 0-9 _ . : / -")
    return value


@dataclass(frozen=True)
class RateLimit:
    """At most `count` claims in any window of `window_ms` (server clock)."""

    count: int
    window_ms: int

    def __post_init__(self) -> None:
        _bounded(self.count, "rate.count")
        _bounded(self.window_ms, "rate.window_ms")

    @classmethod
    def parse(cls, spec: Any) -> RateLimit:
        """A RateLimit, a (count, window_ms) pair, or text 'N/<n><unit>' ('10/1s', '100/m',
        '5/250ms'; units ms s m h d)."""
        if isinstance(spec, RateLimit):
            return spec
        if isinstance(spec, tuple) and len(spec) == 2:
            return cls(spec[0], spec[1])
        if isinstance(spec, str):
            m = _RATE_RE.fullmatch(spec)
            if m:
                return cls(int(m.group(1)), int(m.group(2) or "1") * _UNITS_MS[m.group(3)])
        raise BadArgument(f"rate_limit must be 'N/<window>' like '10/1s' or '100/m', got {spec!r}")

    def text(self) -> str:
        return f"{self.count}/{self.window_ms}ms"


@dataclass(frozen=True)
class Flow:
    """The checked flow arguments of one job; `Flow()` is the plain path."""

    priority: int = 0
    concurrency_key: str = ""
    concurrency_limit: int = 0
    rate_key: str = ""
    rate: RateLimit | None = None
    after: tuple[str, ...] = ()

    @property
    def plain(self) -> bool:
        return self == _PLAIN


_PLAIN = Flow()


def check_flow(
    task: str,
    *,
    priority: Any = 0,
    concurrency_key: Any = None,
    concurrency_limit: Any = None,
    rate_limit: Any = None,
    rate_key: Any = None,
    after: Any = None,
) -> Flow:
    """Every flow argument checked together; BadArgument on the first bad one."""
    prio = _bounded(priority, "priority")
    ckey, climit = "", 0
    if concurrency_key is not None or concurrency_limit is not None:
        if concurrency_key is None or concurrency_limit is None:
            raise BadArgument("give concurrency_key and concurrency_limit together")
        ckey = _flow_key(concurrency_key, "concurrency_key")
        climit = _bounded(concurrency_limit, "concurrency_limit")
    rate, rkey = None, ""
    if rate_limit is not None:
        rate = RateLimit.parse(rate_limit)
        rkey = _flow_key(task if rate_key is None else rate_key, "rate_key")
    elif rate_key is not None:
        raise BadArgument("rate_key needs a rate_limit")
    parents: tuple[str, ...] = ()
    if after is not None:
        if isinstance(after, str) or not isinstance(after, Sequence):
            raise BadArgument(f"after must be a list of job ids, got {after!r}")
        if len(after) > FLOW_LIMITS["after"][1]:
            raise BadArgument(f"after takes at most {FLOW_LIMITS['after'][1]} job ids")
        parents = tuple(dict.fromkeys(check_job_id(p) for p in after))
    return Flow(prio, ckey, climit, rkey, rate, parents)


def flow_field(flow: Flow) -> str:
    """The one flow ARGV field of a job in lua/enqueue.lua: '' on the plain path, else
    'priority|ckey|climit|rkey|rate_count|rate_window_ms|parents' (parents space-separated;
    '' / '0' where unused)."""
    if flow.plain:
        return ""
    rate = flow.rate
    return "|".join(
        (
            str(flow.priority),
            flow.concurrency_key,
            str(flow.concurrency_limit),
            flow.rate_key,
            str(rate.count) if rate else "0",
            str(rate.window_ms) if rate else "0",
            " ".join(flow.after),
        )
    )
