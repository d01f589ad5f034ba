"""`scheduler doctor`: check a queue's stored state against the invariants, repair what is safe.

Invariants (membership in due / leased / dead is the truth; the hash's `state` is a copy):
- every job hash is in exactly one of due, leased, dead, or is a done / cancelled record with
  an expiry; every id in due, leased or dead has a hash or (never claimed) its spec record
  `spec:<id>`, which is then in due with no expiry (`orphan-spec`; dead is a ZSET);
- the state field matches membership, and a job in a set has no expiry;
- no lease lapsed long ago (any claim reaps lapsed leases, so an old one means nobody claims);
- runnable jobs have a JSON payload and the fields a claim needs;
- every field name and value is UTF-8 (read with errors='surrogateescape', so damage shows up as
  lone surrogates and is reported, with the job id and the fields, instead of crashing the check).

Checking reads in pages (SCAN / ZSCAN, pipelined; a never-claimed job by a GET of its record,
doctor_pending), then re-reads each suspect inside one MULTI, so a job moving under a live
worker is not reported. A repair re-reads its job under WATCH (`snapshot_reads`) and re-plans
from those reads; it counts as done only when lua/repair.lua answers 1, and one Redis refuses
is reported, not raised. A job set aside by flow control (flow:held) is read as due; a key of
the wrong type reads as empty and is a finding. An old dead LIST is first converted. A queue a
newer version stores is that one finding (`newer-storage`): the rest would be misread."""

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError, WatchError

from scheduler.admin import health
from scheduler.admin.doctor_checks import diagnose, wrong_type_place
from scheduler.admin.doctor_flow import fix_stray_slots, refused_note
from scheduler.admin.doctor_keys import config_issues, convert_dead, live_ids, queue_key_issues
from scheduler.admin.doctor_model import (
    _CONFIRM_BATCH,
    _PAGE,
    _WATCH_TRIES,
    DEFAULT_STALE_LEASE_MS,
    MAX_SCORE_MS,
    Context,
    Issue,
    Report,
    Snapshot,
    _hash_reply,
    _kept,
    _score_ms,
    _ttl,
    _with_spec,
    repaired,
    snapshot_from,
    snapshot_reads,
)
from scheduler.admin.doctor_pending import unclaimed_suspects
from scheduler.admin.doctor_text import undecodable_fields
from scheduler.admin.inspection import iter_chunks, server_now_ms
from scheduler.admin.queue_move import moving_findings
from scheduler.core import connection, scripts
from scheduler.core.keys import QueueKeys

__all__ = [
    "DEFAULT_STALE_LEASE_MS",
    "MAX_SCORE_MS",
    "Context",
    "Issue",
    "Report",
    "Snapshot",
    "check_queue",
    "check_server_settings",
    "convert_dead",
    "diagnose",
    "read_snapshots",
    "repair_job",
    "repair_queue",
    "undecodable_fields",
]


# -- reading ---------------------------------------------------------------------------------
def _load_zset(client: redis.Redis, key: str) -> dict[str, int]:
    return {str(m): _score_ms(sc) for m, sc in client.zscan_iter(key, count=_PAGE)}


def read_snapshots(
    client: redis.Redis, keys: QueueKeys, ids: Sequence[str]
) -> tuple[int, list[Snapshot]]:
    """(server now_ms, one consistent snapshot per id): each batch is read inside one MULTI."""
    now_ms = server_now_ms(client, keys)
    out: list[Snapshot] = []
    n = len(snapshot_reads(keys, ""))
    for chunk in iter_chunks(ids, _CONFIRM_BATCH):
        pipe = connection.node_for_key(client, keys.prefix).pipeline(transaction=True)
        pipe.time()
        for jid in chunk:
            for cmd in snapshot_reads(keys, jid):
                pipe.execute_command(*cmd)  # type: ignore[no-untyped-call]
        reply = pipe.execute(raise_on_error=False)
        sec, usec = reply[0]
        now_ms = int(sec) * 1000 + int(usec) // 1000
        out += [
            snapshot_from(jid, reply[1 + n * i : 1 + n * (i + 1)]) for i, jid in enumerate(chunk)
        ]
    return now_ms, out


