"""Inspecting (get, status, list, counts) and cancelling jobs: what operators and producers
ask of a queue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.core import codec
from scheduler.core.errors import BadArgument, JobNotFound
from scheduler.core.keys import check_job_id
from scheduler.core.models import Job, JobState
from scheduler.operations.dead_letters import dead_page
from scheduler.operations.requests import Commands, Op, OpsBase, Script

LISTABLE = ("due", "scheduled", "leased", "dead")


class InspectingOps(OpsBase):
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
        if job.state == JobState.DUE:
            # Due or scheduled is a matter of the server's clock, which counts reads.
            job = job.as_of((yield from self.counts()).now_ms)
        return job

    def status(self, job_id: str) -> Op[JobState]:
        """SCHEDULED for a waiting job whose run_at is after the server's now, DUE from then."""
        job = yield from self.get_job(job_id)
        try:
            return JobState(job.state)
        except ValueError:
            raise BadArgument(f"job {job_id!r} has an unreadable state {job.state!r}") from None

    def list_ids(self, state: str, *, offset: int = 0, limit: int = 50) -> Op[list[str]]:
        """Ids in one place, oldest first for due/scheduled/leased, newest first for dead."""
        if state not in LISTABLE:
            raise BadArgument(f"state must be one of {', '.join(LISTABLE)}, got {state!r}")
        codec._int(offset, "offset", minimum=0)
        codec._int(limit, "limit", minimum=1)
        k = self.keys
        if state == "dead":
            return (yield from dead_page(k, offset, limit))
        if state == "leased":
            cmd: tuple[Any, ...] = ("ZRANGE", k.leased, offset, offset + limit - 1)
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
        parsed = [codec.parse_job(i, reply[2 * n], reply[2 * n + 1]) for n, i in enumerate(ids)]
        jobs = [j for j in parsed if j is not None]
        if any(j.state == JobState.DUE for j in jobs):
            now_ms = (yield from self.counts()).now_ms
            jobs = [j.as_of(now_ms) for j in jobs]
        return jobs
