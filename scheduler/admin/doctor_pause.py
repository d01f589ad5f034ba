"""The doctor's check of a queue's pause value edited by hand: claims lease nothing while the
config hash holds `paused_ms` at all (lua/claim.lua), so one that is no time the product writes
(`soon`, `-1`, `1e12`) stops the queue's claims for good, silently (counts and the dashboard
read it as paused at an unknown time). Found as a warning naming the field and its value; the
fix is a resume, which deletes the field whatever it holds (lua/queue_resume.lua)."""

import shlex

from scheduler.admin.doctor_model import Issue
from scheduler.core.keys import QueueKeys
from scheduler.core.limits import MAX_TIME_MS, stored_int

PAUSED_FIELD = "paused_ms"
PAUSED_UNREADABLE = "paused-unreadable"


def paused_field_issues(keys: QueueKeys, raw: object) -> list[Issue]:
    """The config field paused_ms read as `raw` (None: absent) when it is no whole-number time
    in 0..MAX_TIME_MS (queue_pause.lua writes the server time in ms)."""
    if raw is None or stored_int(raw, 0, MAX_TIME_MS) is not None:
        return []
    msg = (f"{keys.config} field {PAUSED_FIELD} {str(raw)[:40]!r} is no whole-number time in "
           f"0..{MAX_TIME_MS} (edited by hand?): the queue reads as paused, its claims are "
           "stopped until it is resumed")  # fmt: skip
    fix = f"scheduler resume -q {shlex.quote(keys.queue)}"
    return [Issue(PAUSED_UNREADABLE, "warning", msg, fix, keys.queue)]
