"""Producing: enqueue one job or many (lua/enqueue.lua)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import NotDurable
from scheduler.core.models import JobSpec
from scheduler.operations.requests import Op, OpsBase, Script, ScriptPipeline


class ProducingOps(OpsBase):
    """Enqueueing; documented for users on Queue.enqueue / Queue.enqueue_many."""

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
        result_ttl_ms: int | None = None,
        keep_payload: bool = False,
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        rate_key: str | None = None,
        after: Sequence[str] | None = None,
    ) -> Op[str]:
        """One job: `enqueue_many` of one JobSpec; returns its id."""
        spec = JobSpec(
            task,
            payload,
            delay_ms,
            run_at,
            max_attempts,
            backoff,
            key,
            jitter_ms,
            timeout_ms,
            job_id,
            result_ttl_ms,
            keep_payload,
            priority,
            concurrency_key,
            concurrency_limit,
            rate_limit,
            rate_key,
            after,
        )
        if self.settings.wait_replicas > 0:
            ids = yield from self.enqueue_many([spec])
            return ids[0]
        # One job, one script call: not through enqueue_many's batching (issue 16: ~2 us).
        args = codec.enqueue_args([spec], self.settings.max_payload_bytes)
        return codec.parse_enqueue((yield Script("enqueue", args)), args)[0]

    def enqueue_many(self, specs: Iterable[JobSpec], batch_size: int = 1000) -> Op[list[str]]:
        """Ids in the order of `specs`. Every spec is checked before any batch is sent
        (BadArgument / InvalidPayload refuse the whole call); NotDurable when the asked
        replicas did not acknowledge in time."""
        specs = list(specs)
        codec.check_int(batch_size, "batch_size")
        # Check every job before sending any batch: a bad job refuses the whole call.
        batches = [
            codec.enqueue_args(specs[i : i + batch_size], self.settings.max_payload_bytes)
            for i in range(0, len(specs), batch_size)
        ]
        wait = None
        if self.settings.wait_replicas > 0:
            wait = (self.settings.wait_replicas, self.settings.wait_timeout_ms)
        if len(batches) == 1 and wait is None:
            replies = [(yield Script("enqueue", batches[0]))]
        else:
            # All batches in one pipeline: Redis runs one while the next is still arriving.
            replies = yield ScriptPipeline([Script("enqueue", a) for a in batches], wait)
        ids: list[str] = []
        for args, reply in zip(batches, replies, strict=False):
            ids.extend(codec.parse_enqueue(reply, args))
        if wait is not None and int(replies[-1]) < wait[0]:
            raise NotDurable(ids, int(replies[-1]), wait[0])
        return ids
