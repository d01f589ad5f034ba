"""scheduler: a Redis-backed job scheduler with leases, fencing tokens, retries and dead letters."""

from scheduler.aio import AsyncQueue
from scheduler.backoff import Backoff
from scheduler.errors import (
    BadArgument,
    InvalidPayload,
    JobCancelled,
    JobNotFound,
    LeaseLost,
    SchedulerError,
    StaleToken,
)
from scheduler.models import ClaimedJob, Job, JobSpec, JobState, QueueCounts
from scheduler.queue import Queue

__all__ = [
    "AsyncQueue",
    "Backoff",
    "BadArgument",
    "ClaimedJob",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "LeaseLost",
    "Queue",
    "QueueCounts",
    "SchedulerError",
    "StaleToken",
]
