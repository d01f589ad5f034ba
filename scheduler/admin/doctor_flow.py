"""The doctor's checks of flow control's state edited by hand (docs/flow-control.md): the
queue's config fields the scripts read with a silent default (so a bad edit never stops a
claim), a schedule's flow fields its runs read as unset, and members of a concurrency key's
lease set (flow:ck:<key>) that are no lease of that key. Claim checks a member only once its
score has passed, so one added by hand with a far score holds a slot for ever; `--fix`
removes it with lua/repair.lua's 'ckfree' move (fix_stray_slots), which lets the key's held
jobs take the room. Entries of a key's hold set (flow:ckheld:<key>) whose job is not held (no
flow:held entry, added by hand): a stale head is read as a held job of limit 1 and stops the
key's held jobs going back to due; `--fix` removes it ('ckstale')."""

import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import redis
from redis.exceptions import NoScriptError, ResponseError

from scheduler.admin.doctor_model import _PAGE, Issue, repair_sha
from scheduler.admin.doctor_pause import PAUSED_FIELD, paused_field_issues
from scheduler.admin.doctor_scan import pages
from scheduler.admin.inspection import stored_layout
from scheduler.core import connection, scripts
from scheduler.core.errors import BadArgument
from scheduler.core.flow import DEFAULT_PRIORITY_AGING_MS
from scheduler.core.keys import QueueKeys
from scheduler.core.limits import MAX_DELAY_MS, MAX_SAFE_INT, MAX_TIME_MS, stored_int
from scheduler.core.partitions import PARTITION_NAME
from scheduler.schedules.stored import flow_unreadable_field

STRAY = "flow-slot-stray"
STALE = "flow-held-stale"
UNREAD = "config-unread"

# Each config field a script reads (lua/claim.lua, lib/flow.lua, lib/job.lua; `generation`
# and `paused_ms` are checked elsewhere: any paused_ms is a pause, doctor_pause.py): (the least
# the scripts read, the least the product writes, the most, what they use instead, how to set).
_RETENTION = "scheduler dead retention -q {q} --max-age 30d | --max-count N | --off"
_AGING = "scheduler queue priority-aging -q {q} <ms> | --default"
CONFIG_FIELDS: dict[str, tuple[int, int, int, str, str]] = {
    "priority_aging_ms": (
        0, 0, MAX_DELAY_MS, f"the default, {DEFAULT_PRIORITY_AGING_MS} ms", _AGING,
    ),
    "dead_max_age_ms": (0, 1, MAX_TIME_MS, "no age limit", _RETENTION),
    "dead_max_count": (0, 0, MAX_SAFE_INT, "no count limit", _RETENTION),
}  # fmt: skip


def config_field_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """Each CONFIG_FIELDS field of the config hash that is no whole number in its range (by
    hand): the scripts read it as unset and use what the finding names; then a paused_ms
    no pause writes (doctor_pause.py), which stops claims for good."""
    *raws, paused = client.hmget(keys.config, [*CONFIG_FIELDS, PAUSED_FIELD])
    out = paused_field_issues(keys, paused)
    for (field, (lua_lo, lo, hi, instead, how)), raw in zip(
        CONFIG_FIELDS.items(), raws, strict=True
    ):
        if raw is None or stored_int(raw, lo, hi) is not None:
            continue
        cfg, text = shlex.quote(keys.config), str(raw)[:40]
        if stored_int(raw, lua_lo, hi) is not None:  # dead_max_age_ms 0: read as it is
            used = "0 ms: every dead letter is deleted at the next claim or park"
        else:
            used = instead
        msg = (f"{keys.config} field {field} {text!r} is no whole number in {lo}..{hi} "
               f"(edited by hand?): the scripts use {used}")  # fmt: skip
        fix = how.format(cfg=cfg, q=shlex.quote(keys.queue))
        out.append(Issue("config-unreadable", "warning", msg, fix, keys.queue))
    return out


def logical_config_issues(client: redis.Redis, keys: QueueKeys) -> list[Issue]:
    """For a partitioned queue's first partition: each CONFIG_FIELDS field of its logical name's
    config (a hand HSET, as the docs once said of priority_aging_ms). Each partition's scripts
    read their own config, never that one, so a value set there applies nowhere; the commands
    named set each partition's. Found once per queue, with its partitions' checks (the logical
    name itself is not checked as a queue)."""
    m = PARTITION_NAME.match(keys.queue)
    if not m:
        return []
    try:
        layout = stored_layout(client, m.group(1))
    except BadArgument:
        return []  # a record this version cannot read: its own finding (unreadable-layout)
    if layout is None or layout.names[0] != keys.queue:
        return []
    cfg = QueueKeys(layout.queue).config
    try:
        raws = client.hmget(cfg, list(CONFIG_FIELDS))
    except ResponseError:
        return []  # of another type: it holds no field (the logical name's keys are not used)
    q, first, last = (shlex.quote(n) for n in (layout.queue, layout.names[0], layout.names[-1]))
    # The CLI refuses a partitioned queue's name for retention (a --max-count per partition).
    aging = (f"scheduler queue priority-aging -q {q} <ms> (or --default; it sets every "
             "partition, alone it shows theirs)")  # fmt: skip
    retention = (f"{_RETENTION.format(q=first)}, on each partition in turn ({first} ... {last};"
                 " or the library's PartitionedQueue.set_dead_retention, every one)")  # fmt: skip
    out: list[Issue] = []
    for field, raw in zip(CONFIG_FIELDS, raws, strict=True):
        if raw is None:
            continue
        msg = (f"{cfg} field {field} {str(raw)[:40]!r} is read by no script: queue "
               f"{layout.queue[:80]!r} is partitioned, and each of its {len(layout.names)} "
               "partitions reads its own config (set on the logical name by hand?)")  # fmt: skip
        how = aging if field == "priority_aging_ms" else retention
        fix = f"{how}, then redis-cli HDEL {shlex.quote(cfg)} {field}"
        out.append(Issue(UNREAD, "warning", msg, fix, layout.queue))
    return out


