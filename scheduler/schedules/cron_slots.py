"""Cron slot times: the occurrences of a cron expression in a time zone, as epoch ms, and the
slots that top up a schedule's buffer in Redis when lua/lib/rearm.lua asks (refill_slots).

Time zones and daylight saving time (cron schedules). The expression is matched against the
wall clock of `tz` (an IANA name, default UTC), so "0 9 * * *" in Europe/Berlin fires at 09:00
local time in winter (08:00 UTC) and in summer (07:00 UTC). At the two yearly changes:
- a local time that does not exist (spring forward, e.g. 02:30 on the last Sunday of March in
  Berlin) fires once, shifted forward by the gap (03:30 local): the run is late, never lost;
  two slots that land on the same instant this way fire once;
- a local time that exists twice (fall back, e.g. 02:30 on the last Sunday of October) fires
  once, at its first occurrence (02:30 summer time); "30 * * * *" thus skips the repeated hour,
  as classic cron does. Use `every_ms` for runs evenly spaced in absolute time.

Slots stop at MAX_TIME_MS (2200-01-01 UTC, the latest instant the scripts store): a buffer may
hold fewer than BUFFER_SLOTS, and a schedule with no slot left has ended.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.core.codec import MAX_TIME_MS, ceil_ms, stored_int
from scheduler.core.errors import BadArgument

# croniter (with dateutil, ~15 ms) and cron_fields are imported in the functions that parse a
# cron, at the first one: a producer's `from scheduler import Queue` loads this module (the
# claim and refill code) but may never see a cron schedule (tests/test_import_cost.py).

BUFFER_SLOTS = 64  # cron slots stored ahead; lua/lib/rearm.lua asks for more below 16
MAX_CATCH_UP = 1_000  # catch_up:N's largest N (lua/lib/schedule.lua SCHED_CATCH_UP_MAX)

_GAP_SAMPLE = 64  # cron slots examined to find the smallest gap (for the jitter check)
# A fixed start for the jitter check: validation must not depend on the time of the call.
_GAP_REFERENCE = datetime(2001, 1, 1)


# Zone files that are no IANA zone and mean each host's own setting (localtime, posixrules) or
# a variant tree: producer and workers compute the slots, each on its own host.
_HOST_ZONES = frozenset({"localtime", "posixrules"})
_ZONE_TREES = ("posix/", "right/")


def check_zone(tz: str) -> ZoneInfo:
    """zone_named for a new definition: also refuses names each host may read its own way."""
    if isinstance(tz, str) and (tz in _HOST_ZONES or tz.startswith(_ZONE_TREES)):
        raise BadArgument(
            f"tz must be an IANA time zone name such as Europe/Berlin, got {tz!r}: it is each"
            " host's own file, and the producer and every worker compute the slots"
        )
    return zone_named(tz)


class ZoneUnavailable(BadArgument):
    """This host could not load the zone: its tz database lacks the name (older than the
    producer's, or a name edited by hand) or reading it failed (EMFILE). Another host, or this
    one later, may: a refill leaves its request for them (operations/schedule_refill.py)."""


def zone_named(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise BadArgument(f"tz must be an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, OSError):
        raise ZoneUnavailable(f"unknown time zone {tz!r}") from None
    except ValueError:  # a malformed name: no host reads it
        raise BadArgument(f"unknown time zone {tz!r}") from None


def _to_ms(local: datetime, zone: ZoneInfo) -> int:
    # fold=0: a nonexistent wall time takes the offset before the change (shifted forward by
    # the gap), an ambiguous one its first occurrence. See the module docstring.
    return ceil_ms(local.replace(tzinfo=zone, fold=0))


_DAY_MS = 86_400_000


def _exists(local: datetime, zone: ZoneInfo, ms: int) -> bool:
    """Is `ms` (_to_ms of `local`) that wall time itself, not one shifted out of a gap?"""
    return datetime.fromtimestamp(ms / 1000, zone).replace(tzinfo=None) == local


# Every refill parses the expression again on the claiming worker's event loop: a 600 KB list
# took 1.1 s a refill. The longest useful one (each minute listed) is under 200 characters.
MAX_CRON_CHARS = 512


def _refuse_hashed(expr: str) -> None:
    """Refused: an expression over MAX_CRON_CHARS (a stored one edited by hand too: read as
    unreadable, never parsed), and croniter's `R` (random) and `H` (hashed) fields, which draw
    their value at each computation (upsert, resume, every refill), so the slots would move.
    No month or weekday name starts with either letter."""
    if len(expr) > MAX_CRON_CHARS:
        raise BadArgument(f"cron expression is {len(expr)} characters, over {MAX_CRON_CHARS}")
    for field in expr.split():
        if any(part[:1] and part[0] in "hHrR" for part in field.split(",")):
            raise BadArgument(
                f"cron {expr!r}: random (R) and hashed (H) fields are not supported; "
                "use a fixed value (jitter_ms spreads start times)"
            )


def _search_start(after_ms: int, zone: ZoneInfo) -> datetime:
    """The wall time to search forward from for slots after `after_ms`: its own, except in the
    second pass of a repeated hour (fall back). Every wall time from there to the end of the
    repeated span maps to its first pass (_to_ms), before `after_ms`: a seconds-level cron
    would spend the whole search there. Then the span's end, found by bisection to 1 s (the
    one candidate it may leave before the end is skipped as not after `after_ms`)."""
    at = datetime.fromtimestamp(after_ms / 1000, zone)
    local = at.replace(tzinfo=None)
    if not at.fold:
        return local
    first, second = (local.replace(tzinfo=zone, fold=f).utcoffset() or timedelta() for f in (0, 1))
    lo, hi = local, local + first - second  # the span ends at or before hi
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if _to_ms(mid, zone) > after_ms:
            hi = mid
        else:
            lo = mid
    return lo


def _sprang(ms: int, zone: ZoneInfo) -> timedelta | None:
    """How far the offset sprang forward in the day before `ms` (the gap), or None."""
    before = datetime.fromtimestamp((ms - _DAY_MS) / 1000, zone).utcoffset()
    now = datetime.fromtimestamp(ms / 1000, zone).utcoffset()
    if before is None or now is None or before >= now:
        return None
    return now - before


def _gap_start(after_ms: int, zone: ZoneInfo) -> datetime | None:
    """Within a day after a spring forward, the wall time `after_ms` has under the offset of
    the day before: the wall times from there to its own lie in the gap when it is that recent,
    and map (shifted by it) to instants after `after_ms`. None when the offset did not grow."""
    gap = _sprang(after_ms, zone)
    if gap is None:
        return None
    return datetime.fromtimestamp(after_ms / 1000, zone).replace(tzinfo=None) - gap


def _gap_behind(ms: int, zone: ZoneInfo) -> bool:
    """Did a spring forward end less than its gap before `ms`? Wall times in that gap map up
    to the gap after it, so past `ms`."""
    gap = _sprang(ms, zone)
    if gap is None:
        return False
    back = ms - int(gap.total_seconds() * 1000)
    offsets = (datetime.fromtimestamp(t / 1000, zone).utcoffset() for t in (back, ms))
    return next(offsets) != next(offsets)


def _in_gap_after(expr: str, zone: ZoneInfo, after_ms: int, count: int) -> set[int]:
    """The slots after `after_ms` of wall times before its own: those in a gap (spring
    forward) that ended less than its length before it, shifted past it. Wall times that
    exist from there on map before `after_ms`: the first one ends the search."""
    from croniter.croniter import CroniterBadDateError, croniter

    start = _gap_start(after_ms, zone)
    found: set[int] = set()
    if start is None:
        return found
    it = croniter(expr, start)
    for _ in range(count * 4 + 1000):
        try:
            local = it.get_next(datetime)
        except CroniterBadDateError:
            break
        ms = _to_ms(local, zone)
        if _exists(local, zone, ms) or ms > MAX_TIME_MS:
            break
        if ms > after_ms:
            found.add(ms)
    return found


def cron_slots_after(expr: str, tz: str, after_ms: int, count: int) -> list[int]:
    """The next `count` slots strictly after `after_ms`, ascending; fewer near MAX_TIME_MS."""
    from croniter.croniter import CroniterBadDateError, croniter

    _refuse_hashed(expr)
    zone = zone_named(tz)
    found = _in_gap_after(expr, zone, after_ms, count)
    it = croniter(expr, _search_start(after_ms, zone))
    for _ in range(count * 4 + 1000):
        try:
            local = it.get_next(datetime)
        except CroniterBadDateError:  # no further date within croniter's search range
            break
        ms = _to_ms(local, zone)
        if ms > MAX_TIME_MS:
            break
        if ms > after_ms:
            found.add(ms)
        # Wall times come in order, their instants not quite: one in a gap maps up to the gap
        # later, past the real times after the gap (a 30 min one: 02:28 -> 02:58, then 02:35).
        # Every wall time after one that exists maps after it: enough are found then.
        if len(found) >= count and _exists(local, zone, ms) and ms >= sorted(found)[count - 1]:
            break
    return sorted(found)[:count]


def cron_slots_upto(expr: str, tz: str, upto_ms: int, count: int) -> list[int]:
    """The latest `count` slots at or before `upto_ms`, ascending. In the second pass of a
    repeated hour, back from the span's end: its wall times map to the first pass, all before
    `upto_ms` (searched back from `upto_ms`'s own wall time, the rest of the pass was missed)."""
    from croniter.croniter import croniter

    _refuse_hashed(expr)
    zone = zone_named(tz)
    it = croniter(expr, _search_start(upto_ms, zone) + timedelta(seconds=1))
    found: set[int] = set()
    for _ in range(count * 4 + 1000):
        try:
            local = it.get_prev(datetime)
        except (ValueError, OverflowError):  # before year 1 (29 February, ~500 slots back)
            break
        ms = _to_ms(local, zone)
        if ms <= upto_ms:
            found.add(ms)
        # Backwards, a wall time in a gap met later maps up to the gap past the real ones met
        # before it (cron_slots_after): enough are found at one that exists with no gap that
        # ended less than its length before it.
        if (
            len(found) >= count
            and ms < sorted(found)[-count]
            and _exists(local, zone, ms)
            and not _gap_behind(ms, zone)
        ):
            break
    return sorted(found)[-count:]


def check_cron(expr: str, tz: str) -> tuple[int, ...]:
    if not isinstance(expr, str) or len(expr.split()) not in (5, 6):
        raise BadArgument(f"cron must have 5 fields (or 6 with seconds), got {expr!r}")
    return _checked_cron(expr, zone_named(tz).key)


# Cached: the check does not depend on the time of the call, and an app that syncs 10,000
# schedules at every deploy spent most of its time here (bench/schedules_scale.py).
@functools.lru_cache(maxsize=1024)
def _checked_cron(expr: str, tz: str) -> tuple[int, ...]:
    from croniter.croniter import CroniterBadCronError, croniter

    from scheduler.schedules.cron_fields import refuse_misread

    _refuse_hashed(expr)  # before croniter's own check: say why
    refuse_misread(expr)  # at definition only: a stored one keeps croniter's reading
    try:
        if not croniter.is_valid(expr):
            raise BadArgument(f"malformed cron expression {expr!r}")
        start = _to_ms(_GAP_REFERENCE, zone_named(tz))
        slots = cron_slots_after(expr, tz, start, _GAP_SAMPLE)
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        if isinstance(exc, BadArgument):
            raise
        raise BadArgument(f"malformed cron expression {expr!r}: {exc}") from None
    if len(slots) < 2:
        raise BadArgument(f"cron expression {expr!r} (almost) never fires")
    return tuple(slots)


def utc_ms(at: datetime) -> int:
    """An aware datetime as epoch ms, rounded up (for tests and callers that think in
    datetimes)."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise BadArgument("datetime must be timezone-aware")
    return ceil_ms(at)


def refill_requested(claim_reply: Any, n_jobs: int, fields_per_job: int) -> bool:
    """claim.lua appends, after the jobs, how many schedules wait for a buffer refill."""
    i = 3 + n_jobs * fields_per_job
    return len(claim_reply) > i and int(claim_reply[i]) > 0


def refill_slots(fields: dict[str, str], slots_tail: int | None, now_ms: int) -> list[int]:
    """Slots to add to a cron schedule's buffer: everything after what it holds (or after its
    cursor), where a long outage is cut to the latest overdue slots the misfire policy may
    still need (N + 1) plus a full buffer of future slots."""
    expr, tz = fields["cron"], fields["tz"]
    cursor = stored_int(fields.get("cursor_ms")) or 0
    after = max(cursor, slots_tail or 0)
    eff = now_ms - (stored_int(fields.get("offset_ms")) or 0)
    if after >= eff:
        return cron_slots_after(expr, tz, after, BUFFER_SLOTS)
    # A hand-edited misfire_n reads as at most MAX_CATCH_UP (as lua/lib/schedule.lua does).
    keep = min(stored_int(fields.get("misfire_n"), 0) or 0, MAX_CATCH_UP) + 1
    overdue = [s for s in cron_slots_upto(expr, tz, eff, keep) if s > after]
    return overdue + cron_slots_after(expr, tz, eff, BUFFER_SLOTS)
