"""The blocking client web apps use: enqueue, inspect, cancel, dead-letter operations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import redis

from scheduler.core.backoff import Backoff
from scheduler.core.keys import QueueKeys
from scheduler.core.models import ClaimBatch, FailOutcome, Job, JobSpec, JobState, QueueCounts
from scheduler.core.scripts import Scripts, run_sync
from scheduler.operations.ops import Op, Ops, Request, Settings
from scheduler.schedules.recurring import Schedule

T = TypeVar("T")


class Queue:
    """One named queue on one Redis (or Redis Cluster) connection.

    Create it from a URL (`redis://`, `rediss://` for TLS, `unix://`; user and password in the
    URL for AUTH / ACL users) or from an existing redis-py client."""

    def __init__(
        self,
        client: redis.Redis,
        name: str = "default",
        *,
        result_ttl_ms: int = Settings.result_ttl_ms,
        max_payload_bytes: int = Settings.max_payload_bytes,
        wait_replicas: int = 0,
        wait_timeout_ms: int = Settings.wait_timeout_ms,
        _clock: str = "server",
    ) -> None:
        self.client = client
        self.keys = QueueKeys(name)
        self.ops = Ops(
            self.keys, Settings(result_ttl_ms, max_payload_bytes, wait_replicas, wait_timeout_ms)
        )
        self._scripts = Scripts(clock=_clock)
        self._script_keys = self.keys.script_keys()

    @classmethod
    def from_url(cls, url: str, name: str = "default", **kwargs: Any) -> Queue:
        return cls(redis.Redis.from_url(url, decode_responses=True), name, **kwargs)

    @property
    def name(self) -> str:
        return self.keys.queue

    def _run(self, op: Op[T]) -> T:
        # An error is thrown back into the operation, so it can decide (claim keeps the jobs
        # it leased when a follow-up step fails); uncaught, it propagates from here.
        try:
            req = next(op)
            while True:
                try:
                    reply = self._execute(req)
                except Exception as exc:
                    req = op.throw(exc)
                else:
                    req = op.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _execute(self, req: Request) -> Any:
        # The one driver (scheduler.core.scripts): NOSCRIPT reload-and-resend, error translation.
        (reply,) = run_sync(self.client, self._scripts.drive([(self._script_keys, req)]))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def preload(self) -> None:
        """SCRIPT LOAD every transition (compiles them: a broken script fails here)."""
        for _, text in self._scripts.preload_commands():
            self.client.script_load(text)

    # Producers ------------------------------------------------------------------------------
    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        delay_ms: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        key: str | None = None,
        jitter_ms: int = 0,
        timeout_ms: int = 0,
        job_id: str | None = None,
    ) -> str:
        """Accept a job; returns its id. `delay_ms` counts from the Redis server's clock,
        `run_at` is an aware datetime; `jitter_ms` spreads run_at by up to that much; `key`
        makes the call idempotent (a second call with the same key returns the first id)."""
        return self._run(
            self.ops.enqueue(
                task,
                payload,
                delay_ms=delay_ms,
                run_at=run_at,
                max_attempts=max_attempts,
                backoff=backoff,
                key=key,
                jitter_ms=jitter_ms,
                timeout_ms=timeout_ms,
                job_id=job_id,
            )
        )

    def enqueue_many(self, specs: Iterable[JobSpec], *, batch_size: int = 1000) -> list[str]:
        """Accept many jobs, one round trip per batch; every job is checked before any is sent."""
        return self._run(self.ops.enqueue_many(specs, batch_size))

    # Workers --------------------------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = 30_000,
        reap_limit: int = 100,
        nonce: str | None = None,
    ) -> ClaimBatch:
        return self._run(
            self.ops.claim(
                worker_id, limit=limit, lease_ms=lease_ms, reap_limit=reap_limit, nonce=nonce
            )
        )

    def heartbeat(
        self, leases: Sequence[tuple[str, str]], *, lease_ms: int
    ) -> tuple[int, dict[str, str]]:
        return self._run(self.ops.heartbeat(leases, lease_ms=lease_ms))

    def complete(self, job_id: str, token: str, result: Any = None) -> None:
        self._run(self.ops.complete(job_id, token, result))

    def complete_many(self, items: Sequence[tuple[str, str, Any]]) -> list[str]:
        return self._run(self.ops.complete_many(items))

    def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | tuple[str, str, str],
        *,
        retryable: bool = True,
        delay_ms: int | None = None,
    ) -> FailOutcome:
        return self._run(
            self.ops.fail(job_id, token, error, retryable=retryable, delay_ms=delay_ms)
        )

    def release(self, leases: Sequence[tuple[str, str]]) -> list[str]:
        return self._run(self.ops.release(leases))

    # Operators ------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> str:
        return self._run(self.ops.cancel(job_id))

    def get_job(self, job_id: str) -> Job:
        return self._run(self.ops.get_job(job_id))

    def status(self, job_id: str) -> JobState:
        return self._run(self.ops.status(job_id))

    def counts(self) -> QueueCounts:
        return self._run(self.ops.counts())

    def list_jobs(self, state: str, *, offset: int = 0, limit: int = 50) -> list[Job]:
        return self._run(self.ops.list_jobs(state, offset=offset, limit=limit))

    def dead_ids(
        self,
        *,
        task: str | None = None,
        error_type: str | None = None,
        older_than_ms: int | None = None,
    ) -> list[str]:
        return self._run(
            self.ops.dead_ids(task=task, error_type=error_type, older_than_ms=older_than_ms)
        )

    def requeue_dead(self, ids: Sequence[str]) -> int:
        return self._run(self.ops.requeue_dead(ids))

    def purge_dead(self, ids: Sequence[str]) -> int:
        return self._run(self.ops.purge_dead(ids))

    def set_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> None:
        """Opt-in dead-letter retention (None: no limit; off by default). See DeadLetterOps."""
        self._run(self.ops.set_dead_retention(max_age_ms, max_count))

    # Recurring schedules (scheduler/schedules/recurring.py) ---------------------------------
    def schedule(
        self,
        name: str,
        task: str,
        payload: Any = None,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        tz: str | None = None,
        jitter_ms: int = 0,
        misfire: str = "run_once",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        timeout_ms: int = 0,
    ) -> str:
        """Create or redefine the schedule `name` (idempotent: the same definition again writes
        nothing). Give `cron` (5 fields, or 6 with seconds; matched in time zone `tz`, default
        UTC) or `every_ms` (epoch-aligned interval). `jitter_ms`: a fixed per-schedule offset
        in [0, jitter_ms] spreads "on the hour" load. `misfire`: 'skip' | 'run_once' |
        'catch_up:N' for runs missed while nothing ran. Exactly one occurrence is pending at
        any time. Returns 'created' | 'updated' | 'unchanged' | 'repaired'."""
        return self._run(
            self.ops.schedule(
                name,
                task,
                payload,
                cron=cron,
                every_ms=every_ms,
                tz=tz,
                jitter_ms=jitter_ms,
                misfire=misfire,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout_ms=timeout_ms,
            )
        )

    def get_schedule(self, name: str) -> Schedule:
        return self._run(self.ops.get_schedule(name))

    def list_schedules(self) -> list[Schedule]:
        return self._run(self.ops.list_schedules())

    def pause_schedule(self, name: str) -> str:
        """Withdraw the pending occurrence; 'paused' | 'already' | 'missing'."""
        return self._run(self.ops.pause_schedule(name))

    def resume_schedule(self, name: str) -> str:
        """Restart at the next future slot; 'resumed' | 'active' | 'missing'."""
        return self._run(self.ops.resume_schedule(name))

    def remove_schedule(self, name: str) -> str:
        """Delete the schedule and its pending occurrence; 'removed' | 'missing'."""
        return self._run(self.ops.remove_schedule(name))
