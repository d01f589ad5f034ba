"""Rescheduling: move a waiting job's run time (lua/reschedule.lua)."""

from __future__ import annotations

from datetime import datetime

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import BadArgument, JobNotFound
from scheduler.core.keys import check_job_id
from scheduler.core.limits import check_int
from scheduler.operations.requests import Commands, Op, OpsBase, Script


class ReschedulingOps(OpsBase):
    def reschedule(
        self, job_id: str, *, delay_ms: int | None = None, run_at: datetime | None = None
    ) -> Op[str]:
        """'rescheduled' | why not: 'leased', 'done', 'dead', 'cancelled', 'held' (flow
        control), 'schedule' (an occurrence), 'moving' (a queue move holds it); JobNotFound;
        BadArgument (nothing changed)."""
        check_job_id(job_id)
        if (delay_ms is None) == (run_at is None):
            raise BadArgument("give delay_ms or run_at (one of them)")
        if run_at is not None:
            when, time_ms = "at", codec.epoch_ms(run_at)
        else:
            when, time_ms = "in", check_int(delay_ms, "delay_ms")
        reply = yield Script("reschedule", [job_id, when, str(time_ms)])
        word = yield from self._moving(job_id, codec.s(reply[0]))
        if word == "missing":
            raise JobNotFound(f"no job {job_id!r}")
        return word

    def run_now(self, job_id: str) -> Op[str]:
        """`reschedule(delay_ms=0)` for a job due later only: a job due already keeps its
        place in line (the dashboard's "run now" posted from a stale page), answered 'due'."""
        check_job_id(job_id)
        reply = yield Script("reschedule", [job_id, "now", "0"])
        word = yield from self._moving(job_id, codec.s(reply[0]))
        if word == "missing":
            raise JobNotFound(f"no job {job_id!r}")
        return word

    def _moving(self, job_id: str, word: str) -> Op[str]:
        """'moving' for a job a queue move holds in the queue's `moving` set: reschedule.lua,
        which moves only a job in due, answers 'missing' for a never-claimed one there and its
        stored word 'due' for a retried one. One read, on those two answers only; a `moving`
        of another type (a hand edit: doctor's `moving-damaged`) holds nothing."""
        if word not in ("missing", "due"):
            return word
        try:
            (at,) = yield Commands([("ZSCORE", self.keys.prefix + "moving", job_id)])
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            return word
        return word if at is None else "moving"