# What a schedule's runs get for a flow field read as unset (lua/lib/flow.lua's stored reader):
# a lost limit is an error, a lost priority or a limit read as 1 a warning.
FLOW_EFFECT = {
    "priority": ("warning", "its runs get priority 0"),
    "ckey": ("error", "its runs get no concurrency limit"),
    "climit": ("warning", "its runs get its key at limit 1, the strictest"),
    "rkey": ("error", "its runs get no rate limit"),
    "rcount": ("error", "its runs get no rate limit"),
    "rwindow": ("error", "its runs get no rate limit"),
}


def schedule_flow_issues(keys: QueueKeys, name: str, fields: dict[str, str]) -> list[Issue]:
    """A readable schedule whose flow field its runs read as unset (by hand): they still come,
    without that part of their flow. Defining it again with the same options changes nothing
    (same digest): the field is set right, or the schedule removed and added again."""
    field = flow_unreadable_field(fields)
    if not field:
        return []
    severity, effect = FLOW_EFFECT[field]
    msg = (f"schedule {name!r}: its {field} field {fields.get(field, '')[:40]!r} cannot be "
           f"read (edited by hand?): {effect}")  # fmt: skip
    how = (f"redis-cli HSET {shlex.quote(keys.schedule(name))} {field} <as the definition "
           "gives it>, or remove the schedule and add it again")  # fmt: skip
    return [Issue("schedule-flow-unreadable", severity, msg, how, keys.queue)]


def _suspects(
    client: redis.Redis, keys: QueueKeys, kind: str, judge: Callable[[list[object], str], bool]
) -> Iterator[tuple[str, str, str, list[object]]]:
    """(set, its key, member, reads) for each member of the queue's flow:<kind>:<key> sets that
    `judge` finds wrong, found by SCAN on the queue's node (its keys share one slot), paged
    reads first, then each suspect read again inside one MULTI so a change meanwhile (a lease
    that ends, a promote) is not reported."""
    node = connection.node_for_key(client, keys.prefix)
    head = keys.prefix + f"flow:{kind}:"
    for zkey in sorted(str(k) for k in node.scan_iter(match=head + "*", count=_PAGE)):
        key = zkey[len(head) :]
        if str(client.type(zkey)) != "zset":
            continue  # of another type: claim parks its jobs and says so (none: gone since)
        suspects: list[str] = []
        members = (str(m) for m, _ in client.zscan_iter(zkey, count=_PAGE))
        for page in pages(members, _PAGE):  # a page at a time: a key's holds may be many
            reads = _reads(client, keys, zkey, page, False)
            suspects += [m for i, m in enumerate(page) if judge(reads[6 * i : 6 * i + 6], key)]
        for m in suspects:
            reads = _reads(client, keys, zkey, [m], True)
            if judge(reads, key):
                yield zkey, key, m, reads


def stray_slot_issues(client: redis.Redis, keys: QueueKeys, now_ms: int) -> list[Issue]:
    """Members of the queue's flow:ck:<key> sets that are not leased jobs of that key (their
    `ckey` field)."""
    out: list[Issue] = []
    for ck, key, m, reads in _suspects(client, keys, "ck", _stray):
        score, places = reads[0], _places(reads[1:5])
        at = "" if score is None else f" (its score {int(float(str(score)))})"
        msg = (f"{ck} holds {m!r}{at}, no lease of key {key}: it takes one of the key's "
               "slots for ever and the key's jobs wait (added by hand?)")  # fmt: skip
        how = "scheduler doctor --fix: it removes the member, and the key's held jobs run"
        cmd = _key_move(keys, "ckfree", m, places, now_ms, key)
        out.append(Issue(STRAY, "error", msg, how, keys.queue, repair=(cmd,)))
    return out


def key_set_issues(client: redis.Redis, keys: QueueKeys, now_ms: int) -> list[Issue]:
    """stray_slot_issues, then stale_held_issues."""
    return stray_slot_issues(client, keys, now_ms) + stale_held_issues(client, keys, now_ms)


