"""Every client operation written once, as a generator that yields Redis requests and returns
the parsed result ("sans-I/O"). Queue drives these with blocking calls, AsyncQueue with awaits,
so the two clients cannot drift apart."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from redis.exceptions import RedisError

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import (
    BadArgument,
    JobNotFound,
    NotDurable,
    SchedulerError,
    raise_for_status,
)
from scheduler.core.keys import QueueKeys, check_job_id
from scheduler.core.models import ClaimBatch, FailOutcome, Job, JobSpec, JobState, QueueCounts
from scheduler.schedules import recurring

T = TypeVar("T")


@dataclass(frozen=True)
class Script:
    """Run one Lua transition with the queue's KEYS."""

    name: str
    args: list[str]


@dataclass(frozen=True)
class ScriptPipeline:
    """Several script calls in one pipeline (one connection, one round trip); the reply is the
    list of their replies. `wait` = (replicas, timeout_ms) appends WAIT, whose reply (how many
    replicas acknowledged these writes) comes last (see Settings.wait_replicas)."""

    calls: list[Script]
    wait: tuple[int, int] | None = None


@dataclass(frozen=True)
class Commands:
    """Plain read commands, pipelined (no transaction); the reply is a list."""

    cmds: list[tuple[Any, ...]]


Request = Script | ScriptPipeline | Commands
Op = Generator[Request, Any, T]

_LISTABLE = ("due", "scheduled", "leased", "dead")


@dataclass(frozen=True)
class Settings:
    result_ttl_ms: int = codec.RESULT_TTL_MS
    max_payload_bytes: int = codec.MAX_PAYLOAD_BYTES
    # Durability: 0 relies on the server's own persistence; N > 0 makes enqueue wait until N
    # replicas acknowledged the write and raise NotDurable otherwise.
    wait_replicas: int = 0
    wait_timeout_ms: int = 1_000