def check_queue(
    client: redis.Redis, queue: str, *, stale_lease_ms: int = DEFAULT_STALE_LEASE_MS
) -> list[Issue]:
    """Every finding for one queue. Read-only, but for converting an old dead LIST first."""
    keys = QueueKeys(queue)
    if newer := [i for i in config_issues(client, keys) if i.code == "newer-storage"]:
        return newer
    _, damaged = _load_place(client, keys, "dead_migrating")
    if not damaged:  # one of another type (by hand): its conversion step would raise on it
        convert_dead(client, keys)
    # A place of another type (written by hand) reads as empty and is a finding.
    held, damaged = _load_place(client, keys, "flow_held", damaged)
    due, damaged = _load_place(client, keys, "due", damaged)
    due = held | due  # a job set aside by flow control is due
    leased, damaged = _load_place(client, keys, "leased", damaged)
    dead, damaged = _load_place(client, keys, "dead", damaged)
    damaged += queue_key_issues(client, keys)
    ctx = Context(keys, server_now_ms(client, keys), live_ids(client, keys), stale_lease_ms)
    # The queue's node only (its keys share one slot): a cluster client's SCAN asks every one.
    node = connection.node_for_key(client, keys.prefix)
    suspects: list[str] = []
    seen: set[str] = set()
    job_prefix = keys.prefix + "job:"
    scan = node.scan_iter(match=job_prefix + "*", count=_PAGE)
    page: list[str] = []
    for key in scan:
        page.append(str(key))
        if len(page) >= _PAGE:
            suspects += _first_pass(client, page, job_prefix, ctx, due, leased, dead, seen)
            page = []
    suspects += _first_pass(client, page, job_prefix, ctx, due, leased, dead, seen)
    # Spec records with no hash: in no place (orphan spec) a suspect; in due, read cheaply first.
    spec_prefix = keys.prefix + "spec:"
    unclaimed: list[str] = []
    for key in node.scan_iter(match=spec_prefix + "*", count=_PAGE):
        jid = str(key)[len(spec_prefix) :]
        if jid in seen or jid in leased or jid in dead:
            continue
        (unclaimed if jid in due else suspects).append(jid)
    seen.update(unclaimed)
    suspects += unclaimed_suspects(node, keys, unclaimed, due)
    suspects += sorted((set(due) | set(leased) | set(dead)) - seen)
    moving, found = moving_findings(client, keys)  # an interrupted move's jobs: no orphans
    suspects, damaged = [j for j in suspects if j not in moving], damaged + found
    if not suspects:
        return damaged
    now_ms, snaps = read_snapshots(client, keys, suspects)
    ctx = replace(ctx, now_ms=now_ms)
    return damaged + [i for s in snaps for i in diagnose(s, ctx)]


def _load_place(
    client: redis.Redis, keys: QueueKeys, place: str, found: Sequence[Issue] = ()
) -> tuple[dict[str, int], list[Issue]]:
    """The ZSET `place` (due, leased, dead, flow_held, dead_migrating) of the queue, and `found`
    plus a finding when it is a key of another type: read as empty, so the check goes on."""
    key = getattr(keys, place)
    t = str(client.type(key))
    if t in ("zset", "none"):
        return _load_zset(client, key), list(found)
    return {}, [*found, wrong_type_place(keys.queue, place, key, t)]


def _first_pass(
    client: redis.Redis,
    page: list[str],
    job_prefix: str,
    ctx: Context,
    due: dict[str, int],
    leased: dict[str, int],
    dead: dict[str, int],
    seen: set[str],
) -> list[str]:
    """Ids on this page of job keys that look wrong from the (non-atomic) bulk reads."""
    if not page:
        return []
    pipe = client.pipeline(transaction=False)
    for key in page:
        pipe.type(key)
        pipe.hgetall(key)
        pipe.pttl(key)
        pipe.get(ctx.keys.spec(key[len(job_prefix) :]))
        pipe.pttl(ctx.keys.spec(key[len(job_prefix) :]))
    reply = pipe.execute(raise_on_error=False)
    out: list[str] = []
    for n, key in enumerate(page):
        jid = key[len(job_prefix) :]
        seen.add(jid)
        t, h, pttl, spec, spec_pttl = reply[5 * n : 5 * n + 5]
        t, fields = _with_spec(str(t), _hash_reply(h), spec, due.get(jid))
        s = Snapshot(
            jid,
            t,
            fields,
            _ttl(pttl, spec_pttl),
            due.get(jid),
            leased.get(jid),
            1 if jid in dead else 0,
            kept=_kept(pttl, spec_pttl),
        )
        if diagnose(s, ctx):
            out.append(jid)
    return out


