"""Inspecting (get, status, list, counts) and cancelling jobs: what operators and producers
ask of a queue."""

from __future__ import annotations

from collections.abc import Sequence
from copy import copy
from dataclasses import replace
from typing import Any, Self

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import (
    BadArgument,
    CorruptKey,
    JobNotFound,
)
from scheduler.core.keys import check_job_id
from scheduler.core.models import Job, JobState
from scheduler.core.spec_record import HEAD_BYTES, spec_head
from scheduler.operations.dead_letters import dead_page
from scheduler.operations.requests import Commands, Op, OpsBase, Script
from scheduler.operations.result_wait import (
    RESULT_BLOCK_SLICE_S,
    ResultWait,
    WaitOp,
    wait_outcome,
)

# held: due jobs flow control sets aside (a concurrency or rate limit, parents not done), by
# run_at; counts() counts them in `due`, whose listing (the `due` index alone) leaves them out.
# finished: done and cancelled jobs whose record is kept (lua/lib/result.lua's index).
LISTABLE = ("due", "scheduled", "held", "leased", "dead", "finished")
MAX_RESULT_WAIT_S = 86_400.0


def check_page(state: str, offset: int, limit: int) -> None:
    """A page of `list_jobs` / `list_ids`: BadArgument before anything is read."""
    if state not in LISTABLE:
        raise BadArgument(f"state must be one of {', '.join(LISTABLE)}, got {state!r}")
    codec._int(offset, "offset", minimum=0)
    codec._int(limit, "limit", minimum=1)


def wrong_type(exc: ResponseError, state: str, queue: str) -> Exception:
    """What a read of one place (`state`'s set) raises for `exc`: CorruptKey for a WRONGTYPE
    (the set edited by hand into another type), else `exc` itself."""
    if not str(exc).startswith("WRONGTYPE"):
        return exc
    return CorruptKey(
        f"the {state} set of queue {queue!r} is of another type (edited by hand): see "
        "`scheduler doctor`"
    )


