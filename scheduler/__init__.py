"""scheduler: a Redis-backed job scheduler with leases, fencing tokens, retries and dead letters."""

from scheduler.client.aio import AsyncQueue
from scheduler.client.queue import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.errors import (
    BadArgument,
    InvalidPayload,
    JobCancelled,
    JobNotFound,
    LeaseExpired,
    SchedulerError,
    StaleToken,
)
from scheduler.core.models import ClaimedJob, Job, JobSpec, JobState, QueueCounts

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
    "LeaseExpired",
    "Queue",
    "QueueCounts",
    "SchedulerError",
    "StaleToken",
]
