"""The doctor's checks of a queue's own keys beside its jobs (and the conversion of an old dead
LIST before them): its config, the wake-up LIST, the recurring schedules (a definition the
scripts cannot read stops its runs without a word elsewhere), and children waiting for parents
that can no longer release them."""

import shlex

import redis
from redis.exceptions import ResponseError

from scheduler.admin.doctor_flow import (
    config_field_issues,
    key_set_issues,
    logical_config_issues,
    schedule_flow_issues,
)
from scheduler.admin.doctor_model import _PAGE, Issue
from scheduler.admin.doctor_scan import pages
from scheduler.admin.doctor_workers import worker_key_issues
from scheduler.admin.inspection import live_workers, server_now_ms
from scheduler.admin.redis_cli import positional
from scheduler.client.queue import Queue
from scheduler.core.codec import stored_int
from scheduler.core.errors import BadArgument, edited_by_hand, newer_storage
from scheduler.core.keys import STORAGE_GENERATION, QueueKeys
from scheduler.operations.dead_letters import dead_converted
from scheduler.schedules.cron_fields import refuse_misread
from scheduler.schedules.cron_slots import cron_slots_after
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


def convert_dead(client: redis.Redis, keys: QueueKeys) -> None:
    """Finish converting a dead LIST of an older version into the ZSET, in the script's
    bounded steps (lua/dead_migrate.lua); nothing to do on a ZSET. Through Queue's driver: by
    EVALSHA, the script loaded only when the server lacks it (not on every check)."""
    Queue(client, keys.queue)._run(dead_converted())


def config_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """The queue's `config` hash: of another type, it holds no pause, dead-letter retention
    or storage generation for the scripts (they read it with pcall); its `generation` field
    (lua/lib/util.lua newer_storage_err) above this version's refuses every write to the queue;
    one that is no plain number (by hand) refuses nothing."""
    config_type = str(client.type(keys.config))
    if config_type not in ("hash", "none"):
        msg = (f"{keys.config} is a {config_type}, not the config hash: no pause, dead-letter "
               "retention or storage generation is read from it")  # fmt: skip
        how = f"inspect it: redis-cli TYPE {shlex.quote(keys.config)}"
        return [Issue("wrong-type", "warning", msg, how, keys.queue)]
    if config_type == "none":
        return []
    fields = config_field_issues(client, keys)  # doctor_flow: the fields read with a default
    raw = client.hget(keys.config, "generation")
    if raw is None:
        return fields
    newer = newer_storage(keys.queue, raw, STORAGE_GENERATION)
    if newer is not None:
        how = "upgrade scheduler (this doctor, every worker and producer of the queue)"
        return [Issue("newer-storage", "error", str(newer), how, keys.queue)]
    if str(raw).isascii() and str(raw).isdigit() and int(str(raw)) <= STORAGE_GENERATION:
        return fields
    msg = f"{keys.config} field generation {str(raw)[:40]!r} is no storage generation (by hand)"
    how = f"redis-cli HDEL {shlex.quote(keys.config)} generation (it refuses nothing)"
    return [*fields, Issue("unreadable-generation", "warning", msg, how, keys.queue)]


def queue_key_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """config_issues, wrong_type_wake, then each schedule whose runs stopped (_schedule_issues:
    a hash lua/lib/schedule.lua sched_load treats as absent, its slot buffer of another type,
    starved with no refill asked for) or with no hash, and doctor_flow's checks of flow state
    edited by hand (a partitioned queue's own config among them, with its first partition)."""
    out = config_issues(client, keys) + logical_config_issues(client, keys)
    out += key_set_issues(client, keys, server_now_ms(client, keys))
    out += wrong_type_wake(keys, str(client.type(keys.wake)))
    out += worker_key_issues(client, keys)
    finished_type = str(client.type(keys.finished))
    if finished_type not in ("zset", "none"):
        msg = f"{keys.finished} is a {finished_type}, not the finished index: none is listed"
        how = f"redis-cli DEL {shlex.quote(keys.finished)} (jobs finishing from then are listed)"
        out.append(Issue("wrong-type", "warning", msg, how, keys.queue))
    ending_type = str(client.type(keys.flow_ending))
    if ending_type not in ("zset", "none"):
        msg = (f"{keys.flow_ending} is a {ending_type}, not the ZSET of parents' ends left for "
               "later: children of a parent of more than 500 wait on (stuck-waiting)")  # fmt: skip
        how = f"redis-cli DEL {shlex.quote(keys.flow_ending)}"
        out.append(Issue("wrong-type", "error", msg, how, keys.queue))
    index_type = str(client.type(keys.schedules))
    if index_type not in ("set", "none"):
        msg = f"{keys.schedules} is a {index_type}, not the SET of schedule names"
        how = f"inspect it: redis-cli TYPE {shlex.quote(keys.schedules)}"
        return [*out, Issue("wrong-type", "error", msg, how, keys.queue)]
    for name in sorted(str(n) for n in client.smembers(keys.schedules)):
        out += _schedule_issues(client, keys, name)
    return out + stuck_children(client, keys)


