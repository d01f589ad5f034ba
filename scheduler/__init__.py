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
    LeaseRefused,
    NotDurable,
    SchedulerError,
    StaleToken,
    UnknownTask,
)
from scheduler.core.models import (
    ClaimBatch,
    ClaimedJob,
    FailOutcome,
    Job,
    JobSpec,
    JobState,
    QueueCounts,
)
from scheduler.worker.registry import JobContext, Registry

__all__ = [
    "AsyncQueue",
    "Backoff",
    "BadArgument",
    "ClaimBatch",
    "ClaimedJob",
    "FailOutcome",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "LeaseExpired",
    "LeaseRefused",
    "NotDurable",
    "Queue",
    "QueueCounts",
    "Registry",
    "SchedulerError",
    "StaleToken",
    "UnknownTask",
]
