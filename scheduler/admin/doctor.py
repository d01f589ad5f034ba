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

Checking reads a page at a time (doctor_scan: SCAN / ZSCAN pages checked against the places
and the records, pipelined, only the suspects kept; a never-claimed job by a GET of its record,
doctor_pending), then re-reads each suspect inside one MULTI, so a job moving under a live
worker is not reported. A repair re-reads its job under WATCH (`snapshot_reads`) and re-plans
from those reads; it counts as done only when lua/repair.lua answers 1, and one Redis refuses
is reported, not raised. A job set aside by flow control (flow:held) is read as due; a key of
the wrong type reads as empty and is a finding. An old dead LIST is first converted. A queue a
newer version stores is that one finding (`newer-storage`): the rest would be misread."""

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError, WatchError

from scheduler.admin import health
from scheduler.admin.doctor_checks import diagnose
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
    repaired,
    snapshot_from,
    snapshot_reads,
)
from scheduler.admin.doctor_pending import unclaimed_suspects
from scheduler.admin.doctor_scan import (
    PLACES,
    job_suspects,
    pages,
    place_types,
    spec_page,
    unrecorded,
)
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
def _load_zset(client: redis.Redis, key: str) -> Iterator[list[str]]:
    """The members of the ZSET `key`, a ZSCAN page at a time: a place is never held whole."""
    return pages((str(m) for m, _ in client.zscan_iter(key, count=_PAGE)), _PAGE)


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
    """Every finding for one queue. Read-only, but for converting an old dead LIST first. Read a
    page at a time (doctor_scan), the suspects alone kept, then each re-read atomically."""
    keys = QueueKeys(queue)
    if newer := [i for i in config_issues(client, keys) if i.code == "newer-storage"]:
        return newer
    _, damaged = place_types(client, keys, ["dead_migrating"])
    if not damaged:  # one of another type (by hand): its conversion step would raise on it
        convert_dead(client, keys)
    # A place of another type (written by hand) reads as empty and is a finding.
    readable, found = place_types(client, keys, PLACES)
    damaged += found + queue_key_issues(client, keys)
    ctx = Context(keys, server_now_ms(client, keys), live_ids(client, keys), stale_lease_ms)
    # The queue's node only (its keys share one slot): a cluster client's SCAN asks every one.
    node = connection.node_for_key(client, keys.prefix)
    suspects: list[str] = []
    for page in pages(node.scan_iter(match=keys.prefix + "job:*", count=_PAGE), _PAGE):
        suspects += job_suspects(client, ctx, readable, [str(k) for k in page])
    # Spec records: in no place with no hash (orphan spec) a suspect; in due, read cheaply first.
    pending: list[str] = []
    for page in pages(node.scan_iter(match=keys.prefix + "spec:*", count=_PAGE), _PAGE):
        orphans, due = spec_page(node, keys, readable, [str(k) for k in page])
        suspects += orphans
        pending += unclaimed_suspects(node, keys, list(due), due)
    unlisted: set[str] = set()  # ids in a place that no pass above read
    for place in readable:
        for ids in _load_zset(client, getattr(keys, place)):
            unlisted.update(unrecorded(client, keys, place, ids))
    moving, found = moving_findings(client, keys)  # an interrupted move's jobs: no orphans
    # Once each (a SCAN may return a key twice, a pass read a job another read), in pass order.
    ordered = dict.fromkeys([*suspects, *pending, *sorted(unlisted)])
    suspects, damaged = [j for j in ordered if j not in moving], damaged + found
    if not suspects:
        return damaged
    now_ms, snaps = read_snapshots(client, keys, suspects)
    ctx = replace(ctx, now_ms=now_ms)
    return damaged + [i for s in snaps for i in diagnose(s, ctx)]


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