def _schedule_issues(client: redis.Redis, keys: QueueKeys, name: str) -> list[Issue]:
    """One name of the schedules index: its hash the scripts cannot read, its slot buffer of
    another type, its runs stopped with no refill asked for, or no hash at all."""
    redo = "remove it and define it again (`scheduler schedules remove`, then add it)"
    key = keys.schedule(name)
    key_type = str(client.type(key))
    if key_type == "none":
        return _stale_name(client, keys, name)
    if key_type != "hash":
        msg = f"{key} is a {key_type}, not a schedule hash: its runs stopped"
        return [Issue("wrong-type", "error", msg, redo, keys.queue)]
    fields = {str(k): str(v) for k, v in client.hgetall(key).items()}
    field = unreadable_field(fields)
    if field:
        msg = f"schedule {name!r}: its {field} field cannot be read: its runs stopped"
        return [Issue("schedule-unreadable", "error", msg, redo, keys.queue)]
    out = schedule_flow_issues(keys, name, fields)
    if fields.get("kind") != "cron":
        return out
    out += _cron_misread(keys.queue, name, fields.get("cron", ""))
    # Resume deletes the buffer and writes it again (lua/schedule_resume.lua).
    again = (f"pause and resume it (`scheduler schedules pause -q {shlex.quote(keys.queue)} "
             f"{positional(name)}`, then `resume`): resume writes its slots again")  # fmt: skip
    slots_type = str(client.type(keys.schedule_slots(name)))
    if slots_type not in ("zset", "none"):
        msg = (f"{keys.schedule_slots(name)} is a {slots_type}, not the ZSET of schedule "
               f"{name!r}'s next slots: its runs stop once its pending run is claimed")  # fmt: skip
        return [*out, Issue("wrong-type", "error", msg, again, keys.queue)]
    return out + _starved(client, keys, name, fields, again)


def _starved(
    client: redis.Redis, keys: QueueKeys, name: str, fields: dict[str, str], again: str
) -> list[Issue]:
    """A cron schedule starved (its buffer ran out: lua/lib/rearm.lua sched_place) with no
    refill asked for: the workers gave up computing its slots (lua/schedule_refill.lua), so no
    run comes. Read again in one MULTI: a refill meanwhile clears both. One whose times ended
    (no slot left before 2200) is not reported."""
    if fields.get("starved") != "1" or fields.get("paused") == "1":
        return []
    pipe = client.pipeline(transaction=True)
    pipe.hmget(keys.schedule(name), ["starved", "paused", "pending"])
    pipe.sismember(keys.schedules_refill, name)
    try:
        (starved, paused, pending), asked = pipe.execute()
    except ResponseError:
        return []  # edited into another type meanwhile, or the refill SET is one (advisory)
    if starved != "1" or paused == "1" or pending or asked:
        return []
    try:
        after = stored_int(fields.get("cursor_ms")) or 0
        if not cron_slots_after(fields.get("cron", ""), fields.get("tz", ""), after, 1):
            return []
        why = ""
    except (ValueError, KeyError, OverflowError, OSError) as exc:
        why = f" ({type(exc).__name__}: {str(exc)[:120]})"
    msg = (f"schedule {name!r}: no run is pending and no worker is asked to compute its next "
           f"slots (they could not{why}): its runs stopped")  # fmt: skip
    how = f"define it again (the same definition places its run) or {again}"
    return [Issue("schedule-starved", "error", msg, how, keys.queue)]


def _stale_name(client: redis.Redis, keys: QueueKeys, name: str) -> list[Issue]:
    """A name in the schedules index without its hash (deleted by hand): no schedule, but
    `queue move` counted it. Read again in one MULTI: a definition meanwhile writes both."""
    pipe = client.pipeline(transaction=True)
    pipe.sismember(keys.schedules, name)
    pipe.exists(keys.schedule(name))
    listed, exists = pipe.execute(raise_on_error=False)
    if listed not in (True, 1) or exists != 0:
        return []
    msg = f"schedule {name!r} is in {keys.schedules} without its hash (deleted by hand)"
    how = (f"scheduler schedules remove -q {shlex.quote(keys.queue)} {positional(name)} "
           "(drops the name)")  # fmt: skip
    return [Issue("schedule-no-hash", "warning", msg, how, keys.queue)]


