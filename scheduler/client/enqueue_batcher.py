"""Concurrent AsyncQueue.enqueue calls share script calls (issue 16: a web app's handlers).

A call made while none of the queue's is in flight is sent at once, from the caller's own task,
alone: a lone or sequential producer pays nothing for this. A call made while `max_in_flight`
are in flight waits, and every call waiting when one comes back goes out as one enqueue.lua
call (up to `MAX_JOBS` jobs and `MAX_BYTES` of arguments). So concurrent callers cost one round
trip and one script prologue per batch instead of one each, and use at most `max_in_flight`
pooled connections instead of one per call (redis.asyncio's pool refuses calls past 100).

The answer a caller gets is the one it would have had alone:
- its arguments were checked by the caller (BadArgument, InvalidPayload raise there, nothing
  joins a batch);
- a batch the server refuses for one of its jobs (a missing parent, a key edited by hand) is
  sent again in halves, in order, down to one job per call for a job refused, so each caller
  gets its own job's answer and a bad job of one caller refuses no other caller's (enqueue.lua
  writes nothing when it refuses); one refused for every write (NOREPLICAS, OOM, READONLY, a
  newer version's storage: errors.refused_for_now; the user's ACL) is sent again once, a call
  per job in one pipeline, so each caller has its answer one round trip later, not ~2n (a
  re-sent job already there, which writes nothing, is answered with its id as alone);
- a connection error or timeout is raised to every caller of the batch, as it would have been
  to each (each its own copy: client/enqueue_flights.py own_error): its jobs may or may not be
  written, as for any call whose answer was lost;
- a caller cancelled while its job waits sends nothing, nor holds a call naming it (`alone`);
  one cancelled once it was sent is cancelled as a lone call would be (the job may be written);
- a job naming in `after` a job of the batch that has an idempotency key goes in a later call:
  in one, a parent whose key was taken stands for the job the key names (enqueue.lua's rename,
  for one caller's own jobs), where in turn the id names what stands under it then;
- a job naming in `after` a job of a call in flight waits until that call is answered: sent
  beside it on another connection, the server may run the child's call first and refuse it
  ('no such job') while the parent's caller is told it was written. The queue's calls that go
  alone (`alone`: a debounced job, a queue waiting for replicas, enqueue_many) keep the same
  order both ways: they wait for the calls that write their parents, and their own ids count
  as in flight while they are.
The calls in flight are counted in a `Flights` (client/enqueue_flights.py): the queue's own, or
the one an AsyncPartitionedQueue's partitions share (two per node). Jobs of a batch keep their
callers' order. A delay counts from the batch's script: never earlier than asked."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from scheduler.client.enqueue_flights import Flights, Send, SendEach, alone_across, own_error
from scheduler.core import codec
from scheduler.core.errors import NewerStorage, SchedulerError, is_permission_error, refused_for_now
from scheduler.core.limits import ENQUEUE_BYTES_PER_CALL, ENQUEUE_WORK_PER_CALL

T = TypeVar("T")

# A script runs alone on the server: a batch bounded like enqueue_many's default batch_size.
MAX_JOBS = 1000
MAX_BYTES = ENQUEUE_BYTES_PER_CALL  # UTF-8 bytes of the jobs' fields, as enqueue_many's
_IDEM, _FLOW = 8, 12  # a job's fields (codec.enqueue_fields): its key's digest, its flow


class _Waiting:
    __slots__ = ("fields", "future", "size", "work")

    def __init__(self, fields: list[str], future: asyncio.Future[str]) -> None:
        self.fields = fields
        self.future = future
        # isascii is a flag read: only a text with non-ASCII characters is encoded to count.
        self.size = sum(len(f) if f.isascii() else len(f.encode()) for f in fields)
        # The job and each parent it names ('' or its flow field's last part): the call's work.
        self.work = 1 + len(fields[_FLOW].rsplit("|", 1)[-1].split())


class EnqueueBatcher:
    """One queue's enqueue calls in flight, and the ones waiting to go out together."""

    def __init__(
        self, send: Send, send_each: SendEach | None = None, *, max_in_flight: int = 2
    ) -> None:
        self._send = send
        self._send_each = send_each  # None: a refusal of every write is halved too
        self._flights = Flights(max_in_flight)  # its own, unless shared (`share`)
        self._node: Callable[[], str] | None = None  # its calls' node, on a cluster
        self._in_flight = 0  # this queue's calls in flight
        self._waiting: deque[_Waiting] = deque()
        self._flying: dict[str, int] = {}  # ids of the jobs of the calls in flight
        self._tasks: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references
        self._settled: asyncio.Event | None = None  # set when a call comes back
        self._loop: asyncio.AbstractEventLoop | None = None

    def share(self, flights: Flights, node: Callable[[], str] | None = None) -> None:
        """Count this queue's calls in `flights` (an AsyncPartitionedQueue's partitions share
        one); `node` names the node its calls go to (a cluster's; "" when None)."""
        self._flights, self._node, self._loop = flights, node, None

    def _enter(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A queue used from a new event loop: what the old one left (closed with calls in
            # flight, their `finally` never run) must not hold this one's calls.
            self._loop, self._in_flight, self._waiting = loop, 0, deque()
            self._flying, self._settled = {}, None
            self._tasks = set()  # and the old loop's tasks (and so the loop) are not held
            self._flights.enter(loop)
        return loop

    async def enqueue(self, fields: list[str]) -> str:
        """Send one job's enqueue.lua fields (codec.enqueue_fields); returns its id."""
        loop = self._enter()
        if not self._waiting and not self._held(fields):
            node = "" if self._node is None else self._node()
            if self._flights.take(node, self):
                self._in_flight += 1
                self._fly([fields], 1)
                try:
                    return await self._alone(fields)
                finally:
                    if loop is self._loop:
                        self._in_flight -= 1
                        self._fly([fields], -1)
                        self._flights.give_back(node, loop)
                        self._start()
                        self._wake()
        future: asyncio.Future[str] = loop.create_future()
        future.add_done_callback(lambda f: self._wake() if f.cancelled() else None)  # `alone`s
        self._waiting.append(_Waiting(fields, future))
        self._start()
        return await future

    async def alone(self, specs: Any, call: Callable[[Any], Awaitable[T]]) -> T:
        """`call(specs)`, a call of the queue's that joins no batch: sent once none of the jobs
        its JobSpecs name in `after` waits here or is in flight; the ids their callers chose
        count as in flight until it is answered, so a batched child of one waits for it."""
        if isinstance(specs, Iterable) and not isinstance(specs, str | bytes | dict):
            specs = list(specs)  # read once: for the order here, then by the call
        return await alone_across([(self, specs)], lambda: call(specs))

    def _pending(self, ids: Collection[str]) -> bool:
        waits = (w.fields[0] for w in self._waiting if not w.future.done())  # not cancelled
        return any(i in self._flying for i in ids) or any(i in ids for i in waits)

    async def _until_settled(self) -> None:
        if self._settled is None:
            self._settled = asyncio.Event()
        await self._settled.wait()

    def _wake(self) -> None:
        # A call came back: the `alone` calls waiting for it look again.
        if self._settled is not None:
            self._settled.set()
            self._settled = None

    def _fly(self, jobs: list[list[str]], step: int) -> None:
        for fields in jobs:
            n = self._flying.get(fields[0], 0) + step
            if n > 0:
                self._flying[fields[0]] = n
            else:
                self._flying.pop(fields[0], None)

    def _held(self, fields: list[str]) -> bool:
        """Does this job name in `after` a job of a call in flight?"""
        return bool(self._flying) and _names_one_of(fields, self._flying.keys())

    async def _alone(self, fields: list[str]) -> str:
        args = ["1", *fields]
        return codec.parse_enqueue(await self._send(args), args)[0]

    def _start(self) -> None:
        # Each call that comes back sends what waits: never more calls in flight than its
        # Flights allows (shared by a partitioned queue's partitions).
        while self._waiting:
            if self._waiting[0].future.done():
                self._waiting.popleft()  # a cancelled caller's: not sent
                continue
            if self._held(self._waiting[0].fields):
                return  # its parent's call comes back first; callers' order is kept
            node = "" if self._node is None else self._node()
            if not self._flights.take(node, self):
                return  # its turn comes when one of the pool's calls comes back
            batch: list[_Waiting] = []
            size = work = 0
            keyed: set[str] = set()  # ids of the batch's jobs with an idempotency key
            while self._waiting and len(batch) < MAX_JOBS:
                w = self._waiting[0]
                if batch and (size + w.size > MAX_BYTES or work + w.work > ENQUEUE_WORK_PER_CALL
                              or _names_one_of(w.fields, keyed)):  # fmt: skip
                    break
                if batch and self._held(w.fields):
                    break
                batch.append(self._waiting.popleft())
                size += w.size
                work += w.work
                if w.fields[_IDEM]:
                    keyed.add(w.fields[0])
            batch = [w for w in batch if not w.future.done()]  # a cancelled caller's: not sent
            self._in_flight += 1
            self._fly([w.fields for w in batch], 1)
            flush = self._flush(batch, node, self._loop)
            task = asyncio.get_running_loop().create_task(flush)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(
        self, batch: list[_Waiting], node: str, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        try:
            await self._deliver(batch)
        except GeneratorExit:
            raise  # a task of a closed loop, collected: its futures can take no answer
        except BaseException as exc:
            # Every caller not answered yet gets it, also one whose job was not re-sent yet: a
            # lost connection as each would have had it alone (an error object of its own, so
            # what one caller writes on it reaches no other), a cancel as the loop closes.
            for w in batch:
                mine = own_error(exc) if isinstance(exc, Exception) and len(batch) > 1 else exc
                _settle(w.future, mine)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise  # else it reached its callers: left on this task, it is never retrieved
        finally:
            if loop is self._loop:  # else counted for a loop since left behind
                self._in_flight -= 1
                self._fly([w.fields for w in batch], -1)
                self._flights.give_back(node, loop)
                self._start()
                self._wake()

    async def _deliver(self, batch: list[_Waiting]) -> None:
        batch = [w for w in batch if not w.future.done()]
        if len(batch) <= 1:
            for w in batch:
                await self._answer(w)
            return
        args = [str(len(batch))]
        for w in batch:
            args.extend(w.fields)
        try:
            reply = await self._send(args)
        except (SchedulerError, ResponseError) as exc:
            # Refused, so nothing was written. Every write refused: a call per job, one pipeline.
            if self._send_each is not None and _every_write(exc):
                await self._each(batch, self._send_each)
                return
            # One job refused: each half again, in order, down to one job per call for the job
            # refused. A bad job among n costs about 2 log2(n) calls, not n.
            half = len(batch) // 2
            await self._deliver(batch[:half])
            await self._deliver(batch[half:])
            return
        for w, job_id in zip(batch, codec.parse_enqueue(reply, args), strict=True):
            if not w.future.done():
                w.future.set_result(job_id)

    async def _each(self, batch: list[_Waiting], send_each: SendEach) -> None:
        """A call per job, in one pipeline: each caller its own answer in one round trip."""
        batch = [w for w in batch if not w.future.done()]
        calls = [["1", *w.fields] for w in batch]
        for w, args, reply in zip(batch, calls, await send_each(calls), strict=True):
            try:
                if isinstance(reply, BaseException):
                    raise reply
                job_id = codec.parse_enqueue(reply, args)[0]
            except Exception as exc:
                _settle(w.future, exc)
            else:
                if not w.future.done():
                    w.future.set_result(job_id)

    async def _answer(self, w: _Waiting) -> None:
        try:
            job_id = await self._alone(w.fields)
        except Exception as exc:
            _settle(w.future, exc)
        else:
            if not w.future.done():
                w.future.set_result(job_id)


def _names_one_of(fields: list[str], ids: Collection[str]) -> bool:
    # A parent named by id whose job has a key: in one call, one whose key was taken stands
    # for the job the key names (enqueue.lua's rename, for one caller's jobs); a caller of
    # another call finds the id as it stands then. The flow field ends with the parents.
    flow = fields[_FLOW]
    return bool(ids and flow) and any(p in ids for p in flow.rsplit("|", 1)[1].split())


def _every_write(exc: Exception) -> bool:
    """A refusal of any write for now (errors.refused_for_now), of any call of this version
    (NewerStorage), or the user's ACL's (the queue's keys, or a command, not granted: every job
    of the batch alike, halving it cost 2n - 1 refused calls): not one job's."""
    return isinstance(exc, NewerStorage) or (
        isinstance(exc, ResponseError) and (refused_for_now(exc) or is_permission_error(exc))
    )


def _settle(future: asyncio.Future[str], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()  # the loop is closing: the callers are cancelled, not failed
    else:
        future.set_exception(exc)
