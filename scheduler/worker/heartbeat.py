"""Heartbeats (one call per interval extends every lease held; a lease whose heartbeats
failed is stopped before the server can hand the job on) and presence (worker_beat)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.core import queue_index
from scheduler.core.connection import is_cluster
from scheduler.operations.ops import Request, Script
from scheduler.worker import fork_guard, progress_sends
from scheduler.worker.core import _Deadline, _within
from scheduler.worker.dispatch import Dispatch
from scheduler.worker.execution import Running
from scheduler.worker.failures import STILL_RUNNING, STILL_RUNNING_TEXT
from scheduler.worker.remote_stop import RemoteStop
from scheduler.worker.reporting import Reporting
from scheduler.worker.settings import _LEASE_MARGIN_S, _SETTLE_S


class Heartbeats(RemoteStop, Dispatch, Reporting):
    """The heartbeat loop (leases, queue depth metrics) and the presence beat (+ quiet/stop)."""

    async def _heartbeat_loop(self) -> None:
        # For the worker's life: a process a handler forks never runs it (fork_guard.py).
        with fork_guard.watching(asyncio.get_running_loop()):
            await self._beat_loop()

    async def _beat_loop(self) -> None:
        interval_s = self.settings.heartbeat_ms / 1000
        lease_s = self.settings.lease_ms / 1000
        next_beat_s = time.monotonic() + interval_s
        while not self._stop_heartbeat.is_set():
            # Wake for the next heartbeat or the earliest local lease end, whichever is first:
            # a lease whose heartbeats failed is stopped at its end, not at the next beat.
            wait_s = next_beat_s - time.monotonic()
            end_s = self._earliest_lease_end()
            if end_s is not None:
                wait_s = min(wait_s, end_s - time.monotonic())
            if wait_s > 0 and not self._beat_now.is_set():
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._beat_now.wait(), wait_s)
            if self._stop_heartbeat.is_set():
                return
            self._expire_leases()
            if self._beat_now.is_set():
                self._beat_now.clear()  # a re-sent claim's jobs: learn their leases now
            elif time.monotonic() < next_beat_s:
                continue
            next_beat_s = time.monotonic() + interval_s
            # Per node on a cluster, each call is bounded by its own leases' end (_send_parts).
            by_node = is_cluster(self.client) and len(self.queues) > 1
            await self._bounded("heartbeat", self._heartbeat(), lease_s, by_node=by_node)
            # A heartbeat cut at a lease end: stop that run now, not after the presence call
            # (bounded by the same, past end, that is _within's 50 ms: the whole margin).
            self._expire_leases()
            # presence: its own error handling, so a refused beat never skips the above
            # One interval at most: a node that hangs must not hold up the next heartbeat.
            await self._bounded("presence", self._beat_workers(), lease_s, interval_s)
            self._expire_leases()
            # A job held back behind its own abandoned run for a lease goes back. Released,
            # its attempt given back, while that run is within its timeout (a long job whose
            # lease lapsed in a stall: nothing failed); a failed attempt once that run has
            # overrun its timeout or has none (a handler that never returns would else cycle
            # for good, never parked), retried by its backoff, parked after its last.
            now = time.monotonic()
            out = [r for r in self._behind.values() if now - r.started_s > lease_s]
            for r in out:
                del self._behind[(r.queue, r.job.id)]
            stale = [r for r in out if not r.finished and not self._overran(r, now)]
            for r in stale:
                r.finished = True
            self._sweep_backlog(now)  # held back past a deadline or a lease: given back too
            stale += self._give_back
            self._give_back = []
            if stale:
                await self._release(stale, time.monotonic() + _SETTLE_S)
            if out or stale:  # their room is free: a claim loop waiting for a slot goes on
                self._slot_free.set()

    def _overran(self, r: Running, now: float) -> bool:
        """r waits behind a run of its job past its own timeout, or with none: r fails."""
        old = self._abandoned.get((r.queue, r.job.id))
        if old is None or (old.timeout_s is not None and now - old.started_s <= old.timeout_s):
            return False
        r.finished = True
        self._queue_fail(r, (STILL_RUNNING, STILL_RUNNING_TEXT, ""), retryable=True)
        return True

    async def _bounded(
        self,
        what: str,
        call: Coroutine[Any, Any, None],
        lease_s: float,
        most_s: float = 0.0,
        *,
        by_node: bool = False,
    ) -> None:
        """Await a call of this loop for at most the earliest lease end (with none held, the
        earliest a job claimed meanwhile can end), and at most `most_s` when given: a call that
        hangs (a stalled server, a socket timeout as long as the lease) must not keep the
        expiry check waiting. by_node: the call bounds each node's part by that node's own
        leases and expires them as they end; here only a backstop of two intervals."""
        end_s = self._earliest_lease_end()
        if by_node or end_s is None:
            end_s = time.monotonic() + (
                2 * self.settings.heartbeat_ms / 1000 if by_node else lease_s - 2 * _LEASE_MARGIN_S
            )
        if most_s:
            end_s = min(end_s, time.monotonic() + most_s)
        try:
            await _within(call, end_s - time.monotonic())
        except _Deadline:
            self.log.warning("%s: no answer before a lease ran out; retrying", what)
        except Exception as exc:
            self._loop_error(what, exc)

    def _earliest_lease_end(self) -> float | None:
        ends = [r.lease_deadline_s for r in self._held.values() if r.beat_sent and not r.finished]
        return min(ends) if ends else None

    def _expire_leases(self) -> None:
        """Stop the runs whose lease ends here (their heartbeats failed) before the server can
        hand the job to someone else."""
        now = time.monotonic()
        for r in list(self._held.values()):
            if r.beat_sent and r.lease_deadline_s <= now and not r.finished:
                self._stop(r, "expired")

    async def _heartbeat(self) -> None:
        held = list(self._held.values())
        by_queue: dict[str, list[Running]] = {q.name: [] for q in self.queues}
        # Each queue's earliest local lease end, as _earliest_lease_end: a re-sent claim's
        # runs (no beat sent yet) learn their lease from this call, so they bound nothing.
        for r in held:
            by_queue[r.queue].append(r)
        ends_s = {qn: self._end_of(rs) for qn, rs in by_queue.items()}
        parts: list[list[tuple[list[str], Any]]] = []
        carried: dict[str, progress_sends.Carried] = {}  # per queue, given back if not sent
        for qn, rs in by_queue.items():
            q = self._by_name[qn]
            part: list[tuple[list[str], Any]] = []
            if rs:
                leases = [(r.job.id, r.job.token) for r in rs]
                part.append(
                    (q.script_keys, q.ops.heartbeat(leases, lease_ms=self.settings.lease_ms))
                )
            part.append((q.script_keys, q.ops.counts()))
            if moved := progress_sends.take(rs, finished_too=False):
                part += progress_sends.calls(self._by_name, moved)
                carried[qn] = moved
            parts.append(part)
        t_sent = time.monotonic()
        # Runs whose lease this call learns (a claim answered late or re-sent) count from it only
        # once it is answered (or fails): an expiry check while it is out (_send_parts, per node)
        # stopped them at their stale end, and the server's fresh lease ran them again later.
        unsure = [r for r in held if not r.beat_sent]
        try:
            replies = await self._send_parts(parts, [ends_s[q.name] for q in self.queues])
        except BaseException:
            for moved in carried.values():
                progress_sends.give_back(moved)
            raise
        finally:
            for r in unsure:
                r.beat_sent = True  # a 'held' below sets its fresh end; else the claim's stands
        i = 0
        error: BaseException | None = None
        for qn, rs in by_queue.items():
            if rs:
                reply = replies[i]
                i += 1
                if isinstance(reply, BaseException):
                    error = reply
                else:
                    _, statuses = reply
                    for r in rs:
                        st = statuses.get(r.job.id)
                        if st == "held":
                            r.lease_deadline_s = (
                                t_sent - _LEASE_MARGIN_S + self.settings.lease_ms / 1000
                            )
                        elif st == "cancelled":
                            self._lost(r, "cancelled")
                        else:
                            self._lost(r, "stale" if st == "missing" else "expired", status=st)
            counts = replies[i]
            i += 1
            if not isinstance(counts, BaseException):
                self.metrics.set_depth(qn, counts)
            if qn in carried:  # a refusal is the heartbeat's status above, acted on there
                if isinstance(replies[i], BaseException):
                    progress_sends.give_back(carried[qn])
                i += 1
        if error is not None:
            raise error

    async def _send_parts(
        self, parts: list[list[tuple[list[str], Any]]], ends_s: list[float | None]
    ) -> list[Any]:
        """Every queue's calls in one round trip; on a cluster, one call per node (queues
        grouped by the node of their slot), so a node that does not answer fails only its own
        queues' heartbeats (its error stands in for their replies), not the leases held on the
        healthy nodes. ends_s: each part's earliest local lease end."""
        if not is_cluster(self.client) or len(parts) < 2:
            return await self._pipe.run([c for part in parts for c in part])
        groups: dict[str, list[int]] = {}
        for i, part in enumerate(parts):
            groups.setdefault(self._node_of(part[0][0][0]), []).append(i)
        calls = [[c for i in idx for c in parts[i]] for idx in groups.values()]
        # Each node gets one interval, and ends before its own leases do: not before the
        # earliest lease of all, which a failing node's (never extended) holds; a healthy
        # but slow node's answers were cut there and its leases lapsed too (CI, loaded).
        now_s = time.monotonic()
        until_s = []
        for idx in groups.values():
            end_s = now_s + self.settings.heartbeat_ms / 1000
            for e in (ends_s[i] for i in idx):
                if e is not None:
                    end_s = min(end_s, e - _LEASE_MARGIN_S)
            until_s.append(max(end_s, now_s + 0.001))
        tasks = [asyncio.ensure_future(self._pipe.run(c)) for c in calls]
        waiting = set(tasks)
        try:
            while waiting:
                now_s = time.monotonic()
                for t, u in zip(tasks, until_s, strict=True):
                    if t in waiting and u <= now_s:
                        waiting.discard(t)  # late: its leases end as they would have
                if not waiting:
                    break
                soonest_s = min(u for t, u in zip(tasks, until_s, strict=True) if t in waiting)
                _, waiting = await asyncio.wait(waiting, timeout=soonest_s - now_s)
                self._expire_leases()  # a late node's leases end on time meanwhile
        finally:
            for t in tasks:
                t.cancel()  # a no-op on those that ended
        late = RedisTimeoutError("no answer from the node within a heartbeat interval")
        got = [
            (t.exception() or t.result()) if t.done() and not t.cancelled() else late for t in tasks
        ]
        by_part: list[list[Any]] = [[] for _ in parts]
        for idx, res in zip(groups.values(), got, strict=True):
            pos = 0
            for i in idx:
                n = len(parts[i])
                by_part[i] = [res] * n if isinstance(res, BaseException) else res[pos : pos + n]
                pos += n
        return [x for replies in by_part for x in replies]

    @staticmethod
    def _end_of(rs: list[Running]) -> float | None:
        ends = [r.lease_deadline_s for r in rs if r.beat_sent and not r.finished]
        return min(ends) if ends else None

    def _lost(self, r: Running, reason: str, status: str | None = None) -> None:
        if r.finished:  # finished, outcome not yet acked: the report will be refused
            self._forget(r)
            return
        self._stop(r, reason, status)

    async def _beat_workers(self, *, remove: bool = False) -> None:
        ttl = 3 * self.settings.heartbeat_ms
        reqs: list[tuple[Sequence[str], Request]] = [
            (
                q.script_keys,
                Script(
                    "worker_beat",
                    [
                        self.id,
                        str(ttl),
                        "remove" if remove else "beat",
                        socket.gethostname(),
                        str(os.getpid()),
                        ",".join(self.settings.queues),
                        str(len(self.running)),
                        str(self.settings.concurrency),
                        self._asked,
                    ],
                ),
            )
            for q in self.queues
        ]
        # Per node on a cluster (Reporting._run_by_node): a node that is down must not keep
        # this worker's entry on the healthy ones from being refreshed (it expires).
        replies = await self._run_by_node(reqs, self._pipe.requests)
        # A request read was deleted: acted on even when another node's beat failed.
        if errors := self._stop_asked(replies):
            raise errors[0]
        if not remove:  # once per process (the index lists queues without a SCAN)
            await queue_index.add_async(self.client, self.settings.queues)