class Ops:
    """The operations of one queue. Holds no connection: see Queue and AsyncQueue."""

    def __init__(self, keys: QueueKeys, settings: Settings) -> None:
        self.keys = keys
        self.settings = settings

    # -- producers --------------------------------------------------------------------------
    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        delay_ms: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        key: str | None = None,
        jitter_ms: int = 0,
        timeout_ms: int = 0,
        job_id: str | None = None,
    ) -> Op[str]:
        spec = JobSpec(task, payload, delay_ms, run_at, max_attempts, backoff, key, jitter_ms,
                       timeout_ms, job_id)  # fmt: skip
        ids = yield from self.enqueue_many([spec])
        return ids[0]

    def enqueue_many(self, specs: Iterable[JobSpec], batch_size: int = 1000) -> Op[list[str]]:
        specs = list(specs)
        codec.check_int(batch_size, "batch_size")
        # Check every job before sending any batch: a bad job refuses the whole call.
        batches = [
            codec.enqueue_args(specs[i : i + batch_size], self.settings.max_payload_bytes)
            for i in range(0, len(specs), batch_size)
        ]
        wait = None
        if self.settings.wait_replicas > 0:
            wait = (self.settings.wait_replicas, self.settings.wait_timeout_ms)
        if len(batches) == 1 and wait is None:
            replies = [(yield Script("enqueue", batches[0]))]
        else:
            # All batches in one pipeline: Redis runs one while the next is still arriving.
            replies = yield ScriptPipeline([Script("enqueue", a) for a in batches], wait)
        ids: list[str] = []
        for args, reply in zip(batches, replies, strict=False):
            ids.extend(codec.parse_enqueue(reply, args))
        if wait is not None and int(replies[-1]) < wait[0]:
            raise NotDurable(ids, int(replies[-1]), wait[0])
        return ids

    # -- workers ----------------------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = 30_000,
        reap_limit: int = 100,
        nonce: str | None = None,
    ) -> Op[ClaimBatch]:
        """`nonce`: give the same one again when re-sending a call whose answer was lost:
        claim.lua then returns that call's jobs instead of leasing more (default: fresh)."""
        nonce = codec.new_nonce() if nonce is None else nonce
        args = codec.claim_args(worker_id, limit, lease_ms, nonce, reap_limit)
        reply = yield Script("claim", args)
        batch = codec.parse_claim(reply)
        # Cron schedules running low on precomputed slots: refill on this same call.
        if recurring.refill_requested(reply, len(batch.jobs), codec.CLAIM_FIELDS):
            try:
                placed_ms = yield from self.refill_schedules(batch.now_ms)
            except (RedisError, SchedulerError):
                # The jobs are leased already: hand them out. The refill request stays in
                # Redis, and the next claim (by any client) tries again.
                return batch
            if placed_ms is not None and not 0 <= batch.next_ms <= placed_ms:
                batch = ClaimBatch(batch.now_ms, placed_ms, batch.jobs)
        return batch

    def heartbeat(
        self, leases: Sequence[tuple[str, str]], *, lease_ms: int
    ) -> Op[tuple[int, dict[str, str]]]:
        reply = yield Script("heartbeat", codec.heartbeat_args(leases, lease_ms))
        return codec.parse_heartbeat(reply, leases)

    def complete_many(self, items: Sequence[tuple[str, str, Any]]) -> Op[list[str]]:
        """Statuses per job: 'done' | 'stale' | 'cancelled' | 'missing' (no exception)."""
        if not items:
            return []
        args = codec.complete_args(items, self.settings.result_ttl_ms,
                                   self.settings.max_payload_bytes)  # fmt: skip
        return codec.parse_statuses((yield Script("complete", args)))

    def complete(self, job_id: str, token: str, result: Any = None) -> Op[None]:
        """Record success; raises StaleToken / JobCancelled / JobNotFound when refused."""
        (status,) = yield from self.complete_many([(job_id, token, result)])
        raise_for_status(status, job_id, token)

    def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | tuple[str, str, str],
        *,
        retryable: bool = True,
        delay_ms: int | None = None,
    ) -> Op[FailOutcome]:
        args = codec.fail_args(job_id, token, error, retryable=retryable, delay_ms=delay_ms)
        return codec.parse_fail((yield Script("fail", args)), job_id, token)

    def release(self, leases: Sequence[tuple[str, str]]) -> Op[list[str]]:
        if not leases:
            return []
        return codec.parse_statuses((yield Script("release", codec.lease_pairs(leases))))

    # -- operators --------------------------------------------------------------------------
    def cancel(self, job_id: str) -> Op[str]:
        """Cancel a due or leased job; returns the state it was in. Raises JobNotFound."""
        check_job_id(job_id)
        state = codec.s((yield Script("cancel", [job_id, str(self.settings.result_ttl_ms)])))
        if state == "missing":
            raise JobNotFound(f"no job {job_id!r}")
        return state

    def get_job(self, job_id: str) -> Op[Job]:
        check_job_id(job_id)
        raw, score = yield Commands(
            [("HGETALL", self.keys.job(job_id)), ("ZSCORE", self.keys.leased, job_id)]
        )
        job = codec.parse_job(job_id, raw, score)
        if job is None:
            raise JobNotFound(f"no job {job_id!r} in queue {self.keys.queue!r}")
        return job

    def status(self, job_id: str) -> Op[JobState]:
        job = yield from self.get_job(job_id)
        try:
            return JobState(job.state)
        except ValueError:
            raise BadArgument(f"job {job_id!r} has an unreadable state {job.state!r}") from None

    def counts(self) -> Op[QueueCounts]:
        return codec.parse_counts((yield Script("counts", [])))

    def list_ids(self, state: str, *, offset: int = 0, limit: int = 50) -> Op[list[str]]:
        """Ids in one place, oldest first for due/scheduled/leased, newest first for dead."""
        if state not in _LISTABLE:
            raise BadArgument(f"state must be one of {', '.join(_LISTABLE)}, got {state!r}")
        codec._int(offset, "offset", minimum=0)
        codec._int(limit, "limit", minimum=1)
        k = self.keys
        if state == "dead":
            cmd: tuple[Any, ...] = ("LRANGE", k.dead, offset, offset + limit - 1)
        elif state == "leased":
            cmd = ("ZRANGE", k.leased, offset, offset + limit - 1)
        else:
            counts = yield from self.counts()
            lo, hi = ("-inf", counts.now_ms) if state == "due" else (f"({counts.now_ms}", "+inf")
            cmd = ("ZRANGE", k.due, lo, hi, "BYSCORE", "LIMIT", offset, limit)
        (reply,) = yield Commands([cmd])
        return [codec.s(v) for v in reply]

    def list_jobs(self, state: str, *, offset: int = 0, limit: int = 50) -> Op[list[Job]]:
        ids = yield from self.list_ids(state, offset=offset, limit=limit)
        return (yield from self.get_jobs(ids))

    def get_jobs(self, ids: Sequence[str]) -> Op[list[Job]]:
        if not ids:
            return []
        cmds: list[tuple[Any, ...]] = []
        for job_id in ids:
            cmds += [("HGETALL", self.keys.job(job_id)), ("ZSCORE", self.keys.leased, job_id)]
        reply = yield Commands(cmds)
        jobs = [codec.parse_job(i, reply[2 * n], reply[2 * n + 1]) for n, i in enumerate(ids)]
        return [j for j in jobs if j is not None]

    def dead_ids(
        self,
        *,
        task: str | None = None,
        error_type: str | None = None,
        older_than_ms: int | None = None,
        page: int = 1000,
    ) -> Op[list[str]]:
        """Ids on the dead list matching every filter given (all when none is)."""
        counts = yield from self.counts()
        out: list[str] = []
        start = 0
        while True:
            (ids,) = yield Commands([("LRANGE", self.keys.dead, start, start + page - 1)])
            ids = [codec.s(i) for i in ids]
            if not ids:
                return out
            start += len(ids)
            if task is None and error_type is None and older_than_ms is None:
                out.extend(ids)
                continue
            fields = yield Commands(
                [("HMGET", self.keys.job(i), "task", "last_error_type", "dead_ms") for i in ids]
            )
            for job_id, (t, et, dead_ms) in zip(ids, fields, strict=True):
                if task is not None and (t is None or codec.s(t) != task):
                    continue
                if error_type is not None and (et is None or codec.s(et) != error_type):
                    continue
                # A dead_ms that does not read as a number (hand-edited) matches no age filter.
                dead_at = codec.stored_int(dead_ms)
                if older_than_ms is not None and (
                    dead_at is None or counts.now_ms - dead_at < older_than_ms
                ):
                    continue
                out.append(job_id)

    def requeue_dead(self, ids: Sequence[str], batch_size: int = 500) -> Op[int]:
        """Move these dead jobs back to due with a fresh attempt budget; returns how many."""
        moved = 0
        for i in range(0, len(ids), batch_size):
            moved += int((yield Script("requeue_dead", list(ids[i : i + batch_size]))))
        return moved

    def purge_dead(self, ids: Sequence[str], batch_size: int = 500) -> Op[int]:
        """Delete these dead jobs for good; returns how many."""
        purged = 0
        for i in range(0, len(ids), batch_size):
            purged += int((yield Script("purge_dead", list(ids[i : i + batch_size]))))
        return purged

    # -- recurring schedules (scheduler/schedules/, lua/schedule_*.lua, lua/lib/rearm.lua) ---
    def schedule(
        self,
        name: str,
        task: str,
        payload: Any = None,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        tz: str | None = None,
        jitter_ms: int = 0,
        misfire: str = "run_once",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout_ms: int = 0,
    ) -> Op[str]:
        """Create or redefine a schedule by name; returns 'created' | 'updated' | 'unchanged'
        | 'repaired'. The same definition again writes nothing (safe at every start-up)."""
        payload_json = codec.encode_json(payload, "payload", self.settings.max_payload_bytes)
        d = recurring.define(
            name, task, payload_json, cron=cron, every_ms=every_ms, tz=tz, jitter_ms=jitter_ms,
            misfire=misfire, max_attempts=max_attempts, backoff=backoff, timeout_ms=timeout_ms,
        )  # fmt: skip
        sk = self.keys.schedule(name)
        ((digest, pending, paused, starved),) = yield Commands(
            [("HMGET", sk, "digest", "pending", "paused", "starved")]
        )
        if digest is not None and codec.s(digest) == d.digest:
            if "1" in (codec.s(paused or ""), codec.s(starved or "")):
                return "unchanged"
            if pending:
                (score,) = yield Commands([("ZSCORE", self.keys.due, codec.s(pending))])
                if score is not None:
                    return "unchanged"
        counts = yield from self.counts()
        reply = yield Script("schedule_upsert", d.upsert_args(d.first_slots(counts.now_ms)))
        return codec.s(reply[0])

    def get_schedule(self, name: str) -> Op[recurring.Schedule]:
        recurring.check_schedule_name(name)
        (raw,) = yield Commands([("HGETALL", self.keys.schedule(name))])
        found = recurring.parse_schedule(name, {codec.s(k): codec.s(v) for k, v in raw.items()})
        if found is None:
            raise BadArgument(f"no schedule {name!r} in queue {self.keys.queue!r}")
        return found

    def list_schedules(self) -> Op[list[recurring.Schedule]]:
        (names,) = yield Commands([("SMEMBERS", self.keys.schedules)])
        names = sorted(codec.s(n) for n in names)
        if not names:
            return []
        raws = yield Commands([("HGETALL", self.keys.schedule(n)) for n in names])
        out = []
        for n, raw in zip(names, raws, strict=True):
            sch = recurring.parse_schedule(n, {codec.s(k): codec.s(v) for k, v in raw.items()})
            if sch is not None:
                out.append(sch)
        return out

    def pause_schedule(self, name: str) -> Op[str]:
        """'paused' | 'already' | 'missing'."""
        recurring.check_schedule_name(name)
        return codec.s((yield Script("schedule_pause", [name])))

    def remove_schedule(self, name: str) -> Op[str]:
        """'removed' | 'missing'."""
        recurring.check_schedule_name(name)
        return codec.s((yield Script("schedule_remove", [name])))

    def resume_schedule(self, name: str) -> Op[str]:
        """'resumed' | 'active' (was not paused) | 'missing'."""
        recurring.check_schedule_name(name)
        for _ in range(5):
            (fields,) = yield Commands([("HGETALL", self.keys.schedule(name))])
            f = {codec.s(k): codec.s(v) for k, v in fields.items()}
            if not f:
                return "missing"
            slots: list[int] = []
            if f.get("kind") == "cron" and f.get("paused") == "1":
                counts = yield from self.counts()
                offset = int(f.get("offset_ms") or 0)
                slots = recurring.cron_slots_after(
                    f["cron"], f["tz"], counts.now_ms - offset - 1, recurring.BUFFER_SLOTS
                )
            args = [name, f.get("digest", ""), *map(str, slots)]
            status = codec.s((yield Script("schedule_resume", args))[0])
            if status != "stale":
                return status
        return "stale"

    def refill_schedules(self, now_ms: int, *, most: int = 20) -> Op[int | None]:
        """Top up the cron buffers that lua/lib/rearm.lua asked for; idempotent, so any client
        may do it (Ops.claim does, when the claim reply asks). Returns when the earliest
        occurrence this placed is due (a starved schedule gets its next one here), or None."""
        (names,) = yield Commands([("SRANDMEMBER", self.keys.schedules_refill, most)])
        names = [codec.s(n) for n in names]
        if not names:
            return None
        cmds: list[tuple[Any, ...]] = []
        for n in names:
            cmds += [
                ("HGETALL", self.keys.schedule(n)),
                ("ZRANGE", self.keys.schedule_slots(n), -1, -1),
            ]
        reply = yield Commands(cmds)
        earliest: int | None = None
        for i, n in enumerate(names):
            f = {codec.s(k): codec.s(v) for k, v in reply[2 * i].items()}
            tail = reply[2 * i + 1]
            slots: list[int] = []
            if f.get("kind") == "cron":
                try:
                    slots = recurring.refill_slots(
                        f, int(codec.s(tail[0])) if tail else None, now_ms
                    )
                except (BadArgument, ValueError, KeyError):
                    continue  # a hand-edited definition: leave it for an operator
            out = yield Script("schedule_refill", [n, f.get("digest", ""), *map(str, slots)])
            placed = codec.s(out[1])
            if placed and placed != f.get("pending"):
                due_ms = int(placed.rsplit(":", 1)[1]) + int(f.get("offset_ms") or 0)
                earliest = due_ms if earliest is None else min(earliest, due_ms)
        return earliest
