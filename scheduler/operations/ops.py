"""`Ops`: the operations of one queue, composed from one module per responsibility:

- requests.py: what an operation yields (Script, ScriptPipeline, Commands), Settings, OpsBase
- producing.py: enqueue, enqueue_many
- leasing.py: claim, heartbeat, complete, fail, release (a worker's calls)
- inspecting.py: get_job, status, list, counts, cancel
- dead_letters.py: dead_ids, requeue_dead, purge_dead
- queue_config.py: the queue's own settings (dead-letter retention, priority aging)
- schedules.py: recurring schedules (define, pause, resume, remove, refill)
- schedule_run.py: run a schedule once now, beside its slots
- pausing.py: pause and resume the whole queue
- rescheduling.py: move a waiting job's run time

Every operation is written once, as a generator that yields Redis requests and returns the
parsed result ("sans-I/O"): Queue, AsyncQueue and the worker only drive them."""

from __future__ import annotations

from scheduler.operations.dead_letters import DeadLetterOps
from scheduler.operations.inspecting import InspectingOps
from scheduler.operations.leasing import LeasingOps
from scheduler.operations.pausing import PausingOps
from scheduler.operations.producing import ProducingOps
from scheduler.operations.queue_config import ConfigOps
from scheduler.operations.requests import (
    Commands,
    Op,
    Request,
    Script,
    ScriptPipeline,
    Settings,
)
from scheduler.operations.rescheduling import ReschedulingOps
from scheduler.operations.schedule_run import ScheduleRunOps
from scheduler.operations.schedules import ScheduleOps

__all__ = ["Commands", "Op", "Ops", "Request", "Script", "ScriptPipeline", "Settings"]


class Ops(
    ProducingOps, LeasingOps, InspectingOps, DeadLetterOps, ScheduleOps, ScheduleRunOps,
    PausingOps, ReschedulingOps, ConfigOps,
):  # fmt: skip
    """The operations of one queue. Holds no connection: see Queue and AsyncQueue."""