def stale_held_issues(client: redis.Redis, keys: QueueKeys, now_ms: int) -> list[Issue]:
    """Entries of the queue's flow:ckheld:<key> sets whose job is not in flow:held (by hand;
    a promote drops both in one script)."""
    out: list[Issue] = []
    for hk, key, m, reads in _suspects(client, keys, "ckheld", _unheld):
        msg = (f"{hk} holds {m!r}, which is not held (no {keys.flow_held} entry; added by "
               f"hand?): read as a held job of limit 1, it can keep key {key}'s held jobs "
               "from going back to due while the key has room")  # fmt: skip
        how = "scheduler doctor --fix: it removes the entry, and the key's held jobs run"
        cmd = _key_move(keys, "ckstale", m, _places(reads[1:5]), now_ms, key)
        out.append(Issue(STALE, "error", msg, how, keys.queue, repair=(cmd,)))
    return out


def _unheld(reads: list[object], _key: str) -> bool:
    """Still a member of the hold set, and not held (flow:held of another type: not judged)."""
    score, _due, held = reads[:3]
    if score is None or any(isinstance(r, Exception) for r in reads[:5]):
        return False
    return held is None


def _reads(
    client: redis.Redis, keys: QueueKeys, ck: str, ids: Sequence[str], transaction: bool
) -> list[object]:
    pipe = client.pipeline(transaction=transaction)
    for jid in ids:
        pipe.zscore(ck, jid)
        pipe.zscore(keys.due, jid)
        pipe.zscore(keys.flow_held, jid)
        pipe.zscore(keys.leased, jid)
        pipe.zscore(keys.dead, jid)
        pipe.hget(keys.job(jid), "ckey")
    return list(pipe.execute(raise_on_error=False))


def _stray(reads: list[object], key: str) -> bool:
    """Still a member, and no lease of the key (a key of another type: not judged)."""
    score, _due, _held, leased, _dead, ckey = reads
    if score is None or any(isinstance(r, Exception) for r in reads):
        return False
    return leased is None or ckey != key


def _places(reads: list[object]) -> str:
    """The places repair.lua checks the id is still in (due: in due or held)."""
    due, held, leased, dead = reads
    found = [("due", due is not None or held is not None), ("leased", leased is not None)]
    found.append(("dead", dead is not None))
    return ",".join(p for p, here in found if here)


def _key_move(
    keys: QueueKeys, move: str, jid: str, places: str, now_ms: int, key: str
) -> tuple[str, ...]:
    sk = keys.script_keys()
    return ("EVALSHA", repair_sha(), str(len(sk)), *sk, move, jid, places, "", str(now_ms), key)


class KeySetFixes(list[Issue]):
    """The findings fix_stray_slots repaired, with why Redis refused each it could not run (by
    `_slot`) and whether it ran any (a repair that answered 0 changed nothing, but the entry
    may be gone since the check: a claim drops a lapsed member itself)."""

    def __init__(self, fixed: list[Issue], refused: dict[tuple[str, ...], str], tried: bool):
        super().__init__(fixed)
        self.refused, self.tried = refused, tried

    def mark(self, issue: Issue) -> Issue:
        """A key-set finding whose repair Redis refused says so (the operator's to look at)."""
        why = self.refused.get(_slot(issue)) if issue.code in (STRAY, STALE) else None
        return issue if why is None else refused_note(issue, why)


def refused_note(issue: Issue, why: str) -> Issue:
    """The finding, saying Redis refused its repair (why) and that the fix is by hand."""
    msg = f"{issue.message} (--fix was refused: {why})"
    return replace(issue, message=msg, fix="repair it by hand")


def _slot(issue: Issue) -> tuple[str, ...]:
    """A key-set repair's move, member and key (what a check made again names the same)."""
    cmd = issue.repair[0] if issue.repair else ()
    return (*cmd[-6:-4], *cmd[-1:])


def fix_stray_slots(client: redis.Redis, issues: list[Issue]) -> KeySetFixes:
    """Run each stray-slot and stale-hold finding's repair (lua/repair.lua 'ckfree' and
    'ckstale', which check the entry again). One Redis refuses (a key name or an id the
    script does not take, written by hand) is kept with its reason, not raised, as a job's
    repair is: the rest, and the job repairs after them, still run."""
    fixed: list[Issue] = []
    refused: dict[tuple[str, ...], str] = {}
    tried = False
    for issue in issues:
        if issue.code not in (STRAY, STALE) or not issue.repair or issue.queue is None:
            continue
        node = connection.node_for_key(client, QueueKeys(issue.queue).prefix)
        tried = True
        try:
            try:
                done = node.execute_command(*issue.repair[0])  # type: ignore[no-untyped-call]
            except NoScriptError:
                node.script_load(scripts.source("repair"))
                done = node.execute_command(*issue.repair[0])  # type: ignore[no-untyped-call]
        except ResponseError as exc:  # redis-py's prefix off, as doctor._attempt
            refused[_slot(issue)] = str(exc).rpartition("caused error: ")[2]
            continue
        if done == 1:
            fixed.append(issue)
    return KeySetFixes(fixed, refused, tried)
