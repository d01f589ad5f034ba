"""Reporting outcomes (complete / fail, coalesced per round trip), flushing them at shutdown
(also those of a call still in flight), and giving jobs back (release)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.core.errors import JobCancelled, JobNotFound, LeaseExpired, LeaseRefused
from scheduler.core.models import FailOutcome
from scheduler.core.safety import redact
from scheduler.worker import progress_sends
from scheduler.worker.core import WorkerCore, _Deadline, _Fatal, _within
from scheduler.worker.execution import RetryDelay, Running, classify, may_resend, retry_at_stop
from scheduler.worker.newer_outcomes import give_up_refused
from scheduler.worker.settings import EXIT_REDIS_REFUSED

_REPORTS_FIRST_S = 1.0
# A report's round trip takes a few ms: one outstanding for longer is answered late (a stall: a
# CLIENT PAUSE of a failover, a slow command) and may outlast the leases it settles.
_REPORT_LATE_S = 0.05


def _word(status: str) -> str:
    """The glossary word of a refused report (docs/glossary.md): the job was cancelled, its
    lease ran out, or another claim holds it (stale; also a job gone: 'missing')."""
    return status if status in ("cancelled", "expired") else "stale"


def _status_of(refusal: LeaseRefused | JobNotFound) -> str:
    """The status behind fail's refusal (codec.parse_fail raises it as an exception)."""
    if isinstance(refusal, JobCancelled):
        return "cancelled"
    if isinstance(refusal, LeaseExpired):
        return "expired"
    return "missing" if isinstance(refusal, JobNotFound) else "stale"


