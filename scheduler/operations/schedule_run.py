"""Running a recurring schedule once now, beside its slots (lua/schedule_run.lua)."""

from __future__ import annotations

from scheduler.core import codec
from scheduler.core.errors import ScheduleNotFound
from scheduler.core.ids import new_job_id
from scheduler.core.keys import check_new_job_id
from scheduler.operations.requests import Op, OpsBase, Script
from scheduler.operations.schedules import unreadable
from scheduler.schedules import recurring


class ScheduleRunOps(OpsBase):
    """Documented for users on Queue.run_schedule_now."""

    def run_schedule_now(self, name: str, job_id: str | None = None) -> Op[str]:
        """The new job's id (or `job_id`'s, already there: nothing written). ScheduleNotFound
        when there is no such schedule; BadArgument for a malformed name or id, or a stored
        definition the scripts cannot read; nothing written either way."""
        recurring.check_schedule_name(name)
        job_id = new_job_id() if job_id is None else check_new_job_id(job_id)
        status, _ = (codec.s(v) for v in (yield Script("schedule_run", [name, job_id])))
        if status == "missing":
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self.keys.queue!r}")
        if status == "unreadable":
            raise unreadable(name)
        return job_id
