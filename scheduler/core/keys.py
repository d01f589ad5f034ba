"""The only place key names are formatted. Every key of a queue carries the hash tag `{queue}`,
so one queue lives in one Redis Cluster slot."""

from __future__ import annotations

import re
from dataclasses import dataclass

from scheduler.core.errors import BadArgument

ROOT = "sched"
# No braces, colons or spaces: user input can never end the hash tag or the prefix early.
_QUEUE_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_JOB_ID_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


# A URL path segment of only dots is a "dot segment" browsers resolve away: the dashboard
# could never link to a queue or a job named so.
_DOTS = frozenset({".", ".."})


def check_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_RE.fullmatch(name) or name in _DOTS:
        raise BadArgument(
            f"invalid queue name {name!r}: use 1-64 of A-Z a-z 0-9 _ . - (no braces or colons; "
            "not '.' or '..')"
        )
    return name


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise BadArgument(f"invalid job id {job_id!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
    return job_id


# The ids of recurring schedules' runs (lua/lib/rearm.lua): a job enqueued with one would be
# taken over by its schedule's run (and deleted by a pause), so enqueue refuses them.
OCCURRENCE_PREFIX = "schedule:"
# A SET of the queue names ever written to (core/queue_index.py): listing without a SCAN.
QUEUE_INDEX = f"{ROOT}:queues"
# The storage generation this version reads and writes (lua/lib/util.lua STORAGE_GENERATION):
# a later version that stores what this one would misread sets the queue's `config` field
# `generation` higher, and this one refuses that queue (NewerStorage).
STORAGE_GENERATION = 1


def check_new_job_id(job_id: str) -> str:
    """A caller-chosen id for a new job: check_job_id, and not a schedule run's."""
    check_job_id(job_id)
    if job_id in _DOTS:
        raise BadArgument(f"invalid job id {job_id!r}: '.' and '..' cannot be linked to")
    if job_id.startswith(OCCURRENCE_PREFIX):
        raise BadArgument(
            f"invalid job id {job_id!r}: ids starting with {OCCURRENCE_PREFIX!r} are the runs "
            "of recurring schedules"
        )
    # A plain str: the id the call returns, which the lease calls take as exactly str (a
    # partitioned queue's MadeId, or a caller's own str subclass, would be refused there).
    return str(job_id)


@dataclass(frozen=True)
class QueueKeys:
    queue: str

    def __post_init__(self) -> None:
        check_queue_name(self.queue)

    @property
    def prefix(self) -> str:
        return f"{ROOT}:{{{self.queue}}}:"

    @property
    def due(self) -> str:
        return self.prefix + "due"

    @property
    def leased(self) -> str:
        return self.prefix + "leased"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def wake(self) -> str:
        return self.prefix + "wake"

    @property
    def dead_migrating(self) -> str:
        """The ZSET an old dead LIST is converted into, in steps (lua/lib/job.lua)."""
        return self.prefix + "dead:migrating"

    @property
    def config(self) -> str:
        """Per-queue settings (HASH): the opt-in dead-letter retention, paused_ms (a pause)."""
        return self.prefix + "config"

    def job(self, job_id: str) -> str:
        return self.prefix + "job:" + job_id

    @property
    def finished(self) -> str:
        """Done and cancelled ids -> the ms their record expires (lua/lib/result.lua)."""
        return self.prefix + "finished"

    @property
    def flow_held(self) -> str:
        """Due jobs set aside by flow control, id -> run_at_ms (lua/lib/flow.lua)."""
        return self.prefix + "flow:held"

    @property
    def flow_rheld(self) -> str:
        """The part of flow_held set aside by a full rate window, id -> next slot ms."""
        return self.prefix + "flow:rheld"

    @property
    def flow_waiting(self) -> str:
        """The part of flow_held waiting for parent jobs (enqueue after=), id -> run_at_ms."""
        return self.prefix + "flow:waiting"

    @property
    def flow_ending(self) -> str:
        """Parents whose end has waiting children left to reach ('<word>:<id>' -> queued ms:
        lua/lib/flow.lua FLOW_END_STEP), continued by the next claims."""
        return self.prefix + "flow:ending"

    @property
    def isolated(self) -> str:
        """HASH worker id -> the one suspect job (lapsed twice) it holds (lua/claim.lua)."""
        return self.prefix + "isolated"

    def spec(self, job_id: str) -> str:
        """A job's spec record until and after its first claim (lua/lib/job.lua)."""
        return self.prefix + "spec:" + job_id

    def result_wake(self, job_id: str) -> str:
        """LIST: the wake-up Queue.result() blocks on (lua/lib/result.lua pushes it)."""
        return self.prefix + "result:" + job_id

    def result_wait(self, job_id: str) -> str:
        """SET: the Queue.result() waiters of the job (each adds its id), so the outcome pushes
        a wake-up (lua/README.md)."""
        return self.prefix + "result_wait:" + job_id

    def idem(self, digest: str) -> str:
        return self.prefix + "idem:" + digest

    def stats(self, minute: int) -> str:
        return f"{self.prefix}stats:{minute}"

    def schedule(self, name: str) -> str:
        return self.prefix + "schedule:" + name

    @property
    def schedules(self) -> str:
        return self.prefix + "schedules"

    def schedule_slots(self, name: str) -> str:
        """ZSET of a cron schedule's next slot times (lua/lib/rearm.lua)."""
        return self.prefix + "schedule:" + name + ":slots"

    @property
    def schedules_refill(self) -> str:
        """SET of schedule names whose slot buffer the next claiming client refills."""
        return self.prefix + "schedules:refill"

    @property
    def workers(self) -> str:
        return self.prefix + "workers"

    def worker(self, worker_id: str) -> str:
        return self.prefix + "worker:" + worker_id

    def worker_stop(self, worker_id: str) -> str:
        """STRING 'quiet' | 'stop': an operator's request to that worker, until its next beat
        reads it (lua/worker_beat.lua) or it expires (admin/worker_stop.py)."""
        return self.prefix + "worker_stop:" + worker_id

    @property
    def test_clock(self) -> str:
        return self.prefix + "test:now_ms"

    def script_keys(self) -> list[str]:
        """KEYS for every script, in the order the Lua headers document."""
        return [self.prefix, self.due, self.leased, self.dead, self.wake]

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this queue."""
        return f"{ROOT}:{{{self.queue}}}:*"