class Reporting(WorkerCore):
    """The reporter loop, the shutdown flush, and release."""

    async def _reporter_loop(self) -> None:
        """Completes coalesce while a call is in flight: one complete_many per queue per round
        trip, failures pipelined next to them."""
        backoff = RetryDelay()
        while not self._stop_reporter.is_set():
            await self._report.wait()
            self._report.clear()
            while (self._completes or self._fails) and not self._stop_reporter.is_set():
                try:
                    await self._send_reports()
                    backoff.reset()
                    self._report_failing = False
                except Exception as exc:
                    self._loop_error("report", exc)
                    self._report_failing = True
                    self._report_tried.set()
                    self._report_retry.clear()
                    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                        await asyncio.wait_for(self._report_retry.wait(), backoff())
                self._report_tried.set()

    _report_sent_s = 0.0  # when the reporter's call in flight was sent (monotonic)

    async def _reports_first(self) -> None:
        """Outcomes go before the next claim, which would reap their leases once lapsed (not on
        a cluster: one node must not slow the others); a stalled server runs what it held in
        arrival order. The claim waits for the reporter's round once answered late (its socket
        timeout bounds it, then the failing case; a stop ends it), for a failing reporter's
        next try (at most _REPORTS_FIRST_S: also of a call in flight, a NOSCRIPT reload is
        long), or one loop turn when a job's end woke both: the reporter writes first."""
        if self._claim_wait_s is not None:
            return
        late = time.monotonic() - self._report_sent_s > _REPORT_LATE_S
        if any(self._sending) and late and not self._report_failing:
            self._report_tried.clear()
            await self._report_tried.wait()  # set at each round's end and by a stop
        queued, stop = self._completes or self._fails, self._stop_claiming.is_set()
        if self._report_failing and (queued or any(self._sending)) and not stop:
            self._report_tried.clear()
            self._report_retry.set()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._report_tried.wait(), _REPORTS_FIRST_S)
        elif queued and not any(self._sending):
            await asyncio.sleep(0)

    async def _send_reports(self) -> None:
        completes, self._completes = self._completes, []
        fails, self._fails = self._fails, []
        gen = self._report_gen
        self._sending, self._report_sent_s = (completes, fails), time.monotonic()
        # One complete_many per (queue, retention): the TTL is one argument per call.
        by_queue: dict[tuple[str, int], list[tuple[Running, Any]]] = {}
        for r, result in completes:
            by_queue.setdefault((r.queue, self._ttl_for(r)), []).append((r, result))
        # First the progress set since the last heartbeat: the leases are still held.
        runs = [r for r, _ in completes] + [r for r, _, _ in fails]
        carried, calls = progress_sends.ahead(self._by_name, runs)
        skip = len(calls)
        try:
            for (qn, ttl_ms), items in by_queue.items():
                q = self._by_name[qn]
                leases = [(r.job.id, r.job.token, res) for r, res in items]
                calls.append((q.script_keys, q.ops_for(ttl_ms).complete_many(leases)))
            for r, err, ok in fails:
                q, job = self._by_name[r.queue], r.job
                fail = q.ops.fail(job.id, job.token, err, retryable=ok, delay_ms=r.retry_delay_ms)
                calls.append((q.script_keys, fail))
            replies = await self._run_by_node(calls)
        except BaseException:
            # Not sent (or unknown): try again; complete and fail are idempotent per token.
            progress_sends.give_back(carried)
            if gen == self._report_gen:
                self._sending = ([], [])
                self._completes[:0] = completes
                self._fails[:0] = fails
            raise
        if gen != self._report_gen:
            return  # shutdown took these over and sent them again
        self._sending = ([], [])
        retry: BaseException | None = None
        for items, statuses in zip(by_queue.values(), replies[skip:], strict=False):
            retry = self._completed(items, statuses) or retry
        for (r, err, ok), out in zip(fails, replies[skip + len(by_queue) :], strict=True):
            retry = self._failed(r, err, ok, out) or retry
        if retry is not None:
            raise retry  # the loop backs off, then sends what was put back

    async def _run_by_node(
        self,
        calls: Sequence[tuple[Sequence[str], Any]],
        send: Callable[[Any], Awaitable[list[Any]]] | None = None,
    ) -> list[Any]:
        """Report (or release) calls in one round trip; on a cluster worker of several queues,
        one call per node, all at once: a node that fails or does not answer within the claims'
        wait gives its error as the reply of each of its calls (they are sent again: complete,
        fail and release are idempotent per token), and the healthy nodes' replies stand. Also
        when all go to one node: a hanging one held the reporter for the socket timeout (30 s)
        and the other nodes' outcomes behind it, past their leases.
        send: how the calls go (default: Pipeline.run of operations)."""
        run: Callable[[Any], Awaitable[list[Any]]] = send or self._pipe.run
        if self._claim_wait_s is None or not calls:
            return await run(calls)
        groups: dict[str, list[int]] = {}
        for i, (keys, _) in enumerate(calls):
            groups.setdefault(self._node_of(keys[0]), []).append(i)
        sent = [run([calls[i] for i in idx]) for idx in groups.values()]
        tasks = [asyncio.ensure_future(c) for c in sent]
        try:
            done, _ = await asyncio.wait(tasks, timeout=self._claim_wait_s)
        finally:
            for t in tasks:
                t.cancel()  # a no-op on those that ended
        late = RedisTimeoutError("no answer from the node in time")
        replies: list[Any] = [late] * len(calls)
        for idx, t in zip(groups.values(), tasks, strict=True):
            got = (t.exception() or t.result()) if t in done else late
            for pos, i in enumerate(idx):
                replies[i] = got if isinstance(got, BaseException) else got[pos]
        return replies

    def _reply_error(self, what: str, exc: BaseException) -> bool:
        """True when the call is to be sent again (transient); raises _Fatal when fatal."""
        kind = classify(exc)
        if kind == "fatal":
            raise _Fatal(EXIT_REDIS_REFUSED, f"redis refused {what}: {type(exc).__name__}: {exc}")
        return kind == "transient"

    def _completed(self, items: list[tuple[Running, Any]], statuses: Any) -> BaseException | None:
        if isinstance(statuses, BaseException):
            if give_up_refused(self, [r for r, _ in items], statuses, "complete"):
                return None  # at the stop: refused until a fix or an upgrade
            if may_resend(statuses) and self._reply_error("complete", statuses):
                self._completes[:0] = items
                return statuses
            self._log_limit.error(self.log, "complete refused: %s", statuses)
            for r, _ in items:
                self._forget(r)
            return None
        log_info = self.log.isEnabledFor(logging.INFO) or bool(self.registry.outcome_hooks)
        for (r, _), st in zip(items, statuses, strict=True):
            self._forget(r)
            if st == "done":
                (r.stats or self.metrics.per_task(r.queue, r.job.task)).done += 1
                if log_info:
                    self._log_job("done", r)
            else:
                self._refused(r, "complete", st)
        return None

    def _refused(self, r: Running, call: str, status: str) -> None:
        """r's complete / fail / release refused: counted, logged under its word, `refused=call`."""
        self._forget(r)
        word = _word(status)
        self.metrics.outcome(r.queue, r.job.task, word)
        self._log_job(word, r, level=logging.WARNING, refused=call, status=status)

    def _failed(
        self, r: Running, err: tuple[str, str, str], retryable: bool, out: Any
    ) -> BaseException | None:
        if isinstance(out, FailOutcome):
            self._forget(r)
            self.metrics.outcome(r.queue, r.job.task, out.status)
            # Redacted before the cut: a cut inside a URL's password left no '@' to find it by.
            extra: dict[str, Any] = {"error_type": err[0], "error": redact(err[1][:800])[:200]}
            if out.status == "retry":
                extra["retry_at_ms"] = out.run_at_ms
                self._due_soon(r.queue)  # fail.lua pushes no wake-up
            else:
                extra["reason"] = out.dead_reason
            self._log_job(out.status, r, level=logging.WARNING, **extra)
        elif isinstance(out, LeaseRefused | JobNotFound):
            self._refused(r, "fail", _status_of(out))
        elif isinstance(out, BaseException) and give_up_refused(self, [r], out, "fail"):
            return None
        elif isinstance(out, BaseException) and may_resend(out) and self._reply_error("fail", out):
            self._fails.insert(0, (r, err, retryable))
            return out
        else:
            self._forget(r)
            self._log_limit.error(self.log, "fail of job %s errored: %s", r.job.id, out)
        return None

    async def _release(self, rs: Sequence[Running], deadline: float) -> None:
        """Each queue's release sent until answered, or the deadline while it fails transiently;
        one refused until a fix or an upgrade is given up at once (retry_at_stop): leases lapse."""
        by_queue: dict[str, list[Running]] = {}
        for r in rs:
            by_queue.setdefault(r.queue, []).append(r)
        backoff = RetryDelay()
        got: dict[str, Any] = {}
        left = list(by_queue)
        while left:
            qs = [self._by_name[qn] for qn in left]
            leases = [[(r.job.id, r.job.token) for r in by_queue[qn]] for qn in left]
            items = [(q.script_keys, q.ops.release(ls)) for q, ls in zip(qs, leases, strict=True)]
            runs = [r for qn in left for r in by_queue[qn]]  # their unsent progress goes first
            try:
                sent = progress_sends.sent_ahead(self._by_name, runs, items, self._run_by_node)
                replies = await _within(sent, deadline - time.monotonic())
            except Exception as exc:
                replies = [exc] * len(items)  # no answer (_Deadline too): none was released
            got.update(zip(left, replies, strict=True))
            left = [qn for qn in left if isinstance(got[qn], Exception) and retry_at_stop(got[qn])]
            if not left or time.monotonic() >= deadline:
                break
            self._redis_error("release", got[left[0]])  # a re-sent release answers 'released'
            await asyncio.sleep(min(backoff(), max(deadline - time.monotonic(), 0)))
        for qn, g in by_queue.items():
            self._released(g, got[qn])

    def _released(self, rs: list[Running], reply: Any) -> None:
        """Each job by what the server answered; a call that failed released none of them."""
        if isinstance(reply, BaseException):
            for r in rs:
                self._forget(r)
            why = f"{type(reply).__name__}: {reply}"  # redis-py's repr drops the message
            why = "no answer in time" if isinstance(reply, _Deadline) else why
            self.log.warning("release of %d jobs of %s failed (%s); their leases lapse on their "
                             "own", len(rs), rs[0].queue, why)  # fmt: skip
            return
        for r, st in zip(rs, reply, strict=True):
            if st != "released":
                self._refused(r, "release", st)
                continue
            self._forget(r)
            self.metrics.outcome(r.queue, r.job.task, "released")
            self._log_job("released", r)

    async def _flush(self, deadline: float) -> None:
        backoff = RetryDelay(cap_s=0.5)
        while (self._completes or self._fails) and time.monotonic() < deadline:
            try:
                await _within(self._send_reports(), deadline - time.monotonic())
            except _Deadline:
                self._restore_sending()
                return
            except _Fatal as exc:
                self._fatal(exc.code, str(exc))
                return
            except Exception as exc:
                if classify(exc) != "transient":
                    self._fatal(EXIT_REDIS_REFUSED, f"flush refused: {type(exc).__name__}: {exc}")
                    return
                self._redis_error("report", exc)
                await asyncio.sleep(min(backoff(), max(deadline - time.monotonic(), 0)))

    def _restore_sending(self) -> None:
        """The reports of a call given up on go back to be sent again; the new generation
        keeps that call, if it still ends, from putting them back a second time."""
        self._report_gen += 1
        (sent_c, sent_f), self._sending = self._sending, ([], [])
        self._completes[:0] = sent_c
        self._fails[:0] = sent_f
