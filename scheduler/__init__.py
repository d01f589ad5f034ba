"""scheduler: a Redis-backed job scheduler with leases, fencing tokens, retries and dead letters."""

from scheduler.client.aio import AsyncQueue
from scheduler.client.partitioned import PartitionedQueue, PartitionsNotReached, open_queue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue, open_queue_async
from scheduler.client.partitioned_lease_plan import PartitionedClaimBatch
from scheduler.client.queue import Queue
from scheduler.core.backoff import Backoff
from scheduler.core.connection import connect, connect_async
from scheduler.core.errors import (
    BadArgument,
    CorruptKey,
    InvalidPayload,
    JobCancelled,
    JobDead,
    JobNotFound,
    JobTimeout,
    LeaseExpired,
    LeaseRefused,
    NewerStorage,
    NoReplicas,
    NotDurable,
    ResultTimeout,
    RunStopped,
    ScheduleNotFound,
    SchedulerError,
    StaleToken,
    UnknownTask,
    UnreadableRecord,
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
from scheduler.core.partitions import PartitionMismatch
from scheduler.schedules.stored import Schedule
from scheduler.worker.registry import JobContext, JobOutcome, Registry, TaskHandle
from scheduler.worker.retry_later import RetryLater

__all__ = [
    "AsyncPartitionedQueue",
    "AsyncQueue",
    "Backoff",
    "BadArgument",
    "ClaimBatch",
    "ClaimedJob",
    "CorruptKey",
    "FailOutcome",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobDead",
    "JobNotFound",
    "JobOutcome",
    "JobSpec",
    "JobState",
    "JobTimeout",
    "LeaseExpired",
    "LeaseRefused",
    "NewerStorage",
    "NoReplicas",
    "NotDurable",
    "PartitionMismatch",
    "PartitionedClaimBatch",
    "PartitionedQueue",
    "PartitionsNotReached",
    "Queue",
    "QueueCounts",
    "Registry",
    "ResultTimeout",
    "RetryLater",
    "RunStopped",
    "Schedule",
    "ScheduleNotFound",
    "SchedulerError",
    "StaleToken",
    "TaskHandle",
    "UnknownTask",
    "UnreadableRecord",
    "connect",
    "connect_async",
    "open_queue",
    "open_queue_async",
]
