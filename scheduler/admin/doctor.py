"""`scheduler doctor`: check a queue's stored state against the invariants, and repair what is
safe to repair without losing a job.

Invariants (membership in due / leased / dead is the truth; the hash's `state` is a copy):
- every job hash is in exactly one of due, leased, dead, or is a done / cancelled record with
  an expiry; every id in due, leased or dead has a hash or (never claimed) its spec record
  `spec:<id>`, which is then in due with no expiry (`orphan-spec`; dead is a ZSET);
- the state field matches membership, and a job in a set has no expiry;
- no lease lapsed long ago (any claim reaps lapsed leases, so an old one means nobody claims);
- runnable jobs have a JSON payload and the fields a claim needs;
- every field name and value is UTF-8 (read with errors='surrogateescape', so damage shows up as
  lone surrogates and is reported, with the job id and the fields, instead of crashing the check).

Checking reads in pages (SCAN / ZSCAN, pipelined), then re-reads each suspect inside one MULTI,
so a job moving under a live worker is not reported. A repair re-reads its job under WATCH and
re-plans from those reads, so it never acts on a stale view. A dead LIST left by an older version
is first converted to the dead ZSET by lua/dead_migrate.lua (what any script touching it does)."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError, WatchError

from scheduler.admin import health
from scheduler.admin.doctor_checks import diagnose
from scheduler.admin.doctor_model import (
    _CONFIRM_BATCH,
    _PAGE,
    _WATCH_TRIES,
    DEFAULT_STALE_LEASE_MS,
    MAX_SCORE_MS,
    Context,
    Issue,
    Snapshot,
    _score_ms,
    undecodable_fields,
)
from scheduler.admin.inspection import iter_chunks, live_workers, server_now_ms
from scheduler.client.queue import Queue
from scheduler.core import connection, scripts
from scheduler.core.keys import QueueKeys
from scheduler.core.spec_record import with_spec
from scheduler.operations.dead_letters import dead_converted

# The doctor's public names, wherever they live (doctor_model / doctor_checks hold the parts).
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


def convert_dead(client: redis.Redis, keys: QueueKeys) -> None:
    """Finish converting a dead LIST of an older version into the ZSET, in the script's
    bounded steps (lua/dead_migrate.lua); nothing to do on a ZSET. Through Queue's driver: by
    EVALSHA, the script loaded only when the server lacks it (not on every check)."""
    Queue(client, keys.queue)._run(dead_converted())


def _hash_reply(reply: Any) -> dict[str, str]:
    return {} if isinstance(reply, ResponseError) else {str(a): str(b) for a, b in reply.items()}


def _ttl(pttl: Any, spec_pttl: Any = -2) -> int | None:
    """The job's expiry: its hash's, or its spec record's (a pending job is the spec alone)."""
    left = [int(t) for t in (pttl, spec_pttl) if not isinstance(t, ResponseError) and int(t) >= 0]
    return min(left) if left else None


def read_snapshots(
    client: redis.Redis, keys: QueueKeys, ids: Sequence[str]
) -> tuple[int, list[Snapshot]]:
    """(server now_ms, one consistent snapshot per id): each batch is read inside one MULTI."""
    now_ms = server_now_ms(client)
    out: list[Snapshot] = []
    for chunk in iter_chunks(ids, _CONFIRM_BATCH):
        pipe = connection.node_for_key(client, keys.prefix).pipeline(transaction=True)
        pipe.time()
        for jid in chunk:
            jk = keys.job(jid)
            pipe.type(jk)
            pipe.hgetall(jk)
            pipe.pttl(jk)
            pipe.zscore(keys.due, jid)
            pipe.zscore(keys.leased, jid)
            pipe.zscore(keys.dead, jid)
            pipe.get(keys.spec(jid))
            pipe.pttl(keys.spec(jid))
            pipe.zscore(keys.flow_held, jid)
        reply = pipe.execute(raise_on_error=False)
        sec, usec = reply[0]
        now_ms = int(sec) * 1000 + int(usec) // 1000
        for n, jid in enumerate(chunk):
            t, h, pttl, due, leased, dead, spec, spec_pttl, held = reply[1 + 9 * n : 10 + 9 * n]
            # A job set aside by flow control (lua/lib/flow.lua) is due, in flow:held instead.
            due = due if due is not None else held
            due_ms = None if due is None else _score_ms(due)
            t, fields = _with_spec(str(t), _hash_reply(h), spec, due_ms)
            out.append(
                Snapshot(
                    jid,
                    t,
                    fields,
                    _ttl(pttl, spec_pttl),
                    due_ms,
                    None if leased is None else _score_ms(leased),
                    0 if dead is None or isinstance(dead, ResponseError) else 1,
                )
            )
    return now_ms, out


def _with_spec(
    t: str, fields: dict[str, str], spec: Any, due_ms: int | None
) -> tuple[str, dict[str, str]]:
    """A job of this version is its spec record (STRING spec:<id>) until its first claim, then
    the spec plus the hash (lua/lib/job.lua): read as the one hash claim sees."""
    if not isinstance(spec, str) or t not in ("hash", "none"):
        return t, fields
    return "hash", with_spec(fields, spec, due_ms)


def _live(client: redis.Redis, keys: QueueKeys) -> frozenset[str]:
    return frozenset(w.id for w in live_workers(client, keys)[0])


