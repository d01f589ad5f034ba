"""`scheduler doctor`: check a queue's stored state against the invariants, and repair what is
safe to repair without losing a job.

Invariants (membership in due / leased / dead is the truth; the hash's `state` is a copy):
- every job hash is in exactly one of due, leased, dead, or is a done / cancelled record with
  an expiry; every id in due, leased or dead has a hash (dead is a ZSET: an id is there once);
- the state field matches membership, and a job in a set has no expiry;
- no lease lapsed long ago (any claim reaps lapsed leases, so an old one means nobody claims);
- runnable jobs have a JSON payload and the fields a claim needs;
- every field name and value is UTF-8 (read with errors='surrogateescape', so damage shows up as
  lone surrogates and is reported, with the job id and the fields, instead of crashing the check).

Checking reads in pages (SCAN / ZSCAN, pipelined), then re-reads each suspect inside one MULTI,
so a job moving under a live worker is not reported. A repair re-reads its job under WATCH and
re-plans from those reads, so it never acts on a stale view. A dead LIST left by an older version
is first converted to the dead ZSET by lua/dead_migrate.lua (what any script touching it does)."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis
from redis.exceptions import ResponseError, WatchError

from scheduler.admin import health
from scheduler.admin.inspection import iter_chunks, live_workers, server_now_ms
from scheduler.core import scripts
from scheduler.core.codec import RESULT_TTL_MS, stored_int, stored_int_in
from scheduler.core.keys import QueueKeys

DEFAULT_STALE_LEASE_MS = 5 * 60_000
_PAGE = 500
_CONFIRM_BATCH = 100
_WATCH_TRIES = 5
_PLACES = ("due", "leased", "dead")  # preference order when the state field names none of them
Command = tuple[str, ...]


@dataclass(frozen=True)
class Issue:
    """One finding. `repair` holds the commands `--fix` runs in one MULTI (empty when no repair
    is safe); `fix` says what an operator types."""

    code: str
    severity: str  # 'error' | 'warning'
    message: str
    fix: str
    queue: str | None = None
    job_id: str | None = None
    repair: tuple[Command, ...] = ()

    def redis_cli(self) -> list[str]:
        return [_by_hand(cmd) for cmd in self.repair]

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "queue": self.queue,
            "job_id": self.job_id,
            "message": self.message,
            "fix": self.fix,
            "fixable": bool(self.repair),
            "redis_cli": self.redis_cli(),
        }


@dataclass(frozen=True)
class Snapshot:
    """What is stored about one job id, ideally read atomically."""

    id: str
    key_type: str  # 'hash', 'none', or a wrong type
    fields: dict[str, str]
    ttl_ms: int | None
    due_ms: int | None
    lease_until_ms: int | None
    dead_count: int  # 1 when in the dead ZSET, else 0

    @property
    def places(self) -> list[str]:
        present = (self.due_ms is not None, self.lease_until_ms is not None, self.dead_count > 0)
        return [p for p, here in zip(_PLACES, present, strict=True) if here]


@dataclass(frozen=True)
class Context:
    keys: QueueKeys
    now_ms: int
    live_workers: frozenset[str]
    stale_lease_ms: int = DEFAULT_STALE_LEASE_MS
    record_ttl_ms: int = RESULT_TTL_MS


def _by_hand(cmd: Command) -> str:
    if cmd[0] == "EVAL":  # a lib move (lua/repair.lua): the expanded script is not for a terminal
        nkeys = int(cmd[2])
        args = " ".join(shlex.quote(a) for a in cmd[3 + nkeys :])
        return f"scheduler doctor --fix   # runs lua/repair.lua on {shlex.quote(cmd[3])}: {args}"
    return "redis-cli " + " ".join(shlex.quote(a) for a in cmd)


# -- repair plans (what the transitions write; a job move runs lua/repair.lua) -------------
def _remove_from(k: QueueKeys, job_id: str, places: Iterable[str]) -> list[Command]:
    cmds: list[Command] = []
    for p in places:
        cmds.append(("ZREM", getattr(k, p), job_id))
    return cmds


def _to_due(k: QueueKeys, job_id: str, run_at_ms: int) -> list[Command]:
    jk = k.job(job_id)
    return [
        ("ZADD", k.due, str(run_at_ms), job_id),
        ("HSET", jk, "state", "due"),
        ("HDEL", jk, "worker"),
        ("PERSIST", jk),
        ("LPUSH", k.wake, "1"),
        ("LTRIM", k.wake, "0", "7"),  # as lib/util.lua wake()
    ]


def _dead_letter(k: QueueKeys, job_id: str, reason: str, now_ms: int) -> list[Command]:
    # lua/repair.lua runs lib/job.lua's dead_letter: the move claim and fail make, not a copy.
    keys = k.script_keys()
    return [
        (
            "EVAL",
            scripts.source("repair"),
            str(len(keys)),
            *keys,
            "dead",
            job_id,
            reason,
            str(now_ms),
        )
    ]


def _int(v: str | None) -> int | None:
    # The one strict reader of stored numbers, as claim.lua reads them (helper B, issue 10.9).
    return stored_int(v)


# A ZSET score is a double: a hand-written `inf` (or 1e300) is no time in ms. It is kept as an
# out-of-range int (so the id keeps its place) and reported.
MAX_SCORE_MS = 2**53
_OUT_OF_RANGE_MS = 2**63


def _score_ms(score: Any) -> int:
    value = float(score)
    if math.isfinite(value):
        return int(value)
    return _OUT_OF_RANGE_MS if value > 0 else -_OUT_OF_RANGE_MS


def _unreadable(fields: dict[str, str]) -> tuple[str, str] | None:
    """(code, dead reason) when a claim or a worker could not use this job (as claim.lua checks)."""
    if not fields.get("task"):
        return "invalid-job", "invalid job: task"
    payload = fields.get("payload")
    if payload is None:
        return "bad-payload", "invalid job: payload"
    try:
        json.loads(payload)
    except ValueError:
        return "bad-payload", "invalid payload: not JSON"
    if stored_int_in(fields.get("attempts"), "attempts") is None:
        return "invalid-job", "invalid job: attempts"
    if stored_int_in(fields.get("max_attempts"), "max_attempts") is None:
        return "invalid-job", "invalid job: max_attempts"
    if stored_int_in(fields.get("run_at_ms"), "run_at_ms") is None:
        return "invalid-job", "invalid job: run_at_ms"
    return None


def _has_undecodable(text: str) -> bool:
    return not text.isascii() and any("\udc80" <= ch <= "\udcff" for ch in text)


def undecodable_fields(fields: dict[str, str]) -> list[str]:
    """Names of the fields whose name or value held bytes that are not UTF-8."""
    return sorted(k for k, v in fields.items() if _has_undecodable(k) or _has_undecodable(v))


def diagnose(s: Snapshot, ctx: Context) -> list[Issue]:
    """Every invariant one job breaks, most basic first; each issue's repair assumes the ones
    before it are fixed, so --fix applies only the first repair per pass and re-reads.
    Undecodable bytes are reported beside those (they need a human, not a repair)."""
    out = _diagnose_places(s, ctx)
    bad = undecodable_fields(s.fields)
    if bad or _has_undecodable(s.id):
        k = ctx.keys
        where = f"fields {', '.join(bad)}" if bad else "its id"
        out.append(
            Issue(
                "undecodable",
                "error" if {"task", "payload", "state"} & set(bad) else "warning",
                f"job data is not UTF-8 in {where}: shown escaped (\\xNN) by the CLI; a worker "
                "cannot decode it",
                f"inspect it (redis-cli HGETALL {shlex.quote(k.job(s.id))}), then rewrite the "
                "field or delete the job by hand",
                k.queue,
                s.id,
            )
        )
    return out


def _diagnose_places(s: Snapshot, ctx: Context) -> list[Issue]:
    k, jid = ctx.keys, s.id
    jk = k.job(jid)
    fix = f"scheduler doctor --fix --queue {k.queue}"

    def issue(
        code: str,
        severity: str,
        message: str,
        repair: Sequence[Command] = (),
        how: str | None = None,
    ) -> Issue:
        return Issue(code, severity, message, how or fix, k.queue, jid, tuple(repair))

    places = s.places
    if s.key_type not in ("hash", "none"):
        return [
            issue(
                "wrong-type",
                "error",
                f"{jk} is a {s.key_type}, not a job hash: it is not a job the scheduler can run",
                how=f"inspect it: redis-cli TYPE {shlex.quote(jk)}",
            )
        ]
    if not s.fields:
        if not places:
            return []
        return [
            issue(
                "missing-hash",
                "error",
                f"id is in {' and '.join(places)} but its hash is gone (task and payload "
                "lost): fix removes the id",
                _remove_from(k, jid, places),
            )
        ]
    state = s.fields.get("state", "")
    if not places:
        if state in ("done", "cancelled"):
            if s.ttl_ms is None:
                return [
                    issue(
                        "record-no-ttl",
                        "warning",
                        f"{state} record has no expiry, so it is kept forever",
                        [("PEXPIRE", jk, str(ctx.record_ttl_ms))],
                    )
                ]
            return []
        if state == "dead":
            # Back through lib/job.lua's dead_letter, at the time it died (its age is kept).
            reason = s.fields.get("dead_reason") or "dead (found by doctor)"
            died_ms = stored_int_in(s.fields.get("dead_ms"), "run_at_ms")
            return [
                issue(
                    "orphan-hash",
                    "error",
                    "dead job is missing from the dead list: fix puts it back there",
                    _dead_letter(k, jid, reason[:200], ctx.now_ms if died_ms is None else died_ms),
                )
            ]
        run_at = _int(s.fields.get("run_at_ms"))
        return [
            issue(
                "orphan-hash",
                "error",
                f"job with state {state!r} is in none of due, leased, dead, so no worker "
                "will see it: fix puts it in due",
                _to_due(k, jid, run_at if run_at is not None else ctx.now_ms),
            )
        ]
    plan: list[Command]
    if len(places) > 1:
        keep = state if state in places else places[0]
        plan = _remove_from(k, jid, [p for p in places if p != keep])
        if state != keep:
            plan.append(("HSET", jk, "state", keep))
        return [
            issue(
                "two-places",
                "error",
                f"job is in {' and '.join(places)} at once (state {state!r}): fix keeps "
                f"it in {keep}",
                plan,
            )
        ]
    place = places[0]
    if state != place:
        plan = [("HSET", jk, "state", place)]
        if place != "leased":
            plan.append(("HDEL", jk, "worker"))
        return [
            issue(
                "state-mismatch",
                "error",
                f"state field says {state!r} but the job is in {place}: fix sets it to {place!r}",
                plan,
            )
        ]
    score = s.due_ms if place == "due" else s.lease_until_ms if place == "leased" else None
    if score is not None and not 0 <= score <= MAX_SCORE_MS:
        key = k.due if place == "due" else k.leased
        then = "runs it" if place == "due" else "reaps the lease"
        return [
            issue(
                "bad-score",
                "error",
                f"its score in {place} is {score if abs(score) < _OUT_OF_RANGE_MS else 'inf'}"
                f", not a time in ms: fix sets it to now, so the next claim {then}",
                [("ZADD", key, "XX", str(ctx.now_ms), jid)],
            )
        ]
    if s.ttl_ms is not None:
        return [
            issue(
                "expiring-job",
                "error",
                f"job in {place} has an expiry ({s.ttl_ms} ms left): it would vanish",
                [("PERSIST", jk)],
            )
        ]
    out: list[Issue] = []
    if place == "leased" and s.lease_until_ms is not None:
        late_ms = ctx.now_ms - s.lease_until_ms
        if late_ms > ctx.stale_lease_ms:
            worker = s.fields.get("worker", "")
            alive = worker in ctx.live_workers
            attempts = _int(s.fields.get("attempts")) or 0
            max_attempts = _int(s.fields.get("max_attempts")) or 1
            # The reaper in claim.lua does exactly this on the next claim.
            if attempts >= max_attempts:
                plan = _dead_letter(k, jid, "lease expired", ctx.now_ms)
            else:
                plan = [("ZREM", k.leased, jid), *_to_due(k, jid, s.lease_until_ms)]
            who = (
                f"worker {worker!r} is alive but not claiming"
                if alive
                else (f"worker {worker!r} is gone")
            )
            out.append(
                issue(
                    "lease-expired",
                    "warning" if alive else "error",
                    f"lease lapsed {late_ms // 1000} s ago and {who}; no claim has "
                    "reaped it: fix does what a claim would",
                    plan,
                )
            )
            return out
    if place in ("due", "leased"):
        bad = _unreadable(s.fields)
        if bad is not None:
            code, reason = bad
            if place == "due":
                out.append(
                    issue(
                        code,
                        "error",
                        f"{reason}: no worker can run it; fix parks it "
                        "on the dead list for a human",
                        _dead_letter(k, jid, reason, ctx.now_ms),
                    )
                )
            else:
                out.append(
                    issue(
                        code,
                        "error",
                        f"{reason}; the worker holding it will fail it",
                        how=f"wait for the lease to end, then {fix}",
                    )
                )
    return out


# -- reading ---------------------------------------------------------------------------------
def _load_zset(client: redis.Redis, key: str) -> dict[str, int]:
    return {str(m): _score_ms(sc) for m, sc in client.zscan_iter(key, count=_PAGE)}


def convert_dead(client: redis.Redis, keys: QueueKeys) -> None:
    """Finish converting a dead LIST of an older version into the ZSET, in the script's
    bounded steps (lua/dead_migrate.lua); nothing to do on a ZSET."""
    sha = client.script_load(scripts.source("dead_migrate"))
    script_keys = keys.script_keys()
    while int(client.evalsha(sha, len(script_keys), *script_keys)) > 0:
        pass


def _hash_reply(reply: Any) -> dict[str, str]:
    return {} if isinstance(reply, ResponseError) else {str(a): str(b) for a, b in reply.items()}


def _ttl(pttl: Any) -> int | None:
    return int(pttl) if int(pttl) >= 0 else None


def read_snapshots(
    client: redis.Redis, keys: QueueKeys, ids: Sequence[str]
) -> tuple[int, list[Snapshot]]:
    """(server now_ms, one consistent snapshot per id): each batch is read inside one MULTI."""
    now_ms = server_now_ms(client)
    out: list[Snapshot] = []
    for chunk in iter_chunks(ids, _CONFIRM_BATCH):
        pipe = client.pipeline(transaction=True)
        pipe.time()
        for jid in chunk:
            jk = keys.job(jid)
            pipe.type(jk)
            pipe.hgetall(jk)
            pipe.pttl(jk)
            pipe.zscore(keys.due, jid)
            pipe.zscore(keys.leased, jid)
            pipe.zscore(keys.dead, jid)
        reply = pipe.execute(raise_on_error=False)
        sec, usec = reply[0]
        now_ms = int(sec) * 1000 + int(usec) // 1000
        for n, jid in enumerate(chunk):
            t, h, pttl, due, leased, dead = reply[1 + 6 * n : 7 + 6 * n]
            out.append(
                Snapshot(
                    jid,
                    str(t),
                    _hash_reply(h),
                    _ttl(pttl),
                    None if due is None else _score_ms(due),
                    None if leased is None else _score_ms(leased),
                    0 if dead is None or isinstance(dead, ResponseError) else 1,
                )
            )
    return now_ms, out


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
    reply = pipe.execute(raise_on_error=False)
    out: list[str] = []
    for n, key in enumerate(page):
        jid = key[len(job_prefix) :]
        seen.add(jid)
        t, h, pttl = reply[3 * n : 3 * n + 3]
        s = Snapshot(
            jid,
            str(t),
            _hash_reply(h),
            _ttl(pttl),
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
    with client.pipeline(transaction=True) as pipe:
        for _ in range(_WATCH_TRIES):
            try:
                pipe.watch(jk, k.due, k.leased, k.dead)  # type: ignore[no-untyped-call]
                sec, usec = pipe.time()
                t = str(pipe.type(jk))
                fields = _hash_reply(pipe.hgetall(jk)) if t == "hash" else {}
                dead = pipe.zscore(k.dead, job_id)
                due_ms, lease_ms = pipe.zscore(k.due, job_id), pipe.zscore(k.leased, job_id)
                snap = Snapshot(
                    job_id,
                    t,
                    fields,
                    _ttl(pipe.pttl(jk)),
                    None if due_ms is None else _score_ms(due_ms),
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
    """The server settings that break the product's promises (see scheduler.admin.health)."""
    info, config = health.read_server(client)
    return [Issue(f.code, f.severity, f.message, f.fix) for f in health.check_server(info, config)]
