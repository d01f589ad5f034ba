"""The doctor's invariant checks: `diagnose` turns one job's `Snapshot` into findings, each with
the repair plan that is safe for it (pure: no I/O, so each rule is testable alone)."""

import shlex
from collections.abc import Sequence

from scheduler.admin.doctor_model import (
    _OUT_OF_RANGE_MS,
    MAX_SCORE_MS,
    SPEC_WRONG_TYPE,
    Command,
    Context,
    Issue,
    Snapshot,
    _dead_letter,
    _int,
    _remove_from,
    _repair,
    _to_due,
    _to_lease,
    _unreadable,
)
from scheduler.admin.doctor_text import _has_undecodable, cut_bytes, undecodable_fields
from scheduler.core.codec import stored_int_in
from scheduler.core.limits import DEFAULT_LEASE_MS
from scheduler.core.partitions import meta_key


def diagnose(s: Snapshot, ctx: Context) -> list[Issue]:
    """Every invariant one job breaks, most basic first; each issue's repair assumes the ones
    before it are fixed, so --fix applies only the first repair per pass and re-reads.
    Undecodable bytes are reported beside those (they need a human, not a repair)."""
    out = _diagnose_places(s, ctx)
    bad = undecodable_fields(s.fields)
    if bad or _has_undecodable(s.id):
        k = ctx.keys
        where = f"fields {', '.join(bad)}" if bad else "its id"
        # Where the bytes are: its hash, or its spec record (a job never claimed is that record
        # alone, and the payload stays there after a claim).
        look = [f"HGETALL {shlex.quote(k.job(s.id))}"] if set(bad or s.fields) - s.from_spec else []
        look += [f"GET {shlex.quote(k.spec(s.id))}"] if set(bad) & s.from_spec or not look else []
        out.append(
            Issue(
                "undecodable",
                "error" if {"task", "payload", "state"} & set(bad) else "warning",
                f"job data is not UTF-8 in {where}: shown escaped (\\xNN) by the CLI; a worker "
                "cannot decode it",
                f"inspect it (redis-cli {'; redis-cli '.join(look)}), then rewrite the bytes "
                "or delete the job by hand",
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
        rearms: bool = False,
    ) -> Issue:
        return Issue(code, severity, message, how or fix, k.queue, jid, tuple(repair), rearms)

    places = s.places
    # Where an operator looks: a held job is due in flow:held, not in the due ZSET.
    where = " and ".join(f"{p} (flow:held)" if p == "due" and s.held else p for p in places)
    if s.key_type == SPEC_WRONG_TYPE:  # a claim parks the job as unreadable
        sk = shlex.quote(k.spec(jid))
        msg = f"{k.spec(jid)} is not a STRING spec record: the job cannot be read"
        return [issue("wrong-type", "error", msg, how=f"redis-cli TYPE {sk}, then DEL it")]
    if s.key_type not in ("hash", "none"):
        return [
            issue(
                "wrong-type",
                "error",
                f"{jk} is a {s.key_type}, not a job hash: it is not a job the scheduler can run",
                how=f"inspect it: redis-cli TYPE {shlex.quote(jk)}",
            )
        ]
    if not s.fields:  # its record is gone: parked as a claim parks it, never just removed
        lost = f"id is in {where} but its record is gone (task and payload lost)"
        if not places:
            return []
        if places == ["dead"]:  # already parked: `dead list` shows it as 'record gone'
            drop = f"scheduler dead purge -q {k.queue} --id {shlex.quote(jid)}"
            how = f"none needed; to drop it: {drop}"
            return [issue("missing-hash", "warning", f"{lost}: listed as 'record gone'", how=how)]
        if s.held:  # repair.lua never takes a job out of its hold
            how = "nothing to type: the claim that meets it once flow control lets it run parks it"
            return [issue("missing-hash", "error", f"{lost}; set aside by flow control", how=how)]
        gone = "job hash missing"  # claim's reason (lua/claim.lua read_claimable)
        park = _repair(k, s, ctx.now_ms, "dead", gone, str(ctx.now_ms), "gone")
        return [issue("missing-hash", "error", f"{lost}: fix parks it ('{gone}')", park)]
    state = s.fields.get("state", "")
    if not places:
        if state in ("done", "cancelled"):
            if s.ttl_ms is None or s.kept:  # a kept payload's spec, too: both expire
                # The job's own retention where its record still holds it (a lean record
                # dropped it at completion): the default would cut a month's to an hour.
                own_ms = stored_int_in(s.fields.get("result_ttl_ms"), "result_ttl_ms")
                ttl_ms = ctx.record_ttl_ms if own_ms is None else own_ms
                return [
                    issue(
                        "record-no-ttl",
                        "warning",
                        f"{state} record has no expiry, so it is kept forever",
                        _repair(k, s, ctx.now_ms, "expire", str(ttl_ms)),
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
                    _dead_letter(
                        k,
                        s,
                        ctx.now_ms,
                        cut_bytes(reason),
                        ctx.now_ms if died_ms is None else died_ms,
                    ),
                )
            ]
        # Leased again, not due: a live holder (a worker, a manual claimer doctor cannot see)
        # renews it, a dead one lets it lapse; due, a second run would start meanwhile.
        if state == "leased" and s.fields.get("token"):
            msg = "leased job is in none of due, leased, dead: fix restores its lease"
            msg += f" ({DEFAULT_LEASE_MS // 1000} s)"
            return [issue("orphan-hash", "error", msg, _to_lease(k, s, ctx.now_ms))]
        run_at = stored_int_in(s.fields.get("run_at_ms"), "run_at_ms")
        spec_only = state == "" and "task" in s.fields  # never claimed: its spec record alone
        return [
            issue(
                "orphan-spec" if spec_only else "orphan-hash",
                "error",
                (
                    f"pending job (its spec record {k.spec(jid)}, no hash)"
                    if spec_only
                    else f"job with state {state!r}"
                )
                + " is in none of due, leased, dead, so no worker will see it: fix puts it in due"
                + ("" if run_at is not None else ", due now (its run time is not stored)"),
                _to_due(k, s, ctx.now_ms, run_at if run_at is not None else ctx.now_ms),
                rearms=True,
            )
        ]
    plan: list[Command]
    if len(places) > 1:
        keep = state if state in places else places[0]
        if "leased" in places and (s.lease_until_ms or 0) > ctx.now_ms:
            keep = "leased"  # a lease in force stays: dropped, a second worker runs it at once
        plan = _remove_from(k, s, ctx.now_ms, [p for p in places if p != keep], keep)
        return [
            issue(
                "two-places",
                "error",
                f"job is in {where} at once (state {state!r}): fix keeps it in {keep}",
                plan,
            )
        ]
    place = places[0]

    def unusable(code: str, reason: str) -> Issue:
        """A job no worker can run, parked as claim would (lua/claim.lua read_claimable)."""
        if place == "leased":
            return issue(
                code,
                "error",
                f"{reason}; the worker holding it will fail it",
                how=f"wait for the lease to end, then {fix}",
            )
        if s.held:  # --fix never takes a job out of its hold: a waiting child stays waiting
            return issue(
                code,
                "error",
                f"{reason}: no worker can run it; it is set aside by flow control (flow:held)",
                how="nothing to type: the claim that meets it once flow control lets it run "
                "parks it on the dead list",
            )
        return issue(
            code,
            "error",
            f"{reason}: no worker can run it; fix parks it on the dead list for a human",
            _dead_letter(k, s, ctx.now_ms, reason, ctx.now_ms),
        )

    if state == "" and "spec_unreadable" in s.fields and place == "due":
        # Never claimed and its record unreadable: the state it has (due) is read from that
        # record too, so this is no state mismatch; claim parks it ('invalid job: record').
        return [unusable("invalid-job", "invalid job: record")]
    if state != place:
        plan = _repair(k, s, ctx.now_ms, "state", place)  # drops `worker` unless leased
        return [
            issue(
                "state-mismatch",
                "error",
                f"state field says {state!r} but the job is in {where}: fix sets it to {place!r}",
                plan,
            )
        ]
    score = s.due_ms if place == "due" else s.lease_until_ms if place == "leased" else None
    if score is not None and not 0 <= score <= MAX_SCORE_MS:
        then = "the next claim runs it" if place == "due" else "the next claim reaps the lease"
        if place == "due" and s.held:  # its score is in flow:held, and it stays held
            then = "it runs once flow control lets it"
        return [
            issue(
                "bad-score",
                "error",
                f"its score in {where} is {score if abs(score) < _OUT_OF_RANGE_MS else 'inf'}"
                f", not a time in ms: fix sets it to now, so {then}",
                _repair(k, s, ctx.now_ms, "score"),
            )
        ]
    if s.ttl_ms is not None:
        return [
            issue(
                "expiring-job",
                "error",
                f"job in {where} has an expiry ({s.ttl_ms} ms left): it would vanish",
                _repair(k, s, ctx.now_ms, "persist"),
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
                plan = _dead_letter(k, s, ctx.now_ms, "lease expired", ctx.now_ms, lease=True)
            else:
                plan = _to_due(k, s, ctx.now_ms, s.lease_until_ms, lease=True)
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
            out.append(unusable(*bad))
    return out


# -- queue-level findings: a record no job check can read (a place's: doctor_scan.py) ------
def unreadable_layout(queue: str, why: str) -> Issue:
    """A partition record this version cannot read: the queue's own keys are checked as a
    plain queue's, its partitions (found by SCAN) each as a queue of their own."""
    key = meta_key(queue)
    return Issue(
        "unreadable-layout",
        "error",
        f"{why}: clients and workers refuse this queue",
        f"inspect it (redis-cli GET {shlex.quote(key)}): restore it as 1|<n>|<names>, or "
        "delete it if the queue was never partitioned",
        queue,
    )
