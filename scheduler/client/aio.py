"""The asyncio twin of Queue: the same operations (scheduler.operations.ops), driven with awaits."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import redis.asyncio as aredis

from scheduler.client.enqueue_flights import queue_batcher
from scheduler.client.result_waiting import wait_async
from scheduler.client.schedule_home import check_schedule_home_async
from scheduler.core import loop_guard, queue_index
from scheduler.core.backoff import Backoff
from scheduler.core.client_kind import AsyncClient, Unpicklable, check_client
from scheduler.core.connection import connect_async
from scheduler.core.errors import not_utf8
from scheduler.core.keys import QueueKeys
from scheduler.core.limits import DEFAULT_LEASE_MS
from scheduler.core.models import ClaimBatch, FailOutcome, Job, JobSpec, JobState, QueueCounts
from scheduler.core.scripts import Scripts, run_one_async
from scheduler.operations.ops import Op, Ops, Request, Settings
from scheduler.schedules.recurring import Schedule

T = TypeVar("T")


class AsyncQueue(Unpicklable):
    """One named queue on a redis.asyncio connection. See Queue for the meaning of each call."""

    def __init__(
        self,
        client: AsyncClient,
        name: str = "default",
        *,
        result_ttl_ms: int = Settings.result_ttl_ms,
        max_payload_bytes: int = Settings.max_payload_bytes,
        wait_replicas: int = 0,
        wait_timeout_ms: int = Settings.wait_timeout_ms,
        _clock: str = "server",
    ) -> None:
        check_client(client, "AsyncQueue", is_async=True)
        self.client = cast(aredis.Redis, client)
        self.keys = QueueKeys(name)
        settings = Settings(result_ttl_ms, max_payload_bytes, wait_replicas, wait_timeout_ms)
        self.ops = Ops(self.keys, settings)
        self._scripts = Scripts(clock=_clock)
        self._script_keys = self.keys.script_keys()
        self._index = queue_index.SharedAdd(client, (self.keys.queue,))  # core/queue_index.py
        self._guard = loop_guard.Guard(client, "AsyncQueue")
        self._batcher = queue_batcher(self)  # client/enqueue_batcher.py

    @classmethod
    def from_url(cls, url: str, name: str = "default", **kwargs: Any) -> AsyncQueue:
        """Connect to `url` and open the queue `name` on it.

        Args:
            url: `redis://`, `rediss://` (TLS) or `unix://`; a Redis Cluster as
                `redis+cluster://host:port,host:port/` (or `?cluster=1`; docs/cluster.md);
                user and password in the URL for AUTH / ACL users. The connection decodes
                replies (`decode_responses=True`). A bad URL raises BadArgument.
            name: the queue's name (its keys are prefixed with it).
            **kwargs: the keyword arguments of the constructor (`result_ttl_ms`,
                `max_payload_bytes`, `wait_replicas`, `wait_timeout_ms`).

        Returns:
            The queue on a new connection (the caller closes it). Always a plain queue: the
            partition layout is not read (no extra round trip); for a name that may be a
            partitioned queue use `scheduler.open_queue_async` (client/partitioned_aio.py)."""
        return cls(connect_async(url, default_retry=True), name, **kwargs)

    @property
    def name(self) -> str:
        """The queue's name, as given at construction."""
        return self.keys.queue

    async def _run(self, op: Op[T]) -> T:
        """Drive `op`. An error is thrown back into the operation, so it can decide (claim
        keeps the jobs it leased when a follow-up step fails); uncaught, it propagates from
        here. The calling task (`watch`): redis-py sends inside asyncio.wait_for, which on
        Python 3.11 drops a cancel landing as the send completes (a reconnect's handshake, a
        payload over 64 KiB): the call ran on and returned, and a cancelled producer loop kept
        enqueueing (asyncio.run's one shutdown cancel lost); result() ran on to its timeout_s.
        A cancel asked meanwhile is raised here."""
        self._guard()  # its loop and process (core/loop_guard.py)
        watch = asyncio.current_task()
        asked = watch.cancelling() if watch is not None else 0
        try:
            req = next(op)
            while True:
                try:
                    reply = await self._execute(req)
                except Exception as exc:
                    req = op.throw(exc)
                else:
                    if watch is not None and watch.cancelling() > asked:
                        op.close()
                        raise asyncio.CancelledError
                    req = op.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _execute(self, req: Request) -> Any:
        """The one driver (scheduler.core.scripts): NOSCRIPT reload-and-resend, error
        translation."""
        try:
            return await run_one_async(self.client, self._scripts, self._script_keys, req)
        except UnicodeDecodeError as exc:  # the caller's client decodes strictly
            raise not_utf8(self.keys.queue, exc) from None

    async def preload(self) -> None:
        """SCRIPT LOAD every Lua transition, so that a broken script fails here, at start-up.

        Optional: a call whose script is not loaded yet loads it on first use."""
        self._guard()  # as _run: a lifespan's first call, often (core/loop_guard.py)
        for _, text in self._scripts.preload_commands():
            await self.client.script_load(text)

    async def aclose(self) -> None:
        """Close the underlying redis.asyncio connection (`async with` the queue too); in a
        process forked after its first use, nothing: the connections are the parent's."""
        if not loop_guard.inherited(self.client):
            self._guard()  # a closed loop's connections dropped first: closing them needs it
            await self.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def enqueue(
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
        start_within_ms: int | None = None,
        key_ttl_ms: int | None = None,
        debounce: bool = False,
    ) -> str:
        """Accept a job; returns its id.

        Concurrent calls share script calls: one made while two of this queue's are in
        flight waits for one of them and goes out with every call waiting then, in one
        round trip (client/enqueue_batcher.py). Each caller gets its own job's answer, as
        alone; a lone or sequential caller sends at once.

        Args:
            task: the handler's name, 1-200 characters of `[A-Za-z0-9_.:/-]`.
            payload: any JSON-serialisable value, at most `max_payload_bytes` encoded
                (default 512 KiB). A typed task's dataclass or pydantic instance is refused
                here (InvalidPayload): enqueue it with the task's handle, which checks it.
            delay_ms: run no earlier than this many ms from the Redis server's clock, in
                [0, 3650 days]. Give `delay_ms` or `run_at`, not both; neither means now.
            run_at: an aware datetime in 1970..2200 UTC; a past one means due now.
            max_attempts: attempts before the job is parked as dead, in [1, 1,000,000].
            backoff: the retry delays after a failure (default `Backoff()`).
            key: an idempotency key: a second call with the same key (until `key_ttl_ms`
                past the first job's run time) returns the first job's id and enqueues
                nothing, even once the first job has run.
            jitter_ms: spread the run time by a random [0, jitter_ms] (same range as delay_ms).
            timeout_ms: how long one attempt may run before the worker stops it, in
                [0, 7 days]; 0 = none of its own (the task's `timeout_s`
                applies, else none).
            job_id: choose the id yourself (re-sending the same id is idempotent; not one
                starting `schedule:`, the runs of recurring schedules).
            result_ttl_ms: how long this job's outcome is kept once done, in [1 ms, 366 days]
                (over the task's and the worker's setting; default: theirs, else 1 h).
            keep_payload: keep the payload (and spec) with the outcome; by default a done
                job keeps only its state, result, finished_ms, attempts and task.
            priority: 0..9, higher claimed first among due jobs (default 0, the lowest); a job
                due for longer than `priority_aging_ms` (60 s) goes ahead of every priority
                (docs/flow-control.md).
            concurrency_key: 1-200 of `[A-Za-z0-9_.:/-]`, given with `concurrency_limit`.
            concurrency_limit: at most this many (1..10,000) jobs of `concurrency_key` leased
                at once across all workers; the others wait, still due.
            rate_limit: 'N/window' ('10/1s', '100/m') or (N, window_ms): at most N claims of
                `rate_key` in any window of that length, on the server clock.
            rate_key: what the rate limit counts (default: the task name).
            after: ids of jobs of this queue (up to 100) this one waits for: it runs once all
                are done, and is parked as dead if one ends dead or cancelled.
            start_within_ms: start it within this many ms of its run time, in [1 ms, 3650
                days], or not at all: no attempt (a retry, a lapsed lease's rerun) starts
                after run time + this; the job is parked as dead ('start deadline passed')
                instead. A reschedule moves the deadline with the run time; a requeue from
                dead drops it (README "Using it").
            key_ttl_ms: how long `key` is held past the first job's run time, in [1 ms,
                366 days] (default 24 h): a throttle window, as BullMQ's deduplication ttl.
            debounce: with `key`: while no attempt of the job the key names has started
                (never claimed, or given back unstarted), this call replaces it (payload, run
                time, options; same id) instead of being answered with it; once one has, this
                call's job is new and the key names it. No flow options (priority,
                concurrency, rate, after).

        Returns:
            The job's id.

        Raises:
            BadArgument: an argument is out of range or malformed; nothing was written.
            InvalidPayload: the payload is not JSON-serialisable or too large.
            NotDurable: `wait_replicas` was set and fewer replicas acknowledged in time
                (the job is accepted on the primary; its id is on the error)."""
        spec = JobSpec(
            task, payload, delay_ms, run_at, max_attempts, backoff, key, jitter_ms, timeout_ms,
            job_id, result_ttl_ms, keep_payload, priority, concurrency_key, concurrency_limit,
            rate_limit, rate_key, after, start_within_ms, key_ttl_ms, debounce,
        )  # fmt: skip
        # Concurrent callers share script calls (client/enqueue_batcher.py).
        fields = self.ops.batchable(spec)
        if fields is None:  # alone, in order with the batcher's calls
            op = self.ops.enqueue_spec(spec)
            return await self._write(self._batcher.alone([spec], lambda _: self._run(op)))
        return await self._write(self._batcher.enqueue(fields))

    async def enqueue_many(self, specs: Iterable[JobSpec], *, batch_size: int = 1000) -> list[str]:
        """Accept many jobs, one round trip per batch.

        Every job is checked before any batch is sent: one bad spec refuses the whole call.

        Args:
            specs: the jobs (see `JobSpec`; its fields are `enqueue`'s arguments).
            batch_size: jobs per script call, in [1, 10,000]; calls take 1,000 at most.

        Returns:
            The ids, in the order of `specs`.

        Raises:
            BadArgument: a spec or `batch_size` is refused; nothing was written (a parent
                refused by the server, missing or its key's job gone, refuses its batch only:
                other batches of the call may be written, see docs/flow-control.md).
            InvalidPayload: a payload is not JSON-serialisable or too large.
            NotDurable: as for `enqueue`; `job_ids` holds every id of the call."""
        run = self._batcher.alone(specs, lambda s: self._run(self.ops.enqueue_many(s, batch_size)))
        return await self._write(run)

    async def _write(self, call: Coroutine[Any, Any, T]) -> T:
        """A producer's call; the queue's name goes into the queue index once one wrote
        (core/queue_index.py): a call refused before writing adds nothing."""
        self._guard.before(call)  # ahead of the enqueue batcher, whose state is its loop's
        try:
            got = await call
        except Exception as exc:
            if await queue_index.after_call_async(self.client, (self.keys.queue,), exc):
                await self._index()  # already added: notes it, no second SADD
            raise
        await self._index()
        return got

    async def claim(
        self,
        worker_id: str,
        *,
        limit: int = 100,
        lease_ms: int = DEFAULT_LEASE_MS,
        reap_limit: int = 100,
        nonce: str | None = None,
    ) -> ClaimBatch:
        """Lease up to `limit` due jobs to `worker_id` (the manual API; `Worker` calls this).

        Each claimed job carries a fencing token: give it to `heartbeat`, `complete`, `fail`
        and `release`. A result carrying an older token is refused (`StaleToken`). The same
        call first reaps up to `reap_limit` lapsed leases (retried, or dead when out of
        attempts) and counts the attempt.

        Args:
            worker_id: who holds the leases (shown by `get_job` and the CLI).
            limit: most jobs to lease, in [0, 1,000].
            lease_ms: how long the leases last unless extended by `heartbeat`, in [1 ms, 1 day]
                (default 30 s, as `heartbeat`'s).
            reap_limit: most lapsed leases to reap on this call, in [0, 10,000]; the
                script reaps 500 at most (the rest on the next calls).
            nonce: give the same nonce again when re-sending a call whose answer was lost:
                the server then returns that call's jobs instead of leasing more (default: fresh).

        Returns:
            A `ClaimBatch`: `now_ms` (server clock), `next_ms` (earliest time anything may
            become claimable, -1 when the queue is empty), `jobs` (`ClaimedJob`s with `id`,
            `token`, `task`, `payload()`, `attempts`...) and `unreadable` ((id, token, reason) of
            leased jobs whose fields could not be decoded: fail them non-retryably).

        Raises:
            BadArgument: an argument is out of range; nothing was leased."""
        return await self._run(self.ops.claim(
            worker_id, limit=limit, lease_ms=lease_ms, reap_limit=reap_limit, nonce=nonce
        ))  # fmt: skip

    async def heartbeat(
        self, leases: Sequence[tuple[str, str]], *, lease_ms: int = DEFAULT_LEASE_MS
    ) -> tuple[int, dict[str, str]]:
        """Extend the leases the caller still holds, many in one call.

        Args:
            leases: (job_id, token) pairs from `claim`.
            lease_ms: the new lease length from the server's now, in [1 ms, 1 day] (default
                30 s, as `claim`'s: a loop that gives neither keeps one lease length).

        Returns:
            `(lease_until_ms, {job_id: status})`. `lease_until_ms` is the server time the held
            leases now last until. Status per job: `'held'` (extended), `'expired'` (the lease
            had lapsed: stop working on it), `'stale'` (another claim holds the job, or
            this lapsed lease was reaped),
            `'cancelled'` (cancelled: stop), `'missing'` (no such job, or already settled).
            Refusals are statuses here, not exceptions.

        Raises:
            BadArgument: `lease_ms` out of range; nothing was extended."""
        return await self._run(self.ops.heartbeat(leases, lease_ms=lease_ms))

    async def set_progress(self, job_id: str, token: str, progress: Any) -> str:
        """Record how far a leased job has got (a worker does it for `ctx.set_progress`).

        Args:
            job_id: the leased job's id, from `claim`.
            token: its lease's token, from `claim`.
            progress: any JSON value, at most 4,096 bytes encoded (e.g. `{"done": 40,
                "of": 100}`); `get_job(...).progress` reads it back.

        Returns:
            `'held'` (written) or, writing nothing, the refusal as `heartbeat` names it:
            `'expired'`, `'stale'`, `'cancelled'` or `'missing'`.

        Raises:
            InvalidPayload: not JSON-serialisable, or too large; nothing was written."""
        return (await self._run(self.ops.progress([(job_id, token, progress)])))[job_id]

    async def complete(self, job_id: str, token: str, result: Any = None) -> None:
        """Record the success of one leased job and store its result.

        Args:
            job_id: the job's id.
            token: the token its `claim` gave.
            result: a JSON-serialisable value kept with the record for `result_ttl_ms`.

        Returns:
            None. A re-sent call with the same token succeeds again (idempotent).

        Raises:
            StaleToken: another claim holds the job (or this lease lapsed and was reaped).
            JobCancelled: the job was cancelled while held.
            JobNotFound: no such job.
            InvalidPayload: the result is not JSON-serialisable or too large."""
        await self._run(self.ops.complete(job_id, token, result))

    async def complete_many(self, items: Sequence[tuple[str, str, Any]]) -> list[str]:
        """Record the success of many leased jobs in one call.

        Args:
            items: (job_id, token, result) triples.

        Returns:
            One status per item, in order: `'done'` | `'stale'` | `'cancelled'` | `'missing'`
            (refusals are statuses here, not exceptions).

        Raises:
            InvalidPayload: a result is not JSON-serialisable or too large; nothing written."""
        return await self._run(self.ops.complete_many(items))

    async def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | tuple[str, str, str],
        *,
        retryable: bool = True,
        delay_ms: int | None = None,
    ) -> FailOutcome:
        """Record a failed attempt: the job is retried after its backoff, or parked as dead.

        Args:
            job_id: the job's id.
            token: the token its `claim` gave.
            error: the exception (its type, message and traceback are stored), or a
                (type, message, traceback) tuple of strings.
            retryable: False parks the job at once, whatever attempts are left.
            delay_ms: retry after this delay instead of the job's backoff, in [0, 3650 days].

        Returns:
            A `FailOutcome`: `status` `'retry'` with `run_at_ms` (server ms of the next attempt),
            or `'dead'` with `dead_reason`. A re-sent call with the same token answers the same,
            except when the queue's dead retention removed the parked job at once (max_count
            0): a re-sent call then raises `JobNotFound`.

        Raises:
            StaleToken: another claim holds the job.
            JobCancelled: the job was cancelled while held.
            JobNotFound: no such job.
            BadArgument: `delay_ms` out of range; nothing was changed."""
        op = self.ops.fail(job_id, token, error, retryable=retryable, delay_ms=delay_ms)
        return await self._run(op)

    async def release(self, leases: Sequence[tuple[str, str]]) -> list[str]:
        """Give leased jobs back without spending their attempt (e.g. on a graceful shutdown).

        The jobs are due again at once.

        Args:
            leases: (job_id, token) pairs from `claim`.

        Returns:
            One status per pair, in order: `'released'` | `'stale'` | `'cancelled'` |
            `'missing'`. A re-sent call answers `'released'` again."""
        return await self._run(self.ops.release(leases))

    async def reschedule(
        self, job_id: str, *, delay_ms: int | None = None, run_at: datetime | None = None
    ) -> str:
        """Queue.reschedule for asyncio: move a waiting job's run time.

        Args:
            job_id: the job's id.
            delay_ms: the new run time, this many ms from the Redis server's clock, in
                [0, 3650 days] (0: now).
            run_at: or an aware datetime in 1970..2200 UTC (a past one: due now). Give
                exactly one of the two.

        Returns:
            `'rescheduled'`, or why it did not move (nothing changed): `'leased'` (running),
            `'done'`, `'dead'`, `'cancelled'`, `'held'` (set aside by flow control: a key or
            rate limit, or parents not done; it runs when let go), `'schedule'` (a schedule's
            pending run, for its slot: redefine or pause the schedule instead), `'moving'`
            (being moved to another queue by `scheduler queue move`: reschedule it there once
            moved).

        Raises:
            JobNotFound: no such job (or its record expired).
            BadArgument: a malformed id, both or neither time given, a time out of range."""
        return await self._run(self.ops.reschedule(job_id, delay_ms=delay_ms, run_at=run_at))

    async def cancel(self, job_id: str) -> str:
        """Cancel a waiting or leased job; a worker holding it is refused its result.

        Args:
            job_id: the job's id.

        Returns:
            The state before the call: `'due'` (run time reached), `'scheduled'` (run time
            later), `'held'` (set aside by flow control: parents not done, a concurrency key
            full, a rate window) or `'leased'` (now cancelled), or `'done'`, `'dead'`,
            `'cancelled'` (unchanged). A re-sent call answers `'cancelled'`. Earlier versions
            answered `'due'` for every waiting job: a caller testing it tests the three.

        Raises:
            JobNotFound: no such job (or its record expired).
            BadArgument: a malformed id."""
        return await self._run(self.ops.cancel(job_id))

    async def get_job(self, job_id: str) -> Job:
        """Read one job's record.

        Args:
            job_id: the job's id.

        Returns:
            The `Job`; a waiting job reads as HELD while flow control sets it aside
            (parents not done, a concurrency key full, a rate window; earlier versions read
            DUE or SCHEDULED), as MOVING while `scheduler queue move` moves it to another
            queue, else SCHEDULED or DUE by the server's clock.

        Raises:
            JobNotFound: no such job (or its record expired after `result_ttl_ms`).
            BadArgument: a malformed id."""
        return await self._run(self.ops.get_job(job_id))

    async def status(self, job_id: str) -> JobState:
        """One job's state: HELD for a waiting job set aside by flow control (parents not done,
        a concurrency key full, a rate window; whatever its run_at, as `list_jobs('held')`
        lists it; earlier versions answered DUE or SCHEDULED), else SCHEDULED for a waiting job
        whose run_at is after the server's now, DUE from then; MOVING for a waiting job
        `scheduler queue move` is moving to another queue (for a moment, or until an
        interrupted move is rerun; earlier versions raised BadArgument or answered DUE); then
        LEASED, DONE, DEAD or CANCELLED.

        Args:
            job_id: the job's id.

        Returns:
            The `JobState`.

        Raises:
            JobNotFound: no such job (or its record expired).
            BadArgument: a malformed id, or a stored state this version cannot read."""
        return await self._run(self.ops.status(job_id))

    async def result(self, job_id: str, *, timeout_s: float) -> Any:
        """Queue.result for asyncio: wait for the job's outcome and return the handler's result.

        Blocks on a wake-up that complete, fail (when it parks the job) and cancel push, in
        slices of at most 1 s (half the client's socket_timeout when that is shorter),
        re-checking the job's state between them; a dropped connection is retried until
        timeout_s. The waits of one client share: one BLMOVE per job, and at most half its
        pool's connections at once (waiters beyond them wait for one), so they never starve
        its other calls.

        Args:
            job_id: the job's id.
            timeout_s: how long to wait, in seconds (0 < timeout_s <= 86400).

        Returns:
            The result the handler returned (None if it returned nothing).

        Raises:
            JobDead: the job was parked; `error_type` / `error_message` carry its last error.
            JobCancelled: the job was cancelled.
            JobNotFound: no such job (or its record expired).
            ResultTimeout: not finished within timeout_s (a TimeoutError).
            BadArgument: a malformed job_id or timeout_s.
            UnreadableRecord: the stored result is not JSON (edited by hand).
        """
        return await wait_async(self, job_id, timeout_s)

    async def counts(self) -> QueueCounts:
        """How many jobs are in each place, by the server's clock.

        Returns:
            A `QueueCounts`: `now_ms`, `due`, `scheduled`, `leased`, `dead`, `oldest_due_ms`
            (None when nothing is due), `lapsed` (leases past their end, not yet reaped),
            `moving` (waiting jobs a queue move took out of due)."""
        return await self._run(self.ops.counts())

    async def list_jobs(self, state: str, *, offset: int = 0, limit: int = 50) -> list[Job]:
        """One page of the jobs in one place.

        Args:
            state: `'due'`, `'scheduled'`, `'held'` (due, set aside by flow control: counted
                in `counts().due`), `'leased'` (oldest first), `'dead'` (newest first) or
                `'finished'` (done or cancelled, while its record is kept: latest to expire
                first, the order they finished in among jobs kept equally long).
            offset: jobs to skip, >= 0.
            limit: page size, >= 1.

        Returns:
            The `Job`s (a job that finished between the two reads is left out, and one whose
            keys were edited by hand into another type: `scheduler doctor` names it).

        Raises:
            BadArgument: an unknown state or a bad offset/limit."""
        return await self._run(self.ops.list_jobs(state, offset=offset, limit=limit))

    async def dead_ids(
        self,
        *,
        task: str | None = None,
        error_type: str | None = None,
        older_than_ms: int | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[str]:
        """The ids of dead jobs (newest first) matching every filter given (all when none is),
        one page of them as `list_jobs('dead')` pages: the read stops at `offset + limit`
        matches, so a page of a long dead list is read without the rest of it.

        Args:
            task: only jobs of this task.
            error_type: only jobs whose last error has this type name (e.g. `'ValueError'`).
            older_than_ms: only jobs dead for at least this many ms (server clock).
            offset: matches to skip, >= 0 (a job dying meanwhile shifts later pages by one).
            limit: most ids to return, >= 0; None (the default): every match.

        Returns:
            The matching ids, newest first.

        Raises:
            BadArgument: a bad offset, limit or older_than_ms (nothing is read)."""
        filters = {"task": task, "error_type": error_type, "older_than_ms": older_than_ms}
        return await self._run(self.ops.dead_ids(offset=offset, limit=limit, **filters))

    async def requeue_dead(self, ids: Sequence[str]) -> int:
        """Move dead jobs back to due with a fresh attempt budget.

        Args:
            ids: dead job ids (others are skipped).

        Returns:
            How many this call moved. A call its client re-sent after the reply was lost
            (redis-py's Retry) counts only what the re-send moved: the jobs the lost send
            moved are due all the same (`status` says so), never moved twice."""
        return await self._run(self.ops.requeue_dead(ids))

    async def purge_dead(self, ids: Sequence[str]) -> int:
        """Delete dead jobs for good.

        Args:
            ids: dead job ids (others are skipped).

        Returns:
            How many this call deleted (a re-sent call: what the re-send deleted, as
            requeue_dead counts)."""
        return await self._run(self.ops.purge_dead(ids))

    async def set_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> None:
        """Opt-in retention of this queue's dead letters (off by default: every one is kept).

        Applied as jobs die and by claims: at most 100 of the oldest are deleted per park or
        claim call, counted in stats as `dead_trimmed`.

        Args:
            max_age_ms: delete dead letters older than this, in [1, 2200-01-01 as ms]; None: no
                age limit.
            max_count: keep at most this many, >= 0; None: no count limit.

        Raises:
            BadArgument: a value out of range; nothing was changed."""
        await self._run(self.ops.set_dead_retention(max_age_ms, max_count))

    async def set_priority_aging(self, priority_aging_ms: int | None) -> None:
        """Queue.set_priority_aging for asyncio: how long a due job may be overtaken by
        higher-priority work, in [0, 3650 days as ms]; None: the default, 60,000 ms.

        Raises:
            BadArgument: a value out of range, or this is a partitioned queue's own name (set
                it on the `AsyncPartitionedQueue`); nothing was changed."""
        await self._run(self.ops.set_priority_aging(priority_aging_ms))

    # The whole queue -------------------------------------------------------------------------
    async def pause(self) -> str:
        """Queue.pause for asyncio: no worker claims this queue's jobs until `resume()`.

        Returns:
            `'paused'` | `'already'` (it was paused: nothing changed)."""
        return await self._run(self.ops.pause())

    async def resume(self) -> str:
        """Queue.resume for asyncio: claims lease again, idle workers are woken at once.

        Returns:
            `'resumed'` | `'active'` (it was not paused: nothing changed)."""
        return await self._run(self.ops.resume())

    # Recurring schedules (scheduler/schedules/recurring.py) ---------------------------------
    async def schedule(
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
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        rate_key: str | None = None,
        start_within_ms: int | None = None,
    ) -> str:
        """Create or redefine the recurring schedule `name` (idempotent: the same definition
        again writes nothing, so calling it at every start-up is safe).

        Exactly one occurrence of a schedule is pending at any time.

        Args:
            name: 1-64 characters of `[A-Za-z0-9_.-]`.
            task: the handler's name (as for `enqueue`).
            payload: JSON-serialisable, given to every occurrence.
            cron: 5 fields, or 6 with seconds, matched in time zone `tz` (default UTC).
                Give `cron` or `every_ms`, not both.
            every_ms: an epoch-aligned interval, in [1 ms, 3650 days].
            tz: an IANA time zone name for `cron`.
            jitter_ms: a fixed per-schedule offset in [0, jitter_ms] spreads "on the hour" load.
            misfire: what to do with runs missed while nothing ran: `'skip'`, `'run_once'` or
                `'catch_up:N'`.
            max_attempts: as for `enqueue`.
            backoff: as for `enqueue`.
            timeout_ms: as for `enqueue`.
            priority: as for `enqueue`, given to every occurrence (docs/flow-control.md).
            concurrency_key: as for `enqueue`, with `concurrency_limit`: at most that many
                occurrences (and jobs) of the key leased at once; a next one waits, held.
            concurrency_limit: as for `enqueue`.
            rate_limit: as for `enqueue`: at most N claims of `rate_key` per window.
            rate_key: as for `enqueue` (default: the task name).
            start_within_ms: as for `enqueue`, for every occurrence: it starts within this
                many ms of its run time (its slot + jitter offset; a run now's: now), in
                [1 ms, 3650 days], or not at all: parked as dead ('start deadline passed'),
                and the schedule's next run is armed as usual (docs/guide/schedules.md).
                None (the default): no start deadline. A changed value is a changed
                definition; a run already due and kept by a redefinition keeps its own.

        Returns:
            `'created'` | `'updated'` | `'unchanged'` | `'repaired'`.

        Raises:
            BadArgument: a malformed name, cron, time zone, flow option or argument, or (on a
                partition's own queue, `<name>.p<k>`) a name its partitioned queue routes to
                another partition; nothing was written.
            InvalidPayload: the payload is not JSON-serialisable or too large."""
        await check_schedule_home_async(self.client, self.keys.queue, name)  # as Queue.schedule
        return await self._write(self._run(self.ops.schedule(
            name, task, payload, cron=cron, every_ms=every_ms, tz=tz, jitter_ms=jitter_ms,
            misfire=misfire, max_attempts=max_attempts, backoff=backoff, timeout_ms=timeout_ms,
            priority=priority, concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit, rate_limit=rate_limit, rate_key=rate_key,
            start_within_ms=start_within_ms,
        )))  # fmt: skip

    async def get_schedule(self, name: str) -> Schedule:
        """Read one schedule's definition and state.

        Args:
            name: the schedule's name.

        Returns:
            The `Schedule`.

        Raises:
            BadArgument: a malformed name.
            ScheduleNotFound: no schedule by that name (a BadArgument)."""
        return await self._run(self.ops.get_schedule(name))

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule of this queue, sorted by name.

        Returns:
            The `Schedule`s (a hand-edited, unreadable definition is left out)."""
        return await self._run(self.ops.list_schedules())

    async def pause_schedule(self, name: str) -> str:
        """Pause a schedule: withdraw its pending occurrence.

        Args:
            name: the schedule's name.

        Returns:
            `'paused'` | `'already'` (was paused) | `'missing'`.

        Raises:
            BadArgument: its key was made another type by hand (remove_schedule clears it);
                nothing changed."""
        return await self._run(self.ops.pause_schedule(name))

    async def resume_schedule(self, name: str) -> str:
        """Resume a paused schedule at its next future slot.

        Args:
            name: the schedule's name.

        Returns:
            `'resumed'` | `'active'` (was not paused) | `'missing'` | `'stale'` (the
            definition kept changing while it resumed: five tries).

        Raises:
            BadArgument: the stored definition cannot be read (edited by hand: a field
                missing, a bad cron or time zone, a key of another type); nothing changed.
                Define it again with `schedule(...)`."""
        return await self._run(self.ops.resume_schedule(name))

    async def remove_schedule(self, name: str) -> str:
        """Delete a schedule and its pending occurrence.

        Args:
            name: the schedule's name.

        Returns:
            `'removed'` | `'missing'`."""
        return await self._run(self.ops.remove_schedule(name))

    async def run_schedule_now(self, name: str, *, job_id: str | None = None) -> str:
        """Run a schedule once now, beside its own runs (an operator's "run now"): one job due
        now with the schedule's task, payload and job options (max_attempts, backoff,
        timeout_ms, priority, concurrency and rate limits), its `schedule` field naming the
        schedule as its runs' do (`ClaimedJob.schedule`, `Job.fields`). The schedule is not
        changed: its next run, its paused state and what it remembers stay (a paused schedule
        runs now too, and stays paused). The job is one of its own: pausing or removing the
        schedule leaves it (cancel it by id). Read and written in one atomic script: a
        concurrent remove or redefinition comes wholly before or after it.

        Args:
            name: the schedule's name.
            job_id: the new job's id (default: a new one); a job already there under this id
                is left as it is and its id returned (a re-sent call creates nothing twice).

        Returns:
            The job's id.

        Raises:
            ScheduleNotFound: no schedule by that name; nothing was written.
            BadArgument: a malformed name or job_id, or a stored definition that cannot be
                read (edited by hand: define it again); nothing was written."""
        return await self._run(self.ops.run_schedule_now(name, job_id))
