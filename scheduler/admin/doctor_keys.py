"""The doctor's checks of a queue's own keys beside its jobs: the wake-up LIST, the recurring
schedules (a definition the scripts cannot read stops its runs without a word elsewhere), and
children waiting for parents that can no longer release them."""

import shlex

import redis
from redis.exceptions import ResponseError

from scheduler.admin.doctor_model import Issue
from scheduler.admin.inspection import live_workers
from scheduler.core.errors import edited_by_hand
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


def live_ids(client: redis.Redis, keys: QueueKeys) -> frozenset[str]:
    """The live workers' ids; none known when the workers index is of another type (by hand:
    reported below; it changes only a lease finding's wording, not its repair)."""
    try:
        return frozenset(w.id for w in live_workers(client, keys)[0])
    except ResponseError as exc:
        if not edited_by_hand(exc):
            raise
        return frozenset()


def queue_key_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """wrong_type_wake, then each schedule the scripts cannot read (lua/lib/schedule.lua
    sched_load treats it as absent: its pending run is the last one)."""
    out = wrong_type_wake(keys, str(client.type(keys.wake)))
    workers_type = str(client.type(keys.workers))
    if workers_type not in ("zset", "none"):
        msg = f"{keys.workers} is a {workers_type}, not the workers index: no worker is listed"
        how = f"redis-cli DEL {shlex.quote(keys.workers)} (workers add themselves again)"
        out.append(Issue("wrong-type", "warning", msg, how, keys.queue))
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
    return out + stuck_children(client, keys)


def stuck_children(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """Jobs in flow:waiting whose count of parents not done (`waiting_for`) exceeds the parents
    that can still release them: pending, marked `kids`, the child in their flow:children set
    (lua/lib/flow.lua flow_parent_done). A hand edit of a parent (its `kids` field, its
    record) leaves the child waiting forever; no repair is safe, so it is reported."""
    out: list[Issue] = []
    try:
        waiting = [str(m) for m, _ in client.zscan_iter(keys.flow_waiting)]
    except ResponseError:
        return []  # of another type: the jobs' own checks see them as held
    for cid in waiting:
        count, listed = client.hmget(keys.job(cid), ["waiting_for", "parents"])
        need = int(str(count)) if str(count or "").isdigit() else 1
        parents = str(listed or "").split()
        pipe = client.pipeline(transaction=False)
        for pid in parents:
            pipe.sismember(f"{keys.prefix}flow:children:{pid}", cid)
            pipe.hmget(keys.job(pid), ["kids", "state"])
            pipe.exists(keys.spec(pid))
        replies = pipe.execute(raise_on_error=False)
        able = 0
        for i in range(len(parents)):
            member, fields, spec = replies[3 * i : 3 * i + 3]
            if isinstance(fields, Exception):  # the parent's key of another type: no release
                continue
            kids, state = fields
            ended = state in ("done", "dead", "cancelled") or (state is None and not spec)
            able += bool(member is True or member == 1) and bool(kids) and not ended
        if able < need:
            msg = (f"job {cid} waits for {need} parent(s) of {listed or 'none'!s} but {able} "
                   "can still release it (a parent's record or `kids` mark was edited by "
                   "hand): it will never run")  # fmt: skip
            how = f"scheduler jobs show {cid}; cancel it and enqueue its work again"
            out.append(Issue("stuck-waiting", "error", msg, how, keys.queue, cid))
    return out