# -- repairing -------------------------------------------------------------------------------
def _quiet(pipe: Any, cmd: tuple[str, ...]) -> Any:
    """One read under WATCH; an error reply (a key of another type) is returned, not raised."""
    try:
        return pipe.execute_command(*cmd)
    except ResponseError as exc:
        return exc


def repair_job(client: redis.Redis, ctx: Context, job_id: str) -> Issue | None:
    """Apply the first safe repair this job needs, re-read under WATCH; returns what was fixed
    (None when nothing needed fixing, the job kept changing under live workers, or the repair
    did not apply: lua/repair.lua answered 0, or Redis refused it)."""
    return _attempt(client, ctx, job_id)[0]


def _attempt(client: redis.Redis, ctx: Context, job_id: str) -> tuple[Issue | None, str | None]:
    """(what was fixed, why Redis refused the repair): repair_job, with the refusal kept."""
    k = ctx.keys
    with connection.node_for_key(client, k.prefix).pipeline(transaction=True) as pipe:
        for _ in range(_WATCH_TRIES):
            try:
                # Its own keys: repair.lua checks place, lease and score atomically; WATCHing
                # whole sets let any other job's enqueue abort every try on a busy queue.
                pipe.watch(k.job(job_id), k.spec(job_id))  # type: ignore[no-untyped-call]
                sec, usec = pipe.time()
                snap = snapshot_from(
                    job_id, [_quiet(pipe, cmd) for cmd in snapshot_reads(k, job_id)]
                )
                now = replace(ctx, now_ms=int(sec) * 1000 + int(usec) // 1000)
                todo = next((i for i in diagnose(snap, now) if i.repair), None)
                if todo is None:
                    pipe.unwatch()
                    return None, None
                pipe.multi()
                for cmd in todo.repair:
                    pipe.execute_command(*cmd)  # type: ignore[no-untyped-call]
                # Each repair is one repair.lua call: 1 moved, 0 the job was not where planned,
                # or the id of the run it armed (it parked a schedule's pending one).
                return repaired(todo, pipe.execute()[0]), None
            except WatchError:
                continue
            except NoScriptError:  # the plan (one repair.lua call) did not run: load it once
                connection.node_for_key(client, k.prefix).script_load(scripts.source("repair"))
            except ResponseError as exc:  # refused (hand-written data it cannot take): reported
                return None, str(exc).rpartition("caused error: ")[2]  # redis-py's prefix off
    return None, None


def repair_queue(
    client: redis.Redis,
    queue: str,
    *,
    stale_lease_ms: int = DEFAULT_STALE_LEASE_MS,
    passes: int = 4,
) -> Report:
    """Check, repair each fixable job once per pass (a job may need a few steps, e.g. back into
    due, then its state field), until nothing fixable remains; then check again. A repair Redis
    refused (a job's, or a key set entry's) is not tried again: its finding says so."""
    keys = QueueKeys(queue)
    refused: dict[str, str] = {}
    issues = check_queue(client, queue, stale_lease_ms=stale_lease_ms)
    sets = fix_stray_slots(client, issues)  # no job's own repair: a key's slot set
    if sets.tried:  # checked again, also after a 0: a claim may have dropped the member
        issues = check_queue(client, queue, stale_lease_ms=stale_lease_ms)
    fixed = list(sets)
    for _ in range(passes):
        todo = sorted(
            {j for i in issues if i.repair and (j := i.job_id) is not None} - set(refused)
        )
        if not todo:
            break
        ctx = Context(keys, server_now_ms(client, keys), live_ids(client, keys), stale_lease_ms)
        for jid in todo:
            done, why = _attempt(client, ctx, jid)
            fixed += [done] if done is not None else []
            refused |= {jid: why} if why is not None else {}
        issues = check_queue(client, queue, stale_lease_ms=stale_lease_ms)
    return Report(queue, fixed, [_refusal(sets.mark(i), refused) for i in issues])


def _refusal(issue: Issue, refused: dict[str, str]) -> Issue:
    """A finding whose repair Redis refused says so (the job is the operator's to look at)."""
    why = refused.get(issue.job_id or "") if issue.repair else None
    return issue if why is None else refused_note(issue, why)


def check_server_settings(client: redis.Redis) -> list[Issue]:
    """The server settings that break the product's promises (see scheduler.admin.health), on
    every primary of a Redis Cluster (one that does not answer: a node-unreachable finding)."""
    found = health.check_servers(client, down_ok=True)
    return [Issue(f.code, f.severity, f.message, f.fix, node=f.node) for f in found]