def _cron_misread(queue: str, name: str, cron: str) -> list[Issue]:
    """A stored cron that define() now refuses (schedules/cron_fields.py: stored before it did):
    it runs as croniter reads it (a reversed range wrapped around, '3-3' as every hour)."""
    try:
        refuse_misread(cron)
    except BadArgument as exc:
        msg = f"schedule {name!r}: {exc}; it runs as croniter reads that, not as written"
        how = "define it again with the cron written so (q.schedule / `scheduler schedules add`)"
        return [Issue("schedule-cron-misread", "warning", msg, how, queue)]
    return []


def stuck_children(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """Jobs in flow:waiting whose count of parents not done (`waiting_for`) exceeds the parents
    that can still release them: pending, marked `kids`, the child in their flow:children set
    (lua/lib/flow.lua flow_parent_done). A hand edit of a parent (its `kids` field, its
    record) leaves the child waiting forever; no repair is safe, so it is reported. Read in
    pages; a suspect is read again inside one MULTI, so a child a parent releases meanwhile is
    not reported."""
    if str(client.type(keys.flow_waiting)) not in ("zset", "none"):
        return []  # of another type: the jobs' own checks see them as held
    out: list[Issue] = []
    waiting = (str(m) for m, _ in client.zscan_iter(keys.flow_waiting, count=_PAGE))
    for page in pages(waiting, _PAGE):  # a page at a time: a fan-out is never held whole
        pipe = client.pipeline(transaction=False)
        for cid in page:
            pipe.hget(keys.job(cid), "parents")
        listed = pipe.execute(raise_on_error=False)
        items = [
            (c, str(v).split()) for c, v in zip(page, listed, strict=True) if isinstance(v, str)
        ]
        suspects = [(c, ps) for c, ps, _, _ in _stuck(client, keys, items, transaction=False)]
        for cid, parents, need, able in _stuck(client, keys, suspects, transaction=True):
            msg = (f"job {cid} waits for {need} parent(s) of {' '.join(parents)} but {able} "
                   "can still release it (a parent's record or `kids` mark was edited by "
                   "hand): it will never run")  # fmt: skip
            show = f"-q {shlex.quote(keys.queue)} {positional(cid)}"
            how = (f"scheduler jobs show {show}; cancel it (scheduler jobs cancel {show}) and "
                   "enqueue its work again")  # fmt: skip
            out.append(Issue("stuck-waiting", "error", msg, how, keys.queue, cid))
    return out


def _stuck(
    client: redis.Redis, keys: QueueKeys, items: list[tuple[str, list[str]]], *, transaction: bool
) -> list[tuple[str, list[str], int, int]]:
    """(id, parents, waiting_for, parents able to release it) of each (id, parents) still in
    flow:waiting, still listing those parents, that no end of them would release."""
    if not items:
        return []
    pipe = client.pipeline(transaction=transaction)
    for cid, parents in items:
        pipe.zscore(keys.flow_waiting, cid)
        pipe.hmget(keys.job(cid), ["waiting_for", "parents"])
        for pid in parents:
            pipe.sismember(f"{keys.prefix}flow:children:{pid}", cid)
            pipe.hmget(keys.job(pid), ["kids", "state"])
            pipe.exists(keys.spec(pid))
            for word in _ENDS:  # the child in an end's set, left for later steps (lib/flow.lua)
                pipe.sismember(f"{keys.flow_ending}:{word}:{pid}", cid)
    replies = pipe.execute(raise_on_error=False)
    out: list[tuple[str, list[str], int, int]] = []
    i = 0
    for cid, parents in items:
        score, fields = replies[i], replies[i + 1]
        reads = replies[i + 2 : i + 2 + _READS * len(parents)]
        i += 2 + _READS * len(parents)
        if score is None or any(isinstance(r, Exception) for r in (score, fields)):
            continue  # released meanwhile, or its keys of another type (other checks)
        count, now_listed = fields
        if str(now_listed or "").split() != parents:
            continue  # changed between the reads
        need = int(str(count)) if str(count or "").isdigit() else 1
        able = sum(_can_release(reads[_READS * k : _READS * (k + 1)]) for k in range(len(parents)))
        if able < need:
            out.append((cid, parents, need, able))
    return out


_ENDS = ("done", "dead", "cancelled")
_READS = 3 + len(_ENDS)


def _can_release(reads: list[object]) -> bool:
    """A parent's (SISMEMBER of the child, HMGET kids state, EXISTS spec, SISMEMBER of the
    child in each end's own set): will its end count the child down? Yes while the parent is
    pending with the child in its set, or while an end of it has the child left for a later
    step; not when its key is of another type (by hand)."""
    member, fields, spec, *queued = reads
    if any(q in (True, 1) for q in queued):
        return True  # that end goes on at the next claims (lua/lib/flow.lua flow_ending_step)
    if member not in (True, 1):
        return False
    if not isinstance(fields, list):
        return False
    kids, state = fields
    ended = state in _ENDS or (state is None and not spec)
    return bool(kids) and not ended
