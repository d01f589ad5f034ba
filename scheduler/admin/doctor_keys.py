"""The doctor's checks of a queue's own keys beside its jobs: the wake-up LIST and the recurring
schedules (a definition the scripts cannot read stops its runs without a word elsewhere)."""

import shlex

import redis

from scheduler.admin.doctor_model import Issue
from scheduler.core.keys import QueueKeys
from scheduler.schedules.stored import unreadable_field


def wrong_type_wake(keys: QueueKeys, key_type: str) -> list[Issue]:
    """The wake-up LIST of another type (by hand): every worker's wake-up pop on its server
    fails, so they claim by polling; the next enqueue's wake-up replaces it."""
    if key_type in ("list", "none"):
        return []
    msg = f"{keys.wake} is a {key_type}, not the wake-up LIST: idle workers poll until it is gone"
    how = f"redis-cli DEL {shlex.quote(keys.wake)} (advisory: nothing is lost)"
    return [Issue("wrong-type", "warning", msg, how, keys.queue)]


def queue_key_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """wrong_type_wake, then each schedule the scripts cannot read (lua/lib/schedule.lua
    sched_load treats it as absent: its pending run is the last one)."""
    out = wrong_type_wake(keys, str(client.type(keys.wake)))
    index_type = str(client.type(keys.schedules))
    if index_type not in ("set", "none"):
        msg = f"{keys.schedules} is a {index_type}, not the SET of schedule names"
        how = f"inspect it: redis-cli TYPE {shlex.quote(keys.schedules)}"
        return [*out, Issue("wrong-type", "error", msg, how, keys.queue)]
    redo = "remove it and define it again (`scheduler schedules remove`, then add it)"
    for name in sorted(str(n) for n in client.smembers(keys.schedules)):
        key = keys.schedule(name)
        key_type = str(client.type(key))
        if key_type == "hash":
            field = unreadable_field({str(k): str(v) for k, v in client.hgetall(key).items()})
            if field:
                msg = f"schedule {name!r}: its {field} field cannot be read: its runs stopped"
                out.append(Issue("schedule-unreadable", "error", msg, redo, keys.queue))
        elif key_type != "none":
            msg = f"{key} is a {key_type}, not a schedule hash: its runs stopped"
            out.append(Issue("wrong-type", "error", msg, redo, keys.queue))
    return out
