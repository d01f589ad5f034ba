"""A cron expression's fields read as croniter would misread them, refused at definition
(`check_cron`): a reversed range ('5-2', 'fri-mon', 'dec-jan') croniter wraps around, a range of
one value ('3-3') it reads as every value, a step that leaves one value ('*/90' minutes:
minute 0, so hourly; '7/2' days of the week: Sunday, which croniter reads as every other day
from Sunday) that a user meant as an interval, and a day-of-week step from a day that cron
reads with Sunday (7) at its end and croniter without ('1/2'), and both day fields restricted
with one written from '*' ('*/2'), which classic cron matches as days in both and croniter as
days in either ('_refuse_star_day'). Each is a malformed cron expression
(BadArgument naming the part and what to write). Fields are croniter's order: minute, hour, day
of month, month, day of week, then the optional seconds. Parts holding L, W, #, ? or a name in
the wrong field are left to croniter's own check."""

from __future__ import annotations

from croniter import croniter

from scheduler.core.errors import BadArgument

# name, lowest, highest value; day of week 7 is Sunday too (croniter: 0-7, and '*' is 0-6)
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 6),
    ("second", 0, 59),
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {m: i for i, m in enumerate(_MONTHS, 1)},
    {d: i for i, d in enumerate(_DAYS)},
)


def _value(field: int, text: str) -> int | None:
    if text.isascii() and text.isdigit():
        return int(text)
    names = _NAMES[field] if field < len(_NAMES) else {}
    return names.get(text.lower())


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def refuse_misread(expr: str) -> None:
    """BadArgument for the first part of `expr` croniter would misread (module docstring)."""
    _refuse_fields(expr)
    _refuse_star_day(expr)


def _refuse_star_day(expr: str) -> None:
    """Classic cron (Vixie, cronie: a day field whose text starts with '*' is unrestricted)
    matches the days in both day fields when either starts with '*'; croniter, once neither
    expands to every day, the days in either: '0 0 */2 * 1' is the odd days that are Mondays
    to one, every odd day and every Monday to the other."""
    fields = expr.split()
    if len(fields) < 5 or not (fields[2].startswith("*") or fields[4].startswith("*")):
        return
    try:
        expanded = croniter.expand(expr)[0]
    except Exception:  # a malformed expression: croniter's own check says so
        return
    if expanded[2][0] == "*" or expanded[4][0] == "*":  # one side is every day: one reading
        return
    raise BadArgument(
        f"cron {expr!r}: the day-of-month {fields[2]!r} and day-of-week {fields[4]!r} are "
        "read two ways (classic cron: days in both, as one is written from '*'; croniter: "
        "days in either): for either, write the '*' one as a range ('1-31/2', '0-6/2'); "
        "for both, schedule on one field and check the other in the handler"
    )


def _refuse_fields(expr: str) -> None:
    for field, text in enumerate(expr.split()[: len(_FIELDS)]):
        name, lowest, highest = _FIELDS[field]
        for part in text.split(","):
            base, slash, step_text = part.partition("/")
            first, dash, last = base.partition("-")
            low, high = _value(field, first), _value(field, last)
            top = 7 if field == 4 else highest  # day of week 7: Sunday
            for v in (low, high):  # croniter reads '0-0' of the days of the month as '*'
                if v is not None and not lowest <= v <= top:
                    raise BadArgument(
                        f"cron {expr!r}: {v} is out of the {name} field's range {lowest}-{top}"
                    )
            if dash and low is not None and high is not None:
                where = f"cron {expr!r}: the range {base!r} in the {name} field"
                if low > high:
                    wrap = _span(min(low, highest), highest) + "," if low <= highest else ""
                    hint = "" if slash else f": write '{wrap}{_span(lowest, high)}'"
                    raise BadArgument(f"{where} is reversed (ranges go low-high){hint}")
                if low == high:  # croniter reads 'a-a' as '*'
                    raise BadArgument(f"{where} is one value: write '{first}'")
            step = int(step_text) if step_text.isascii() and step_text.isdigit() else 0
            if step <= 0:  # no step, or one croniter refuses itself
                continue
            if base == "*":
                low, high = lowest, highest
            elif not dash:
                high = highest
                if field == 4 and low is not None and 1 <= low < 7 and (7 - low) % step == 0:
                    # Vixie cron steps up to 7 (Sunday), croniter up to 6: '1/2' is Monday,
                    # Wednesday, Friday and Sunday to one, without Sunday to the other.
                    days = ",".join(str(d) for d in range(low, 8, step))
                    raise BadArgument(
                        f"cron {expr!r}: the step {part!r} in the {name} field is read two "
                        f"ways (with or without Sunday, 7): write the days, e.g. '{days}'"
                    )
            # A start of 7 (Sunday) croniter reads as 0, stepping from there: '7/1' every day.
            if low is not None and high is not None and (low > high or low + step > high):
                raise BadArgument(
                    f"cron {expr!r}: the step {step} in the {name} field "
                    f"leaves one value ({low}): write '{low}', or for a longer interval than "
                    "cron can say use every_ms"
                )