class InspectingOps(OpsBase):
    """Reads and cancel; documented for users on Queue (get_job, status, list_jobs, counts,
    cancel, result)."""

    def cancel(self, job_id: str) -> Op[str]:
        """Cancel a waiting or leased job; returns the state it was in ('due', 'scheduled',
        'held', 'leased', or the unchanged final one). Raises JobNotFound."""
        check_job_id(job_id)
        state = codec.s((yield Script("cancel", [job_id, str(self.settings.result_ttl_ms)])))
        if state == "missing":
            raise JobNotFound(f"no job {job_id!r}")
        return state

    listing_payload = True  # get_jobs / list_jobs read whole records (heads(): not)

    def heads(self) -> Self:
        """These operations with get_jobs / list_jobs reading each job's spec record up to its
        payload (spec_record.spec_head), for listings that show none: a page of 50 jobs of
        512 KiB held 50 MB in the client. Their Jobs have no `payload` field, unless the hash
        holds one (an older layout). The client must read a reply cut inside a character:
        bytes, or decoded with an error handler (job_listing.heads_readable)."""
        ops = copy(self)
        ops.listing_payload = False
        return ops

    def _job_reads(self, job_id: str, payload: bool = True) -> list[tuple[Any, ...]]:
        """A job's hash, its spec record (lua/lib/job.lua; without `payload` its first
        HEAD_BYTES) and its scores: codec.parse_job's arguments."""
        k = self.keys
        head = ("GETRANGE", k.spec(job_id), 0, HEAD_BYTES - 1)
        return [
            ("HGETALL", k.job(job_id)),
            ("ZSCORE", k.leased, job_id),
            ("GET", k.spec(job_id)) if payload else head,
            ("ZSCORE", k.due, job_id),
            # Set aside by flow control: still due, at this run_at (docs/flow-control.md).
            ("ZSCORE", k.flow_held, job_id),
            # Taken out of due by a queue move (admin/queue_move.py), at this run_at.
            ("ZSCORE", k.prefix + "moving", job_id),
        ]

    @staticmethod
    def _parse(job_id: str, r: Sequence[Any], head: bool = False) -> Job | None:
        """A waiting job in flow:held and not in due reads HELD, one in a queue move's `moving`
        set MOVING (reported, never stored). `head`: r's record is a head (no payload)."""
        raw, lease, spec, due, held, moving = r
        at = next((s for s in (due, held, moving) if s is not None), None)
        job = codec.parse_job(job_id, raw, lease, spec, at)
        if head and job is not None and not any(codec.s(f) == "payload" for f in raw or ()):
            fields = {k: v for k, v in job.fields.items() if k != "payload"}
            job = replace(job, payload_json="", fields=fields)
        if job is None or due is not None or job.state != JobState.DUE:
            return job
        if held is not None:
            return replace(job, state=JobState.HELD.value)
        return job if moving is None else replace(job, state=JobState.MOVING.value)

    def _read_jobs(self, ids: Sequence[str], payload: bool = True) -> Op[list[Job | None]]:
        """_job_reads of each id in one round trip, parsed (without `payload`, a second one
        for the records whose head was not all there: _whole_where_short). flow:held or
        moving edited into another type (doctor reports it) reads as holding nothing, rather
        than failing every job's read."""
        chunks = yield from self._job_replies(ids, payload)
        if chunks is None:  # one job's key of another type, among several: each read alone
            return (yield from self._read_each(ids, payload))
        if not payload:
            chunks = yield from self._whole_where_short(ids, chunks)
        return [self._parse(i, c, not payload) for i, c in zip(ids, chunks, strict=True)]

    def _job_replies(self, ids: Sequence[str], payload: bool) -> Op[list[list[Any]] | None]:
        """Each id's 6 replies of _job_reads, None when a key of one of several jobs is of
        another type."""
        try:
            reply = yield Commands([c for i in ids for c in self._job_reads(i, payload)])
            return [reply[6 * n : 6 * n + 6] for n in range(len(ids))]
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
        # Which of flow:held and moving is of another type: only that one reads as empty (a
        # moving job is not DUE for a broken flow:held, nor a held one for a broken moving).
        kinds = yield Commands([("TYPE", c[1]) for c in self._job_reads(ids[0])[4:]])
        keep = [codec.s(t) in ("zset", "none") for t in kinds]

        def reads(i: str) -> list[tuple[Any, ...]]:
            r = self._job_reads(i, payload)
            return r[:4] + [c for c, k in zip(r[4:], keep, strict=True) if k]

        def filled(chunk: Sequence[Any]) -> list[Any]:
            extra = iter(chunk[4:])
            return [*chunk[:4], *(next(extra) if k else None for k in keep)]

        width = 4 + sum(keep)
        try:
            reply = yield Commands([c for i in ids for c in reads(i)])
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            if len(ids) > 1:
                return None
            # due, leased, or a job's own key edited by hand: the typed error scripts give.
            raise CorruptKey(
                f"a key of queue {self.keys.queue!r} is of another type (edited by hand), "
                f"reading {len(ids)} job(s): see `scheduler doctor`"
            ) from None
        return [filled(reply[width * n : width * (n + 1)]) for n in range(len(ids))]

    def _whole_where_short(
        self, ids: Sequence[str], chunks: list[list[Any]]
    ) -> Op[list[list[Any]]]:
        """Each record's head (GETRANGE's reply) as spec_head finds it, or the whole record
        where it is not all there (a field edited to be long, another layout). GETRANGE
        answers '' for no record: beside a hash that is no record (a lean finished job, an
        older layout); without one, GET says (a job gone meanwhile, a record set to '')."""
        short = []
        for i, c in zip(ids, chunks, strict=True):
            got, c[2] = c[2], spec_head(c[2])
            if c[2] is None and (got or not c[0]):
                short.append((i, c))
        if short:
            whole = yield Commands([("GET", self.keys.spec(i)) for i, _ in short])
            for (_, c), w in zip(short, whole, strict=True):
                c[2] = w
        return chunks

    def _read_each(self, ids: Sequence[str], payload: bool = True) -> Op[list[Job | None]]:
        """_read_jobs one id at a time: a job whose own key is of another type reads as None
        (left out, as a job gone; doctor names it), unless every one fails (due or leased
        itself is of another type: CorruptKey)."""
        out: list[Job | None] = []
        failed: CorruptKey | None = None
        for i in ids:
            try:
                out += yield from self._read_jobs([i], payload)
            except CorruptKey as exc:
                failed = exc
                out.append(None)
        if failed is not None and all(j is None for j in out):
            raise failed
        return out

    def get_job(self, job_id: str) -> Op[Job]:
        """One job's record, a waiting job as HELD (set aside by flow control), else SCHEDULED
        or DUE by the server's clock; raises JobNotFound."""
        check_job_id(job_id)
        (job,) = yield from self._read_jobs([job_id])
        if job is None:
            raise JobNotFound(f"no job {job_id!r} in queue {self.keys.queue!r}")
        if job.state == JobState.DUE:
            # Due or scheduled is a matter of the server's clock, which counts reads.
            job = job.as_of((yield from self.counts()).now_ms)
        return job

    def status(self, job_id: str) -> Op[JobState]:
        """HELD for a waiting job flow control sets aside, MOVING for one a queue move holds,
        else SCHEDULED while its run_at is after the server's now, DUE from then."""
        job = yield from self.get_job(job_id)
        try:
            return JobState(job.state)
        except ValueError:
            raise BadArgument(f"job {job_id!r} has an unreadable state {job.state!r}") from None

    def list_ids(self, state: str, *, offset: int = 0, limit: int = 50) -> Op[list[str]]:
        """Ids in one place, oldest first for due/scheduled/leased, newest first for dead;
        finished: latest to expire first (the order they finished in, for jobs kept equally
        long)."""
        check_page(state, offset, limit)
        try:
            return (yield from self._list_ids(state, offset, limit))
        except ResponseError as exc:
            raise wrong_type(exc, state, self.keys.queue) from None

    def _list_ids(self, state: str, offset: int, limit: int) -> Op[list[str]]:
        k = self.keys
        if state == "dead":
            return (yield from dead_page(k, offset, limit))
        if state in ("leased", "held"):
            key = k.leased if state == "leased" else k.flow_held
            cmd: tuple[Any, ...] = ("ZRANGE", key, offset, offset + limit - 1)
        else:
            now_ms = (yield from self.counts()).now_ms  # the server's clock
            if state == "finished":  # an id whose record expired (not yet trimmed): left out
                cmd = ("ZRANGE", k.finished, "+inf", f"({now_ms}", "BYSCORE", "REV")
            else:
                lo, hi = ("-inf", now_ms) if state == "due" else (f"({now_ms}", "+inf")
                cmd = ("ZRANGE", k.due, lo, hi, "BYSCORE")
            cmd += ("LIMIT", offset, limit)
        (reply,) = yield Commands([cmd])
        return [codec.s(v) for v in reply]

    def list_jobs(self, state: str, *, offset: int = 0, limit: int = 50) -> Op[list[Job]]:
        """One page of `list_ids` as Jobs (a job gone between the two reads is left out)."""
        ids = yield from self.list_ids(state, offset=offset, limit=limit)
        return (yield from self.get_jobs(ids))

    def get_jobs(self, ids: Sequence[str]) -> Op[list[Job]]:
        """These jobs in one round trip, missing ones left out, waiting ones as of now (of
        heads(): without their payloads)."""
        if not ids:
            return []
        jobs = [j for j in (yield from self._read_jobs(ids, self.listing_payload)) if j]
        if any(j.state == JobState.DUE for j in jobs):
            now_ms = (yield from self.counts()).now_ms
            jobs = [j.as_of(now_ms) for j in jobs]
        return jobs

    def result(
        self,
        job_id: str,
        timeout_s: float,
        wait: ResultWait | None = None,
        block_s: float = RESULT_BLOCK_SLICE_S,
    ) -> WaitOp[Any]:
        """Wait for the job's outcome: its result (JSON decoded) when done; raises JobDead,
        JobCancelled, JobNotFound, or ResultTimeout after timeout_s.

        Blocks on a wake-up, in slices of at most `block_s`, re-reading the job's state (not
        the whole job) between them: operations/result_wait.py. It yields `Pause` besides
        requests (client/result_waiting.py drives it)."""
        check_job_id(job_id)
        if (
            not isinstance(timeout_s, int | float)
            or isinstance(timeout_s, bool)
            or not 0 < timeout_s <= MAX_RESULT_WAIT_S
        ):
            raise BadArgument(
                f"timeout_s must be a number in (0, {MAX_RESULT_WAIT_S:g}], got {timeout_s!r}"
            )
        # `wait`: the caller's, to take it out of result_wait when the task running this op is
        # cancelled (AsyncQueue.result); every other end of the wait takes it out here.
        wait = wait or ResultWait(self.keys.result_wait(job_id))
        try:
            out = yield from wait_outcome(self.keys, self.get_job, job_id, timeout_s, wait, block_s)
        except GeneratorExit:
            raise
        except BaseException:
            yield from wait.leave()
            raise
        yield from wait.leave()
        return out