def check_queue(
    client: redis.Redis, queue: str, *, stale_lease_ms: int = DEFAULT_STALE_LEASE_MS
) -> list[Issue]:
    """Every finding for one queue. Read-only, but for converting an old dead LIST first."""
    keys = QueueKeys(queue)
    convert_dead(client, keys)
    due = _load_zset(client, keys.due)
    leased = _load_zset(client, keys.leased)
    dead = _load_zset(client, keys.dead)
    ctx = Context(keys, server_now_ms(client), _live(client, keys), stale_lease_ms)
    suspects: list[str] = []
    seen: set[str] = set()
    job_prefix = keys.prefix + "job:"
    scan = client.scan_iter(match=job_prefix + "*", count=_PAGE)
    page: list[str] = []
    for key in scan:
        page.append(str(key))
        if len(page) >= _PAGE:
            suspects += _first_pass(client, page, job_prefix, ctx, due, leased, dead, seen)
            page = []
    suspects += _first_pass(client, page, job_prefix, ctx, due, leased, dead, seen)
    suspects += sorted((set(due) | set(leased) | set(dead)) - seen)
    # A spec record in no place and with no hash (an orphan spec) has no job: key to scan.
    spec_prefix = keys.prefix + "spec:"
    for key in client.scan_iter(match=spec_prefix + "*", count=_PAGE):
        jid = str(key)[len(spec_prefix) :]
        if jid not in seen and jid not in due and jid not in leased and jid not in dead:
            suspects.append(jid)
    if not suspects:
        return []
    now_ms, snaps = read_snapshots(client, keys, suspects)
    ctx = replace(ctx, now_ms=now_ms)
    return [i for s in snaps for i in diagnose(s, ctx)]


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
        )
        if diagnose(s, ctx):
            out.append(jid)
    return out


# -- repairing -------------------------------------------------------------------------------
def repair_job(client: redis.Redis, ctx: Context, job_id: str) -> Issue | None:
    """Apply the first safe repair this job needs, re-read under WATCH; returns what was fixed
    (None when nothing needed fixing, or the job kept changing under live workers)."""
    k = ctx.keys
    jk = k.job(job_id)
    with connection.node_for_key(client, k.prefix).pipeline(transaction=True) as pipe:
        for _ in range(_WATCH_TRIES):
            try:
                pipe.watch(jk, k.spec(job_id), k.due, k.leased, k.dead)  # type: ignore[no-untyped-call]
                sec, usec = pipe.time()
                t = str(pipe.type(jk))
                fields = _hash_reply(pipe.hgetall(jk)) if t == "hash" else {}
                dead = pipe.zscore(k.dead, job_id)
                due_ms, lease_ms = pipe.zscore(k.due, job_id), pipe.zscore(k.leased, job_id)
                due_at = None if due_ms is None else _score_ms(due_ms)
                spec = pipe.get(k.spec(job_id)) if t in ("hash", "none") else None
                t, fields = _with_spec(t, fields, spec, due_at)
                snap = Snapshot(
                    job_id,
                    t,
                    fields,
                    _ttl(pipe.pttl(jk), pipe.pttl(k.spec(job_id))),
                    due_at,
                    None if lease_ms is None else _score_ms(lease_ms),
                    0 if dead is None else 1,
                )
                now = replace(ctx, now_ms=int(sec) * 1000 + int(usec) // 1000)
                todo = next((i for i in diagnose(snap, now) if i.repair), None)
                if todo is None:
                    pipe.unwatch()
                    return None
                pipe.multi()
                for cmd in todo.repair:
                    pipe.execute_command(*cmd)  # type: ignore[no-untyped-call]
                pipe.execute()
                return todo
            except WatchError:
                continue
            except NoScriptError:  # the plan (one repair.lua call) did not run: load it once
                connection.node_for_key(client, k.prefix).script_load(scripts.source("repair"))
    return None


@dataclass(frozen=True)
class Report:
    queue: str
    fixed: list[Issue]
    remaining: list[Issue]


def repair_queue(
    client: redis.Redis,
    queue: str,
    *,
    stale_lease_ms: int = DEFAULT_STALE_LEASE_MS,
    passes: int = 4,
) -> Report:
    """Check, repair each fixable job once per pass (a job may need a few steps, e.g. back into
    due, then its state field), until nothing fixable remains; then check again."""
    keys = QueueKeys(queue)
    fixed: list[Issue] = []
    issues = check_queue(client, queue, stale_lease_ms=stale_lease_ms)
    for _ in range(passes):
        todo = sorted({i.job_id for i in issues if i.repair and i.job_id is not None})
        if not todo:
            break
        ctx = Context(keys, server_now_ms(client), _live(client, keys), stale_lease_ms)
        for jid in todo:
            done = repair_job(client, ctx, jid)
            if done is not None:
                fixed.append(done)
        issues = check_queue(client, queue, stale_lease_ms=stale_lease_ms)
    return Report(queue, fixed, issues)


def check_server_settings(client: redis.Redis) -> list[Issue]:
    """The server settings that break the product's promises (see scheduler.admin.health), on
    every primary of a Redis Cluster."""
    return [Issue(f.code, f.severity, f.message, f.fix) for f in health.check_servers(client)]
