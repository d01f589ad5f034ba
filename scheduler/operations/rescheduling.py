"""Rescheduling: move a waiting job's run time (lua/reschedule.lua)."""

from __future__ import annotations

from datetime import datetime

from scheduler.core import codec
from scheduler.core.errors import BadArgument, JobNotFound
from scheduler.core.keys import check_job_id
from scheduler.core.limits import check_int
from scheduler.operations.requests import Op, OpsBase, Script


class ReschedulingOps(OpsBase):
    def reschedule(
        self, job_id: str, *, delay_ms: int | None = None, run_at: datetime | None = None
    ) -> Op[str]:
        """'rescheduled' | why not: 'leased', 'done', 'dead', 'cancelled', 'held' (flow
        control), 'schedule' (an occurrence); JobNotFound; BadArgument (nothing changed)."""
        check_job_id(job_id)
        if (delay_ms is None) == (run_at is None):
            raise BadArgument("give delay_ms or run_at (one of them)")
        if run_at is not None:
            when, time_ms = "at", codec.epoch_ms(run_at)
        else:
            when, time_ms = "in", check_int(delay_ms, "delay_ms")
        reply = yield Script("reschedule", [job_id, when, str(time_ms)])
        word = codec.s(reply[0])
        if word == "missing":
            raise JobNotFound(f"no job {job_id!r}")
        return word

    def run_now(self, job_id: str) -> Op[str]:
        """`reschedule(delay_ms=0)` for a job due later only: a job due already keeps its
        place in line (the dashboard's "run now" posted from a stale page), answered 'due'."""
        check_job_id(job_id)
        word = codec.s((yield Script("reschedule", [job_id, "now", "0"]))[0])
        if word == "missing":
            raise JobNotFound(f"no job {job_id!r}")
        return word
