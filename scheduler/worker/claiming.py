"""Claiming: one loop over the queues, batches sized to the free slots, a local due-time timer
plus wake-up pops; a claim whose answer was lost is re-sent with the same nonce."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from scheduler.core import codec
from scheduler.core.models import ClaimBatch
from scheduler.worker.alone import Alone
from scheduler.worker.core import _Deadline, _Queue, _within
from scheduler.worker.dispatch import Dispatch
from scheduler.worker.execution import RetryDelay, Running, retry_at_stop
from scheduler.worker.payload_decode import STEP_CHARS
from scheduler.worker.registry import JobContext
from scheduler.worker.reporting import Reporting
from scheduler.worker.self_stop import SelfStop
from scheduler.worker.settings import (
    _LEASE_MARGIN_S,
    _MAX_IDLE_SLEEP_S,
    CLAIM_MIN_FREE,
    PREFETCH_MAX_RUN_S,
)
from scheduler.worker.waking import Waking

_SKIP_MAX_S = 1.0


class Claiming(Alone, SelfStop, Dispatch, Reporting, Waking):
    """The claim loop and the wake-up pops (one per queue)."""

    async def _claim_loop(self) -> None:
        s = self.settings
        backoff = RetryDelay()
        # A random first queue: workers started together do not all drain one partition first.
        # Then a deficit round robin: each queue's turn is one batch; a turn cut short by the
        # free slots resumes next round with what it is owed (moving the start by one per round
        # gave each queue its batches in bursts: 2.5 batches apart, 1.26x at 12 partitions).
        rr = random.randrange(len(self.queues))
        owed = 0  # what is left of queues[rr]'s turn (0: a full batch)
        skips = self._skip_until  # WorkerCore: which queue sits out until when
        failing: dict[str, RetryDelay] = {}  # queue -> its delay while its claims fail
        due_at: dict[str, float] = {}  # queue -> its last answer's next_ms, in monotonic time
        while not self._stop_claiming.is_set():
            free = self._room()
            if free <= 0 or self._hold_claim(free):
                self._slot_free.clear()
                free = self._room()
                if free <= 0 or self._hold_claim(free):
                    await self._slot_free.wait()  # set by every job end (_pump) and stop
                continue
            await self._reports_first()  # after an outage: this worker's outcomes go first
            if self._stop_claiming.is_set():  # asked while it waited: no claim after a stop
                continue
            # Cleared before the round's claims are sent, never on the way into the wait: a
            # wake-up set while a claim is in flight (a retry's fail answered after a claim the
            # server ran first, which saw nothing due) must end the wait, not be wiped by it.
            self._wake.clear()
            full = False
            claimed = 0
            sleep_s = _MAX_IDLE_SLEEP_S
            order = self.queues[rr:] + self.queues[:rr]
            now_s = time.monotonic()
            if len(order) > 1:
                order = [q for q in order if skips.get(q.name, 0.0) <= now_s]
                if not order:
                    await self._idle_wait(max(min(skips.values()) - now_s, 0.001))
                    continue
            failed = 0
            if drained := self._drain_for:  # its queue alone, even while skipped (alone.py)
                order = [q for q in self.queues if q.name == drained[0]] or order
            for q in order:
                turn = owed if owed and q is self.queues[rr] else s.batch_size
                limit = min(free, turn)
                resent = q.name in self._nonce  # the answer to its first send was lost
                nonce, t_sent = self._nonce.get(q.name) or (codec.new_nonce(), time.monotonic())
                self._nonce[q.name] = (nonce, t_sent)
                self._due_again.discard(q.name)
                drained_for = drained[1] if drained and drained[0] == q.name else None
                call = q.aq.claim(self.id, limit=limit, lease_ms=s.lease_ms,
                                  reap_limit=s.reap_limit, nonce=nonce, holding=self._holding(),
                                  drained_for=drained_for)  # fmt: skip
                try:
                    batch = await self._claim_call(call)
                except Exception as exc:
                    # The nonce stays: a call whose answer was lost is replayed, not claimed
                    # twice. Several queues: this one (its cluster node down, say) sits out a
                    # delay of its own, growing to _SKIP_MAX_S while it keeps failing, and the
                    # round goes on; the next starts after it. (Aborting the round left rr on
                    # it: it failed first every round and no queue was claimed from.)
                    self._loop_error("claim", exc)
                    self._note_claim(q.name, exc)
                    failed += 1
                    if drained_for:  # a drain whose claims fail is given up: the rest go on
                        self._drain_for = None
                    due_at.pop(q.name, None)
                    if len(self.queues) > 1:
                        delay_s = failing.setdefault(q.name, RetryDelay(cap_s=_SKIP_MAX_S))()
                        skips[q.name] = time.monotonic() + delay_s
                        rr, owed = (self.queues.index(q) + 1) % len(self.queues), 0
                    continue
                del self._nonce[q.name]  # answered: the next call gets a fresh nonce
                self._note_claim(q.name, None)
                failing.pop(q.name, None)
                # Answered over a heartbeat interval late (a server stall): run any time since
                # t_sent, its leases are learnt by a heartbeat now, as a re-sent claim's are.
                unsure = resent or time.monotonic() - t_sent > s.heartbeat_ms / 1000
                self._take(q.name, batch, t_sent, unsure)
                if unsure and batch.jobs:
                    # Their lease may be nearly over (it counts from the first send): a
                    # heartbeat now tells, and starts their local lease end (beat_sent).
                    self._beat_now.set()
                n = len(batch.jobs)
                claimed += n
                free -= n
                # A replay answers the first call's now_ms and next_ms, from before the gap:
                # no plan from it; the next round claims afresh.
                full = full or n == limit or resent
                # The next round starts at this queue while its turn is unfinished (the
                # slots ran out, not its jobs), else at the next one. One queue: no turns.
                rr = self.queues.index(q)
                owed = turn - n if n == limit < turn and len(order) > 1 else 0
                rr = rr if owed else (rr + 1) % len(self.queues)
                if batch.next_ms >= 0:
                    sleep_s = min(sleep_s, (batch.next_ms - batch.now_ms) / 1000)
                    due_at[q.name] = now_s + (batch.next_ms - batch.now_ms) / 1000
                else:
                    due_at.pop(q.name, None)
                # No skip when a retry of this queue was answered while the claim was out.
                if n == 0 and len(self.queues) > 1 and q.name not in self._due_again:
                    wait_s = _SKIP_MAX_S
                    if batch.next_ms >= 0:
                        wait_s = min(wait_s, (batch.next_ms - batch.now_ms) / 1000)
                    skips[q.name] = now_s + wait_s
                else:
                    skips.pop(q.name, None)
                if free <= 0 or self._claims_closed():
                    break
            if failed == len(order):  # every queue of the round failed (or the only one)
                if len(order) < len(self.queues):
                    # Others sat this round out (empty): an enqueue's wake-up ends the wait.
                    await self._idle_wait(backoff())
                else:
                    await self._sleep_or_stop(backoff())
                continue
            backoff.reset()
            # A queue that sat this round out is due again at its own next_ms (no wake-up
            # comes for a job already enqueued): the round's sleep ends by then too.
            if len(order) < len(self.queues):
                sent = {q.name for q in order}
                for name, at in due_at.items():
                    if name not in sent:
                        sleep_s = min(sleep_s, max(at - time.monotonic(), 0.001))
            if failing:  # no wake-up ends a failing queue's skip: sleep no longer than it
                until_s = min(skips.get(n, 0.0) for n in failing)
                sleep_s = min(sleep_s, max(until_s - time.monotonic(), 0.001))
            if full or (s.burst and not (claimed or failed) and self._burst_next(
                    len(order) == len(self.queues))):  # fmt: skip
                continue
            if sleep_s <= 0 and claimed:
                continue
            sleep_s = max(sleep_s, 0.001)  # something due but not claimable: do not spin
            await self._idle_wait(sleep_s)

    def _take(self, queue: str, batch: ClaimBatch, t_sent: float, resent: bool = False) -> None:
        # One clock read and one log-level check per batch: its jobs start in this call, which
        # decodes at most STEP_CHARS of their payloads (the rest off the loop: payload_decode).
        now_s = time.monotonic()
        log = self.log.isEnabledFor(logging.INFO)
        self._decode_left = STEP_CHARS
        if batch.suspect is not None:
            if any(u[0] == batch.suspect for u in batch.unreadable):
                self._due_soon(queue)  # failed below, never started: that is its end
            else:
                self._suspects.add((queue, batch.suspect))
        for job in batch.jobs:
            self._start(queue, job, batch.now_ms, t_sent, now_s, log, resent)
        self._note_alone(queue, batch, now_s)  # with its jobs held
        # Jobs in the reply the client could not read (id, token, reason): failed
        # non-retryably so the server parks them, alone.
        for job_id, token, reason in batch.unreadable:
            self._fail_unreadable(queue, job_id, token, reason)

    def _short_jobs(self) -> bool:
        return self._mean_run_s is not None and self._mean_run_s < PREFETCH_MAX_RUN_S

    def _one_runs_long(self) -> bool:
        """A run going on for longer than a heartbeat interval: no prefetch (the jobs would
        wait behind it, and a hung one holds its slot for good; Starting._sweep_backlog)."""
        since_s = time.monotonic() - self.settings.heartbeat_ms / 1000
        return any(r.started_s < since_s for r in self.running.values())

    def _hold_claim(self, free: int) -> bool:
        """True: wait for more free slots before claiming (CLAIM_MIN_FREE). Only while jobs
        are short and some are running or waiting to: their ends free slots within a batch's
        run time. An idle worker never holds, so a lone due job is claimed at once. Half of
        the room there is now: with a run gone long _room counts no prefetch, and a threshold
        counting it was never reached (4 slots, one hung: 3 free, 52 waited for)."""
        if not (self.running or self._backlog) or not self._short_jobs():
            return False
        s = self.settings
        if free >= max(1, min(CLAIM_MIN_FREE, (s.concurrency + s.prefetch) // 2)):
            return False
        # The runs are scanned only when the two thresholds disagree.
        return free < max(1, min(CLAIM_MIN_FREE, s.concurrency // 2)) or not self._one_runs_long()

    def _room(self) -> int:
        """How many jobs the next claim may take."""
        if self._claims_closed():
            return 0
        s = self.settings
        if len(self._abandoned) >= s.abandoned_cap:
            if not self._capped:
                self._capped = True
                self.metrics.claim_paused.labels("abandoned_threads").set(1)
                # "Handlers": threads that outlived their timeout or lease, and async tasks
                # that swallowed their cancellation; both still run, both count.
                self.log.warning(
                    "not claiming: %d abandoned handlers still running (cap %d); waiting "
                    "for them to end",
                    len(self._abandoned),
                    s.abandoned_cap,
                )
            return 0
        if self._capped:
            self._capped = False
            self.metrics.claim_paused.labels("abandoned_threads").set(0)
            # At the level of the warning it ends: a log at WARNING shows both.
            self.log.warning("claiming again: abandoned handlers below the cap")
        if self._no_claim_until:  # a handler thread could not start (Starting._cannot_start)
            if time.monotonic() < self._no_claim_until:
                return 0
            self._no_claim_until = 0.0
            self.metrics.claim_paused.labels("no_thread").set(0)
        ahead = s.prefetch if self._short_jobs() and not self._one_runs_long() else 0
        held = len(self._backlog) + len(self._behind) + len(self._give_back)
        return self._quota(s.concurrency + ahead - len(self.running) - held)

    async def _idle_wait(self, sleep_s: float) -> None:
        """Sleep until the next due time (a local timer) or an enqueue's wake-up, or at once
        if one came since the round began (the waker's BLPOP is never cancelled)."""
        self._idle.set()
        try:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), sleep_s)
        finally:
            self._idle.clear()

    async def _replay_claims(self, deadline: float) -> list[Running]:
        """Shutdown: the jobs of each claim whose answer was lost (its nonce pending), released
        with the rest rather than left to lapse. The nonce is re-sent with limit 0: a replay
        names the first call's jobs; a call that never reached Redis leases nothing now."""
        out: list[Running] = []
        for qn, (nonce, t_sent) in list(self._nonce.items()):
            batch = await self._replay(self._by_name[qn], nonce, deadline)
            if batch is None:
                continue
            del self._nonce[qn]
            lease_end = t_sent - _LEASE_MARGIN_S + self.settings.lease_ms / 1000
            for job in batch.jobs:
                ctx = JobContext(job.id, job.task, qn, job.attempts, job.max_attempts,
                                 job.token, job.fence, job.run_at_ms, job.claimed_ms)  # fmt: skip
                r = Running(qn, job, ctx, None, time.monotonic(), lease_end, finished=True)
                out.append(r)
            for job_id, token, reason in batch.unreadable:
                self._fail_unreadable(qn, job_id, token, reason)
        return out

    async def _replay(self, q: _Queue, nonce: str, deadline: float) -> ClaimBatch | None:
        backoff = RetryDelay()
        while True:
            call = q.aq.claim(self.id, limit=0, lease_ms=self.settings.lease_ms, reap_limit=0,
                              nonce=nonce)  # fmt: skip
            try:
                batch: ClaimBatch = await _within(call, deadline - time.monotonic())
                return batch
            except Exception as exc:
                if (
                    isinstance(exc, _Deadline)
                    or not retry_at_stop(exc)  # a refusal until a fix: no stop sees one
                    or (time.monotonic() + backoff.next_s >= deadline)
                ):
                    self.log.warning("unanswered claim of %s not re-sent (%s); any job it "
                                     "leased waits out its lease", q.name, repr(exc))  # fmt: skip
                    return None
                self._redis_error("claim", exc)
            await asyncio.sleep(backoff())

    async def _sleep_or_stop(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_claiming.wait(), delay_s)
